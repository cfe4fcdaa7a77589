"""Compile, attach, detach and pin the LTP XDP program (and its helpers).

`Dataplane` owns one compiled ltp_xdp program and its maps; geometry (slots,
chunks, chunk size, banks, port) is compiled in as -D defines. Attaching works
in native or skb mode on a device inside a named network namespace. An
attached program outlives this process, so callers detach (or delete the
namespace) when done; `Dataplane` as a context manager does that.
"""
from __future__ import annotations

import ctypes
import errno
import os
from typing import Any

from ... import BPF_DIR
from .. import clib, netns
from .maps import MAP_NAMES, Geometry, LtpMaps
from ...errors import DataplaneError

XDP_FLAGS_UPDATE_IF_NOEXIST = 1 << 0
XDP_FLAGS_SKB_MODE = 1 << 1
XDP_FLAGS_DRV_MODE = 1 << 2
MODES = {"native": XDP_FLAGS_DRV_MODE, "skb": XDP_FLAGS_SKB_MODE}

BPFFS = "/sys/fs/bpf"


def _bcc():
    try:
        import bcc
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise DataplaneError("bcc is not importable: install Debian's python3-bpfcc and use a "
                             "venv made with --system-site-packages (see `ltp doctor`)") from e
    return bcc


def compile_program(source: str, func: str, cflags: list[str] | None = None,
                    prog_type: str = "XDP"):
    """Compile bpf/<source> with bcc and load `func` as a program of
    `prog_type` (a bcc.BPF attribute: "XDP", "SCHED_CLS", ...).

    Returns (bpf, function)."""
    bcc = _bcc()
    if os.geteuid() != 0:
        raise DataplaneError("loading BPF programs needs root: run with sudo")
    path = BPF_DIR / source
    try:
        b = bcc.BPF(src_file=str(path).encode(),
                    cflags=cflags or [f"-I{BPF_DIR}", "-Wno-ignored-attributes"])
        fn = b.load_func(func.encode(), getattr(bcc.BPF, prog_type))
    except Exception as e:
        hint = ""
        if not os.path.exists(f"/lib/modules/{os.uname().release}/build"):
            hint = " (kernel headers missing: run `ltp doctor --fix`)"
        raise DataplaneError(f"compiling {path.name} failed: {e}{hint}") from e
    return b, fn


def _has_dev(dev: str) -> bool:
    """Is `dev` a device in this thread's namespace? (/sys/class/net shows
    the namespace sysfs was mounted in, so ask the kernel by name.)"""
    import socket
    try:
        socket.if_nametoindex(dev)
        return True
    except OSError:
        return False


def attach_fd(fd: int, dev: str, ns: str | None = None, mode: str = "native",
              replace: bool = True) -> None:
    """Attach the XDP program `fd` to `dev` in namespace `ns`."""
    bcc = _bcc()
    if mode not in MODES:
        raise ValueError(f"mode must be native or skb, got {mode!r}")
    flags = MODES[mode] | (0 if replace else XDP_FLAGS_UPDATE_IF_NOEXIST)
    with netns.inside(ns):
        if not _has_dev(dev):
            raise DataplaneError(f"no device {dev!r} in namespace {ns or '(host)'}")
        res = bcc.lib.bpf_attach_xdp(dev.encode(), fd, flags)
        if res < 0:
            err = ctypes.get_errno() or -res
            if err == errno.EBUSY:
                raise DataplaneError(f"{dev}: an XDP program is already attached")
            raise DataplaneError(f"attaching XDP ({mode}) to {dev} failed: {os.strerror(err)}"
                                 + (" (native mode needs MTU <= ~3500 on veth)"
                                    if mode == "native" else ""))


def detach(dev: str, ns: str | None = None, mode: str = "native") -> None:
    """Detach whatever XDP program `dev` carries in `mode`; quiet if the
    device or namespace is gone already."""
    bcc = _bcc()
    if ns and not netns.exists(ns):
        return
    with netns.inside(ns):
        if not _has_dev(dev):
            return
        bcc.lib.bpf_attach_xdp(dev.encode(), -1, MODES[mode])


_pass_prog: Any = None


def attach_pass(dev: str, ns: str | None = None, mode: str = "native") -> None:
    """Attach the XDP_PASS program (bpf/xdp_pass.c) to `dev`: the peer of a
    native-mode LTP veth needs one so XDP_TX frames are delivered."""
    global _pass_prog
    if _pass_prog is None:
        _pass_prog = compile_program("xdp_pass.c", "xdp_pass")
    attach_fd(_pass_prog[1].fd, dev, ns, mode)


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


def open_pinned(path: str) -> int:
    """fd of a pinned map or program; raises FileNotFoundError if absent."""
    return clib.obj_get(path)


class Dataplane:
    """One compiled ltp_xdp program with its maps, attachable to one device.

    >>> with Dataplane(Geometry(slots=4)) as dp:      # doctest: +SKIP
    ...     dp.attach("veth0", ns="ltp-a")
    ...     maps = dp.maps()
    """

    def __init__(self, geometry: Geometry | None = None, job: int = 0):
        self.geometry = geometry or Geometry()
        self.bpf, self.fn = compile_program("ltp_xdp.c", "ltp_xdp", self.geometry.cflags())
        self.attached: tuple[str, str | None, str] | None = None
        self._maps = None
        self.maps().set_job(job)

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

    def attach(self, dev: str, ns: str | None = None, mode: str = "native",
               replace: bool = True) -> None:
        attach_fd(self.prog_fd, dev, ns, mode, replace)
        self.attached = (dev, ns, mode)

    def detach(self) -> None:
        if self.attached:
            detach(*self.attached)
            self.attached = None

    def pin(self, directory: str) -> dict[str, str]:
        """Pin the program and every map under `directory` (on bpffs)."""
        paths = {}
        pin_fd(self.prog_fd, os.path.join(directory, "prog"))
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

    def __enter__(self) -> "Dataplane":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
