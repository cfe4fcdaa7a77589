#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""How long a worker's device goes without an XDP program while its endpoint
is made anew for a larger room: closed, then made (as before 2026-12-02),
against made in its place (`Endpoint(..., succeeds=old)`, succession.py).

On a one-worker rig of its own, each block makes the worker's endpoint anew
--remakes times, its room doubling each time from 4096 elements, once per
arm, the arms' order swapped every block (the machine drifts). A thread
reads the device's XDP attachment over netlink as fast as it can meanwhile;
a remake's gap is the longest run of reads that found no program (0 when
every read found one). A first block, not counted, fills the compile cache
for every room, so the arms meet warm caches alike. Prints one JSON line
per block and arm, then the summary: each arm's median remake time and its
median and largest gap.

USAGE (root; from the repository root):
  sudo .venv/bin/python scripts/remake_gap.py
  sudo .venv/bin/python scripts/remake_gap.py --blocks 5 --remakes 4 -j
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

from ltpx.control.transport import Endpoint
from ltpx.control.trust import tokens
from ltpx.dataplane.rig.star import Rig, RigConfig
from ltpx.dataplane.xdp import lookup

ARMS = ("close-then-make", "succeed")


class Watch:
    """A thread reading the device's attachment until stopped: the longest
    run of reads that found no program, in seconds."""

    def __init__(self, dev: str, ns: str):
        self.xdp_on, self.dev, self.ns = lookup.xdp_on, dev, ns
        self.stop, self.gap, self.reads = threading.Event(), 0.0, 0
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self) -> None:
        since = None
        while not self.stop.is_set():
            now, bare = time.monotonic(), self.xdp_on(self.dev, self.ns) is None
            self.reads += 1
            if bare and since is None:
                since = now
            elif not bare and since is not None:
                self.gap, since = max(self.gap, now - since), None
        if since is not None:
            self.gap = max(self.gap, time.monotonic() - since)

    def end(self) -> float:
        self.stop.set()
        self.t.join()
        return self.gap


def block(rig, arm: str, remakes: int) -> dict:
    h, secret = rig.workers[0], tokens.new_secret()

    def make(n: int, old=None):
        return Endpoint(h.ifname, h.ip, {0: 0}, n, ns=h.netns, mode=rig.config.mode, job=0x4041,
                        self_id=0, secret=secret, publish=False, liveness_s=None, sender="socket",
                        **({"succeeds": old} if old is not None else {}))
    ep = make(4096)
    times, gaps, reads = [], [], []
    try:
        for k in range(1, remakes + 1):
            watch = Watch(h.ifname, h.netns)
            t0 = time.monotonic()
            if arm == "succeed":
                new = make(4096 << k, ep)
                ep.close()
            else:
                ep.close()
                new = make(4096 << k)
            ep = new
            times.append(time.monotonic() - t0)
            gaps.append(watch.end())
            reads.append(watch.reads)
    finally:
        ep.close()
    return {"arm": arm, "remake_s": [round(t, 4) for t in times],
            "gap_s": [round(g, 4) for g in gaps], "reads": reads}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("USAGE")[1])
    p.add_argument("--blocks", type=int, default=3, help="blocks counted (default 3)")
    p.add_argument("--remakes", type=int, default=4, help="remakes per arm per block "
                   "(default 4: rooms up to 4096 << 4)")
    p.add_argument("-j", "--json", action="store_true", help="the summary alone, as JSON")
    a = p.parse_args(argv)
    if a.blocks < 1 or not 1 <= a.remakes <= 10:
        p.error("--blocks must be at least 1 and --remakes in 1..10")
    if os.geteuid() != 0:
        print("remake_gap: needs root (BPF and a rig): run it with sudo", file=sys.stderr)
        return 1
    rows = []
    with Rig(RigConfig(name=f"rg{os.getpid() % 100000}", workers=1)) as rig:
        block(rig, "succeed", a.remakes)          # the compile cache filled, not counted
        for b in range(a.blocks):
            for arm in (ARMS if b % 2 == 0 else ARMS[::-1]):
                row = dict(block(rig, arm, a.remakes), block=b + 1)
                rows.append(row)
                if not a.json:
                    print(json.dumps(row), flush=True)
    summary = {}
    for arm in ARMS:
        t = [x for r in rows if r["arm"] == arm for x in r["remake_s"]]
        g = [x for r in rows if r["arm"] == arm for x in r["gap_s"]]
        summary[arm] = {"remakes": len(t), "median_remake_s": round(statistics.median(t), 4),
                        "median_gap_s": round(statistics.median(g), 4),
                        "max_gap_s": round(max(g), 4)}
    print(json.dumps({"summary": summary, "load_avg": os.getloadavg()[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
