# SPDX-License-Identifier: Apache-2.0
"""The rigs' BPF plumbing: compile a tc program (xdp.loader), pin programs
and maps, open pins, read and write map elements (dataplane.clib), put
XDP_PASS on ports. Every failure here is a RigError whose message names the
call, the path and what to try, so the rigs need no error handling of their
own for it."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

from .. import clib
from ...errors import DataplaneError, RigError
from ..xdp.loader import compile_program
from ..xdp.loader import attach_pass

PIN_HINT = "is bpffs mounted on /sys/fs/bpf? `ltp doctor --fix`"


@contextlib.contextmanager
def rig_errors(hint: str = "") -> Iterator[None]:
    """Raise an OSError of the body (dataplane.clib's message names the call
    and the path) or a DataplaneError (compiling, attaching) as a RigError,
    with `hint` in parentheses."""
    try:
        yield
    except OSError as e:
        raise RigError(f"{e.strerror or e}" + (f" ({hint})" if hint else "")) from e
    except DataplaneError as e:
        raise RigError(str(e) + (f" ({hint})" if hint else "")) from e


def compile_tc(source: str, func: str):
    """Compile bpf/<source> with bcc and load `func` as a SCHED_CLS (tc)
    program: (bpf, fn). The caller loads further functions from `bpf` and
    must call bpf.cleanup() once tc and pins hold what it needs."""
    with rig_errors():
        return compile_program(source, func, prog_type="SCHED_CLS")


def pin_all(directory: str, objects: dict[str, int]) -> None:
    """Pin each fd of `objects` (name -> fd) as <directory>/<name>, so the
    rig's programs and maps outlive this process and others can open them."""
    os.makedirs(directory, exist_ok=True)
    for name, fd in objects.items():
        with rig_errors(PIN_HINT):
            clib.obj_pin(fd, os.path.join(directory, name))


def open_pinned(path: str, hint: str) -> int:
    """fd of the pinned map or program at `path` (the caller closes it)."""
    with rig_errors(hint):
        return clib.obj_get(path)


def lookup(fd: int, key, value) -> None:
    """Read the element at `key` (a ctypes value or a u32) into `value`."""
    with rig_errors():
        clib.map_lookup(fd, key, value)


def update(fd: int, key, value) -> None:
    with rig_errors():
        clib.map_update(fd, key, value)


def items(fd: int, key_type, value_type) -> list:
    """Every (key, value) of a hash map, as ctypes copies."""
    return clib.map_items(fd, key_type, value_type)


def clear(fd: int, key_type, value_type) -> None:
    """Delete every element of a hash map (one that goes meanwhile is no error)."""
    for key, _ in clib.map_items(fd, key_type, value_type):
        with contextlib.suppress(OSError):
            clib.map_delete(fd, key)


def xdp_pass(ports: Iterable[tuple[str, str]]) -> None:
    """An XDP_PASS program in native mode on each (device, namespace): a
    veth delivers a native-mode XDP_TX of its peer only when it has an XDP
    program of its own."""
    for dev, ns in ports:
        try:
            attach_pass(dev, ns, "native")
        except DataplaneError as e:
            raise RigError(f"XDP_PASS on {dev}: {e}") from e
