# SPDX-License-Identifier: Apache-2.0
"""The machine's busy CPU time, from /proc/stat, for benchmarks' CPU figures.

Busy is user + nice + system + irq + softirq over every CPU (guest time is
inside user; idle, iowait and steal are not busy), in seconds. The counters
tick at USER_HZ (100 Hz): a single short interval is coarse, a sum over many
rounds is not biased. They count the whole machine, neighbours included: on
a shared machine a benchmark should alternate what it compares.
"""
from __future__ import annotations

import os

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot."""
    with open("/proc/stat", "rb") as f:
        fields = f.readline().split()
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
    return (user + nice + system + irq + softirq) * TICK_S


def ncpu() -> int:
    """CPUs /proc/stat counts (online)."""
    return os.cpu_count() or 1
