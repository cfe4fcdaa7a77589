"""What the kernel says about a loaded ltp_xdp program: the ids and sizes of
its pinned objects, and the XDP program a device carries now.

The pinned maps' sizes tell slots, chunks, chunk size and banks, so
`geometry_from_pins` rebuilds the geometry a program was compiled with even
when its record is gone.
"""
from __future__ import annotations

import contextlib
import os
import struct
from typing import Any, Iterator

from .. import clib, netns
from ...errors import RegistryError
from .loader import open_pinned
from .maps import MAP_NAMES, Geometry
from .wire import PORT

# pyroute2's names for IFLA_XDP_ATTACHED, and our mode names
_XDP_ATTACHED = {"xdp": "native", "xdpgeneric": "skb", "xdpoffload": "hw", "xdpmulti": "multi",
                 1: "native", 2: "skb", 3: "hw", 4: "multi"}


def _info(fd: int) -> bytes:
    try:
        return clib.obj_info(fd)
    except OSError as e:
        raise RegistryError(f"reading BPF object info: {e.strerror}") from e


def prog_id(fd: int) -> int:
    """Kernel id of the program `fd` (struct bpf_prog_info.id)."""
    return struct.unpack_from("<II", _info(fd))[1]


def map_info(fd: int) -> dict[str, int]:
    """type, id, key_size, value_size, max_entries, flags of the map `fd`."""
    keys = ("type", "id", "key_size", "value_size", "max_entries", "flags")
    return dict(zip(keys, struct.unpack_from("<6I", _info(fd))))


@contextlib.contextmanager
def _pinned(path: str) -> Iterator[int]:
    fd = open_pinned(path)
    try:
        yield fd
    finally:
        os.close(fd)


def pinned_prog_id(directory: str) -> int | None:
    try:
        with _pinned(os.path.join(directory, "prog")) as fd:
            return prog_id(fd)
    except (FileNotFoundError, RegistryError):
        return None


def pinned_maps(directory: str) -> list[str]:
    """Names in MAP_NAMES that are pinned in `directory`."""
    return [n for n in MAP_NAMES if os.path.exists(os.path.join(directory, n))]


def geometry_from_pins(directory: str, port: int = PORT) -> Geometry:
    """The geometry the pinned maps were compiled with (the port is not in any
    map size, so it comes from the caller)."""
    try:
        with _pinned(os.path.join(directory, "ltp_stats")) as fd:
            slots = map_info(fd)["max_entries"]
        with _pinned(os.path.join(directory, "ltp_banks")) as fd:
            banks = map_info(fd)["max_entries"]
        with _pinned(os.path.join(directory, "ltp_mem")) as fd:
            mem = map_info(fd)
    except FileNotFoundError as e:
        raise RegistryError(f"{directory}: maps are not pinned ({e.strerror}); "
                            "`ltp status` shows what is loaded") from None
    return Geometry(slots=slots, max_chunks=mem["max_entries"] // (banks * slots),
                    chunk_bytes=mem["value_size"], banks=banks, port=port)


def xdp_on(dev: str, ns: str | None) -> dict[str, Any] | None:
    """{"prog_id", "mode"} of the XDP program on `dev` in `ns`, None if there
    is none. Raises RegistryError when the namespace or device is missing."""
    from pyroute2 import IPRoute
    if ns and not netns.exists(ns):
        raise RegistryError(f"no network namespace {ns!r} (`ip netns list` shows them)")
    with netns.inside(ns):
        ipr = IPRoute()
    try:
        idx = ipr.link_lookup(ifname=dev)
        if not idx:
            raise RegistryError(f"no device {dev!r} in "
                                f"{'the host namespace' if not ns else 'namespace ' + ns} (`"
                                + (f"ip netns exec {ns} " if ns else "")
                                + "ip -br link` lists them)")
        link = ipr.get_links(idx[0])[0]
    finally:
        ipr.close()
    xdp = link.get_attr("IFLA_XDP")
    if not xdp:
        return None
    pid = xdp.get_attr("IFLA_XDP_PROG_ID")
    if not pid:
        return None
    return {"prog_id": int(pid), "mode": _XDP_ATTACHED.get(xdp.get_attr("IFLA_XDP_ATTACHED"),
                                                           "?")}
