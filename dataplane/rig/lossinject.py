# SPDX-License-Identifier: Apache-2.0
"""The star rig's loss injector (bpf/loss_tc.c): a tc program on egress of
switch ports that drops IPv4 UDP/TCP packets with a probability read from
its map `loss_cfg` on every packet (so a new value acts at once), and counts
per CPU in `loss_stats` what it dropped, passed, and did not judge (ARP,
ICMP, IPv6...). Its program and maps are pinned, so any process can change
the probability or read the counters."""
from __future__ import annotations

import ctypes
from collections.abc import Sequence

from .. import clib
from . import netlink, tcprogs

STATS = ("dropped", "passed", "other")          # loss_stats keys 0, 1, 2
PINS = ("loss_cfg", "loss_stats", "loss_prog")  # file names in the rig's pin folder


def check(p: float) -> float:
    """`p` if it is a drop probability the injector can apply, else ValueError."""
    if not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"loss: must be in [0, 1), got {p!r}")
    return p


def threshold(p: float) -> int:
    """The u32 the program compares a random u32 with: drop below it."""
    return min(int(round(p * 2**32)), 2**32 - 1)


def load(ipr, ifindexes: Sequence[int], pin_dir: str, p: float) -> None:
    """Compile the injector, set its probability to `p`, pin its maps and
    program in `pin_dir` and attach it on egress of each of `ifindexes` (in
    the namespace of `ipr`)."""
    b, fn = tcprogs.compile_tc("loss_tc.c", "loss_tc")
    try:
        cfg, stats = b[b"loss_cfg"].get_fd(), b[b"loss_stats"].get_fd()
        write(cfg, p)
        tcprogs.pin_all(pin_dir, dict(zip(PINS, (cfg, stats, fn.fd))))
        for idx in ifindexes:
            netlink.attach_tc_egress(ipr, idx, fn.fd, "loss_tc")
    finally:
        b.cleanup()   # tc and the pins hold the program and maps from here on


def write(cfg_fd: int, p: float) -> None:
    """Set the drop probability (map loss_cfg)."""
    tcprogs.update(cfg_fd, 0, ctypes.c_uint32(threshold(p)))


def read(cfg_fd: int) -> float:
    """The drop probability the injector applies now (map loss_cfg)."""
    v = ctypes.c_uint32()
    tcprogs.lookup(cfg_fd, 0, v)
    return v.value / 2**32


def counters(stats_fd: int) -> dict[str, int]:
    """{"dropped", "passed", "other"}: packets summed over CPUs (map loss_stats)."""
    ncpu = clib.num_possible_cpus()
    out = {}
    for i, key in enumerate(STATS):
        vals = (ctypes.c_uint64 * ncpu)()
        tcprogs.lookup(stats_fd, i, vals)
        out[key] = int(sum(vals))
    return out


def reset(stats_fd: int) -> None:
    """Zero the counters on every CPU."""
    ncpu = clib.num_possible_cpus()
    for i in range(len(STATS)):
        tcprogs.update(stats_fd, i, (ctypes.c_uint64 * ncpu)())
