# SPDX-License-Identifier: Apache-2.0
"""How long a thread has waited for a CPU while it could run: the kernel's
schedstat (/proc/<pid>/task/<tid>/schedstat, its second field, ns).

A rank's own time before a barrier (exchange.Arrival.own_s) is its wall time
less this wait, so that on a host its ranks share, one rank's time is not
its neighbours': measured with 8 workers on 2 cores, every worker took about
11 ms from its answer to its next barrier, a worker sleeping 3 ms a step
(a straggler, as a throttled GPU is) included, since each also waited that
long for a core. On a host of its own the wait is about 0 and the own time
its wall time. Where schedstat is missing, the wait reads 0.
"""
from __future__ import annotations

import os


class RunQueue:
    """The calling thread's wait for a CPU (an Exchange is built by the
    thread that trains). By /proc/thread-self, not the main thread's id:
    after a fork (a rank from `ltp`'s fork server) Python's main thread
    keeps the parent's."""

    def __init__(self):
        try:
            self.fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self.fd = None

    def waited_ns(self) -> int:
        """Nanoseconds this thread has waited on a run queue since it started."""
        if self.fd is None:
            return 0
        try:
            return int(os.pread(self.fd, 64, 0).split()[1])
        except (OSError, IndexError, ValueError):
            return 0

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self):
        self.close()
