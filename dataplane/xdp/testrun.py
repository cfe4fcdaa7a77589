# SPDX-License-Identifier: Apache-2.0
"""BPF_PROG_TEST_RUN for XDP programs, through libbpf's bpf_prog_test_run_opts.

Runs a loaded program on one packet in the kernel without attaching it and
returns the verdict, the packet as the program left it, and the kernel's
measured run time.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

from ..clib import TestRunOpts, prog_test_run

XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_TX, XDP_REDIRECT = range(5)
VERDICTS = {XDP_ABORTED: "XDP_ABORTED", XDP_DROP: "XDP_DROP", XDP_PASS: "XDP_PASS",
            XDP_TX: "XDP_TX", XDP_REDIRECT: "XDP_REDIRECT"}

# The kernel may grow the packet (tail room); leave spare room for output.
OUT_SPARE = 258


@dataclass
class RunResult:
    verdict: int
    data: bytes
    duration_ns: int

    @property
    def verdict_name(self) -> str:
        return VERDICTS.get(self.verdict, str(self.verdict))


def run_xdp(prog_fd: int, packet: bytes, repeat: int = 1, grow: int = 0) -> RunResult:
    """Run the XDP program `prog_fd` on `packet` (bytes from the Ethernet header);
    `grow`: room for that many more bytes out (a program that grows the frame)."""
    inbuf = ctypes.create_string_buffer(bytes(packet), len(packet))
    outbuf = ctypes.create_string_buffer(len(packet) + OUT_SPARE + max(0, grow))
    opts = TestRunOpts(sz=ctypes.sizeof(TestRunOpts), data_in=ctypes.addressof(inbuf),
                 data_out=ctypes.addressof(outbuf), data_size_in=len(packet),
                 data_size_out=len(outbuf), repeat=repeat)
    prog_test_run(prog_fd, opts)
    return RunResult(opts.retval, outbuf.raw[:opts.data_size_out], opts.duration)
