#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A/B of the TCP transport's local hop (control/torchapi/localsock.py): the
server's and W workers' links in one process on this host, every worker
pushing a round of N float32 and taking the answer back, over loopback TCP
(LTP_TCP_LOCAL=0) and over the server's Unix socket, in alternating blocks:

    .venv/bin/python scripts/ab_tcp_local.py [--workers 2] [--mb 72] [--blocks 4] [--reps 5]

Prints a line per block and arm (median seconds a round trip, GB/s of
gradient moved: W x N x 4 bytes in and as many out) and a JSON summary.
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from tcp_links import in_threads, pair  # noqa: E402

from ltpx.control.torchapi.host import rank_host  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--workers", type=int, default=2)
p.add_argument("--mb", type=float, default=72.0, help="each worker's round, MB")
p.add_argument("--blocks", type=int, default=4)
p.add_argument("--reps", type=int, default=5, help="timed round trips a block")
a = p.parse_args()
n = int(a.mb * 1e6 / 4)
ids = list(range(a.workers))
rows = [np.full(n, w + 1, np.float32) for w in ids]
outs = [np.empty(n, np.float32) for _ in ids]


def round_trip(server, workers, r: int) -> float:
    t0 = time.perf_counter()
    ts, errors = in_threads(*[lambda w=w: (workers[w].push(2 * r, rows[w], False),
                                           workers[w].pull(2 * r + 1, outs[w])) for w in ids])
    got = server.gather(2 * r, n, ids)
    server.send(2 * r + 1, got.values[0], False)
    for t in ts:
        t.join()
    assert not errors, errors
    return time.perf_counter() - t0


res: dict[str, list[float]] = {"tcp": [], "unix": []}
for b in range(1, a.blocks + 1):
    for arm in ("tcp", "unix"):
        os.environ["LTP_TCP_LOCAL"] = "1" if arm == "unix" else "0"
        with pair(timeout=60.0, host=rank_host(), workers=a.workers) as (server, workers):
            assert {c.family for c in server.conns} == {1 if arm == "unix" else 2}
            server.ensure(n)
            round_trip(server, workers, 0)                 # buffers touched, threads made
            med = statistics.median(round_trip(server, workers, r) for r in range(1, a.reps + 1))
        res[arm].append(med)
        gbs = 2 * a.workers * n * 4 / med / 1e9
        print(f"block {b} {arm:5} {med * 1e3:8.1f} ms a round trip {gbs:6.2f} GB/s", flush=True)
summary = {arm: round(statistics.median(v), 5) for arm, v in res.items()}
summary["tcp_over_unix"] = round(summary["tcp"] / summary["unix"], 3)
print(json.dumps({"workers": a.workers, "mb": a.mb, "median_s": summary, "blocks": res}))
