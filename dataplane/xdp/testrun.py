"""BPF_PROG_TEST_RUN for XDP programs, through libbpf's bpf_prog_test_run_opts.

Runs a loaded program on one packet in the kernel without attaching it and
returns the verdict, the packet as the program left it, and the kernel's
measured run time.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_TX, XDP_REDIRECT = range(5)
VERDICTS = {XDP_ABORTED: "XDP_ABORTED", XDP_DROP: "XDP_DROP", XDP_PASS: "XDP_PASS",
            XDP_TX: "XDP_TX", XDP_REDIRECT: "XDP_REDIRECT"}

# The kernel may grow the packet (tail room); leave spare room for output.
OUT_SPARE = 258


class _Opts(ctypes.Structure):
    """struct bpf_test_run_opts (libbpf 1.x)."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("data_in", ctypes.c_void_p),
        ("data_out", ctypes.c_void_p),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_void_p),
        ("ctx_out", ctypes.c_void_p),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("repeat", ctypes.c_int),
        ("duration", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
    ]


_lib = None


def _libbpf():
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
        _lib.bpf_prog_test_run_opts.argtypes = [ctypes.c_int, ctypes.POINTER(_Opts)]
        _lib.bpf_prog_test_run_opts.restype = ctypes.c_int
    return _lib


@dataclass
class RunResult:
    verdict: int
    data: bytes
    duration_ns: int

    @property
    def verdict_name(self) -> str:
        return VERDICTS.get(self.verdict, str(self.verdict))


BPF_F_TEST_XDP_LIVE_FRAMES = 1 << 1


def run_xdp_live(prog_fd: int, packet: bytes, repeat: int, batch_size: int = 64) -> int:
    """Run `prog_fd` `repeat` times on fresh copies of `packet` in live-frame
    mode (XDP_TX really transmits on the calling thread's namespace's
    loopback, where it is dropped): returns the kernel's mean ns per run.
    Call it inside a private network namespace."""
    inbuf = ctypes.create_string_buffer(bytes(packet), len(packet))
    opts = _Opts(sz=ctypes.sizeof(_Opts), data_in=ctypes.addressof(inbuf),
                 data_size_in=len(packet), repeat=repeat, flags=BPF_F_TEST_XDP_LIVE_FRAMES,
                 batch_size=batch_size)
    if _libbpf().bpf_prog_test_run_opts(prog_fd, ctypes.byref(opts)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"BPF_PROG_TEST_RUN (live frames): {os.strerror(err)}")
    return opts.duration


def run_xdp(prog_fd: int, packet: bytes, repeat: int = 1) -> RunResult:
    """Run the XDP program `prog_fd` on `packet` (bytes from the Ethernet header)."""
    inbuf = ctypes.create_string_buffer(bytes(packet), len(packet))
    outbuf = ctypes.create_string_buffer(len(packet) + OUT_SPARE)
    opts = _Opts(sz=ctypes.sizeof(_Opts), data_in=ctypes.addressof(inbuf),
                 data_out=ctypes.addressof(outbuf), data_size_in=len(packet),
                 data_size_out=len(outbuf), repeat=repeat)
    if _libbpf().bpf_prog_test_run_opts(prog_fd, ctypes.byref(opts)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"BPF_PROG_TEST_RUN: {os.strerror(err)}")
    return RunResult(opts.retval, outbuf.raw[:opts.data_size_out], opts.duration)
