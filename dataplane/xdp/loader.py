# SPDX-License-Identifier: Apache-2.0
"""Compile, attach, detach and pin the LTP XDP program (and its helpers).

Compiling goes through the compile cache (bpfcache): a program is compiled
once per machine and source, and every later process only loads it.

`Dataplane` owns one compiled ltp_xdp program and its maps; geometry (slots,
chunks, chunk size, banks, port) is compiled in as -D defines. Attaching works
in native or skb mode on a device inside a named network namespace, through a
BPF link this process holds: program, attachment and maps die with the
process unless something pins them (only `ltp load` does, by choice).
Helpers (XDP_PASS on rig ports, test pairs) attach over netlink and outlive
their process. Nothing here replaces a program a device carries unless told
to (`force`/`replace`): it refuses, naming the program's id and name.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import socket
from pathlib import Path
from typing import Any

from ... import BPF_DIR
from .. import clib, netns
from . import bpfcache, lookup
from .maps import MAP_NAMES, Geometry, LtpMaps
from .records import where
from ...errors import DataplaneError

XDP_FLAGS_UPDATE_IF_NOEXIST = 1 << 0
XDP_FLAGS_SKB_MODE = 1 << 1
XDP_FLAGS_DRV_MODE = 1 << 2
MODES = {"native": XDP_FLAGS_DRV_MODE, "skb": XDP_FLAGS_SKB_MODE}

NATIVE_MTU = 3500   # about the largest MTU whose frame fits the one page native XDP takes
DRIVER_MTU = 3000   # ... where some drivers stop taking native XDP frames


def native_mtu_problem(dev: str, mtu: int) -> tuple[str, str] | None:
    """(what is wrong, what to do) where `dev`'s MTU is over the one page a
    native XDP frame must fit (the program takes no fragments); else None.
    A failed attach's error and `ltp doctor --dev` both say it."""
    if mtu <= NATIVE_MTU:
        return None
    return (f"{dev}'s MTU is {mtu}: native XDP takes frames of one page, an MTU of about "
            f"{DRIVER_MTU}-{NATIVE_MTU} at most by driver ({NATIVE_MTU} on veth)",
            f"lower it, e.g. `ip link set {dev} mtu {NATIVE_MTU}` with LTP_MTU={NATIVE_MTU} on "
            "every rank, or attach in generic mode, LTP_XDP_MODE=skb (slower)")


def native_hint(dev: str, ns: str | None) -> str:
    """What a failed native attach's error adds: where `dev`'s MTU is over
    the one page a frame must fit, that and the two ways out; else the way
    out for a driver without native XDP."""
    mtu = lookup.mtu(dev, ns)
    problem = native_mtu_problem(dev, mtu) if mtu is not None else None
    if problem:
        return f" ({problem[0]}: {problem[1]})"
    if mtu is not None and mtu > DRIVER_MTU:
        return (f" ({dev}'s MTU is {mtu}: some drivers take native XDP frames only up to an "
                f"MTU of about {DRIVER_MTU}; lower it with LTP_MTU to match, or LTP_XDP_MODE=skb)")
    return " (a driver without native XDP refuses it: LTP_XDP_MODE=skb attaches in generic mode)"


def _bcc():
    try:
        import bcc  # noqa: PLC0415 - Debian's python3-bpfcc: absent, it is this error
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise DataplaneError("bcc is not importable: install Debian's python3-bpfcc and use a "
                             "venv made with --system-site-packages (see `ltp doctor`)") from e
    return bcc


def compile_program(source: str, func: str, cflags: list[str] | None = None,
                    prog_type: str = "XDP", bpf_dir: Path = BPF_DIR):
    """<bpf_dir>/<source> (bpf/ unless told) compiled (by bcc, or taken from
    the compile cache: dataplane.xdp.bpfcache) with `func` loaded as a
    program of `prog_type` (a bcc.BPF attribute: "XDP", "SCHED_CLS", ...).
    bcc is given the source with the program's own headers written in
    (bpfcache.program_text), so map calls in those headers are rewritten too.

    Returns (bpf, function): bpf answers obj[b"table"] (get_fd, Key, Leaf),
    load_func and cleanup() as a bcc.BPF does."""
    bcc = _bcc()
    if os.geteuid() != 0:
        raise DataplaneError("loading BPF programs needs root: run with sudo")
    path = Path(bpf_dir) / source
    flags = list(cflags or [f"-I{bpf_dir}", "-Wno-ignored-attributes"])
    try:
        return bpfcache.obtain(path, flags, func, getattr(bcc.BPF, prog_type),
                               lambda: bcc.BPF(text=bpfcache.program_text(path, flags),
                                               cflags=flags))
    except DataplaneError:
        raise
    except Exception as e:
        hint = ""
        if not os.path.exists(f"/lib/modules/{os.uname().release}/build"):
            hint = " (kernel headers missing: run `ltp doctor --fix`)"
        raise DataplaneError(f"compiling {path.name} failed: {e}{hint}") from e


def _ifindex(dev: str, ns: str | None) -> int:
    """ifindex of `dev` in this thread's namespace (/sys/class/net shows the
    namespace sysfs was mounted in, so ask the kernel by name)."""
    try:
        return socket.if_nametoindex(dev)
    except OSError:
        raise DataplaneError(f"no device {dev!r} in namespace {ns or '(host)'}") from None


def _taken(dev: str, ns: str | None, fix: str) -> DataplaneError:
    """The refusal to replace what `dev` carries: its id, name and the fix."""
    att = lookup.xdp_on(dev, ns)
    what = lookup.describe(att) if att else "an XDP program"
    return DataplaneError(f"{where(dev, ns)} carries {what} already; not replacing "
                          f"it (xdp-loader's rule): {fix}")


def attach_fd(fd: int, dev: str, ns: str | None = None, mode: str = "native",
              replace: bool = False, fix: str = "detach it first, or replace=True") -> None:
    """Attach the XDP program `fd` to `dev` in namespace `ns` over netlink:
    the attachment outlives this process (for the rigs' XDP_PASS ports and
    the test pairs). A device that carries a program is refused unless `replace`."""
    bcc = _bcc()
    if mode not in MODES:
        raise ValueError(f"mode must be native or skb, got {mode!r}")
    flags = MODES[mode] | (0 if replace else XDP_FLAGS_UPDATE_IF_NOEXIST)
    with netns.inside(ns):
        _ifindex(dev, ns)
        res = bcc.lib.bpf_attach_xdp(dev.encode(), fd, flags)
        if res < 0:
            err = ctypes.get_errno() or -res
            if err in (errno.EBUSY, errno.EEXIST):
                raise _taken(dev, ns, fix)
            raise DataplaneError(f"attaching XDP ({mode}) to {dev} failed: {os.strerror(err)}"
                                 + (native_hint(dev, ns) if mode == "native" else ""))


def attach_link(fd: int, dev: str, ns: str | None = None, mode: str = "native", *,
                force: bool = False, fix: str = "force=True replaces it") -> int:
    """Attach the XDP program `fd` to `dev` in namespace `ns` through a BPF
    link (BPF_LINK_CREATE, made inside the namespace, where the ifindex
    means `dev`); returns the link's fd. The attachment lives as long as the
    link: when its last fd closes, with this process if nothing pinned it,
    the program detaches. A device that carries a program is refused with
    its id and name and `fix`, unless `force`, which detaches it first."""
    if mode not in MODES:
        raise ValueError(f"mode must be native or skb, got {mode!r}")
    with netns.inside(ns):
        ifindex = _ifindex(dev, ns)
        if force:
            clear(dev, ns)
        try:
            return clib.link_create(fd, ifindex, clib.BPF_XDP, MODES[mode])
        except OSError as e:
            # EBUSY: a program or link in this mode; EEXIST: one in the other mode
            if e.errno in (errno.EBUSY, errno.EEXIST):
                raise _taken(dev, ns, fix) from None
            raise DataplaneError(f"attaching XDP ({mode}) to {dev} failed: {e.strerror}"
                                 + (native_hint(dev, ns) if mode == "native" else "")) from None


def clear(dev: str, ns: str | None) -> dict | None:
    """Detach whatever XDP program `dev` in `ns` carries, held by a link
    (anyone's: BPF_LINK_DETACH leaves its owner a defunct link) or attached
    over netlink; returns what was there."""
    ifindex, att = lookup.attachment(dev, ns)
    if att is None:
        return None
    lid = lookup.xdp_link(att["prog_id"], ifindex)
    if lid is not None:
        detach_link_id(lid)
    elif att["mode"] in MODES:
        detach(dev, ns, att["mode"])
    return att


def detach_link_id(lid: int) -> bool:
    """BPF_LINK_DETACH the link with kernel id `lid`; False if it is gone."""
    try:
        lfd = clib.link_fd_by_id(lid)
    except OSError:
        return False
    try:
        clib.link_detach(lfd)
    except OSError:
        return False                    # defunct already: its device is gone
    finally:
        os.close(lfd)
    return True


def detach(dev: str, ns: str | None = None, mode: str = "native") -> None:
    """Detach the netlink-attached XDP program `dev` carries in `mode`; quiet
    if the device or namespace is gone already (a link's program stays:
    `clear` detaches those)."""
    bcc = _bcc()
    if ns and not netns.exists(ns):
        return
    with netns.inside(ns):
        try:
            _ifindex(dev, ns)
        except DataplaneError:
            return
        bcc.lib.bpf_attach_xdp(dev.encode(), -1, MODES[mode])


_pass_prog: Any = None


def attach_pass(dev: str, ns: str | None = None, mode: str = "native") -> None:
    """Attach the XDP_PASS program (bpf/xdp_pass.c) to `dev`: the peer of a
    native-mode LTP veth needs one so XDP_TX frames are delivered. An
    xdp_pass the device carries already (the rig's own) is left in place;
    any other program is refused."""
    global _pass_prog
    att = lookup.xdp_on(dev, ns)
    if att is not None and att["mode"] == mode and lookup.prog_name(att["prog_id"]) == "xdp_pass":
        return
    if _pass_prog is None:
        _pass_prog = compile_program("xdp_pass.c", "xdp_pass")
    attach_fd(_pass_prog[1].fd, dev, ns, mode,
              fix="detach it (its owner, or `ip link set DEV xdp off`) and try again")


def pin_fd(fd: int, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):
        os.unlink(path)
    try:
        clib.obj_pin(fd, path)
    except OSError as e:
        raise DataplaneError(f"pinning {path} failed: {e.strerror}"
                             + (" (mount bpffs: `ltp doctor --fix`)"
                                if e.errno in (errno.EPERM, errno.EINVAL) else "")) from e


class Dataplane:
    """One compiled ltp_xdp program with its maps, attachable to one device.

    >>> with Dataplane(Geometry(slots=4)) as dp:      # doctest: +SKIP
    ...     dp.attach("veth0", ns="ltp-a")
    ...     maps = dp.maps()
    """

    def __init__(self, geometry: Geometry | None = None, job: int = 0,
                 bpf_dir: Path = BPF_DIR, source: str = "ltp_xdp.c",
                 defines: tuple[str, ...] = ()):
        """`bpf_dir`: the folder whose ltp_xdp.c to compile (another version
        of the program for an A/B, `ltp bench xdp --against`); its maps must
        be bpf/ltp_maps.h's, which the typed views read. `source` and
        `defines` (NAME=VALUE, as -D flags): what `ltp bench xdp` compiles
        besides the program itself (the copy floor, stages left out)."""
        self.geometry = geometry or Geometry()
        cflags = [*self.geometry.cflags(), *(f"-D{d}" for d in defines)]
        if Path(bpf_dir) != BPF_DIR:
            cflags = [f"-I{bpf_dir}", *cflags]   # searched before bpf/
        self.bpf, self.fn = compile_program(source, "ltp_xdp", cflags, bpf_dir=bpf_dir)
        self.attached: tuple[str, str | None, str] | None = None
        self.link_fd: int | None = None
        self._maps = None
        try:
            self.maps().set_job(job)
        except BaseException:
            self.close()   # the program and its maps: nobody else holds them
            raise

    @property
    def prog_fd(self) -> int:
        return self.fn.fd

    def table(self, name: str):
        return self.bpf[name.encode()]

    def maps(self):
        """Typed views of this program's maps (dataplane.maps.LtpMaps)."""
        if self._maps is None:
            self._maps = LtpMaps.from_bpf(self.bpf, self.geometry)
        return self._maps

    def map_ids(self) -> dict[str, int]:
        """Kernel id of every map: what another process opens them by."""
        return {n: lookup.map_info(self.table(n).get_fd())["id"] for n in MAP_NAMES}

    def link_id(self) -> int:
        return lookup.link_info(self.link_fd)["id"] if self.link_fd is not None else 0

    def attach(self, dev: str, ns: str | None = None, mode: str = "native", *,
               force: bool = False, fix: str = "force=True replaces it") -> None:
        """Attach through a link this object holds (see `attach_link`)."""
        if self.attached:
            raise DataplaneError(f"attached already to {where(*self.attached[:2])}")
        self.link_fd = attach_link(self.prog_fd, dev, ns, mode, force=force, fix=fix)
        self.attached = (dev, ns, mode)

    def take_over(self, other: Dataplane) -> None:
        """Put this program on the device `other` is attached to, in its
        place at once (BPF_LINK_UPDATE of its link, which this object then
        holds): the device never goes without a program, as it would
        between a detach and an attach. `other` is left unattached."""
        if self.attached:
            raise DataplaneError(f"attached already to {where(*self.attached[:2])}")
        if other.link_fd is None or other.attached is None:
            raise DataplaneError("take_over: the other program holds no link to take")
        clib.link_update(other.link_fd, self.prog_fd)
        self.link_fd, self.attached = other.link_fd, other.attached
        other.link_fd, other.attached = None, None

    def detach(self) -> None:
        if self.link_fd is not None:
            with contextlib.suppress(OSError):   # defunct: the device is gone
                clib.link_detach(self.link_fd)
        self.leave_attached()

    def leave_attached(self) -> None:
        """Close this object's link fd without detaching: a pinned link keeps
        the program attached (`ltp load`); an unpinned one detaches with it."""
        if self.link_fd is not None:
            os.close(self.link_fd)
            self.link_fd = None
        self.attached = None

    def pin(self, directory: str) -> dict[str, str]:
        """Pin the program, its link (if attached) and every map under `directory` (on bpffs)."""
        paths = {}
        pin_fd(self.prog_fd, os.path.join(directory, "prog"))
        if self.link_fd is not None:
            pin_fd(self.link_fd, os.path.join(directory, "link"))
        for name in MAP_NAMES:
            path = os.path.join(directory, name)
            pin_fd(self.table(name).get_fd(), path)
            paths[name] = path
        return paths

    def close(self) -> None:
        self.detach()
        if self._maps is not None:
            self._maps.close()
            self._maps = None
        if self.bpf is not None:
            self.bpf.cleanup()
            self.bpf = None

    def __enter__(self) -> Dataplane:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
