# SPDX-License-Identifier: Apache-2.0
"""What one small exact collective costs: N all-gathers (--kb each rank),
all-reduces and broadcasts over the group's backend, each timed alone after
a warm-up; for scripts/launch_ab.sh (--script). Prints the median of each
kind in ms and, as `step_med_s`, the all-gather's median (s); over `ltp`
also where an op's time went on this rank (the exchange's barrier, push and
pull per op, ms)."""
import argparse
import hashlib
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

import ltpx.torch  # noqa: F401  (registers the `ltp` backend)

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--backend", default="ltp")
p.add_argument("--ops", type=int, default=100, help="timed calls of each kind")
p.add_argument("--kb", type=int, default=16, help="each rank's all-gather input, kB")
a = p.parse_args()
dist.init_process_group(a.backend)
torch.set_num_threads(1)
rank, world = dist.get_rank(), dist.get_world_size()
n = a.kb * 256
mine = torch.full((n,), float(rank))
out = torch.empty(n * world)
small = torch.ones(256)


def timed(call, count: int) -> list[float]:
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return times


calls = {"all_gather": lambda: dist.all_gather_into_tensor(out, mine),
         "all_reduce": lambda: dist.all_reduce(small),
         "broadcast": lambda: dist.broadcast(small, src=0)}
for call in calls.values():
    timed(call, 5)                       # warm-up: rounds sized, connections made
exchange = None
if a.backend == "ltp":
    from ltpx.control.torchapi.job import current
    exchange = current().exchange
    before = dict(exchange.times)
med = {}
for name, call in calls.items():
    med[name] = statistics.median(timed(call, a.ops))
parts = None
if exchange is not None:   # per op, over every timed call of every kind
    k = a.ops * len(calls)
    parts = {key: round((exchange.times[key] - before.get(key, 0.0)) / k * 1e3, 3)
             for key in exchange.times if key.endswith("_s")}
dist.barrier()
res = json.dumps({"event": "result", "rank": rank, "backend": a.backend,
                  "ms": {k: round(v * 1e3, 3) for k, v in med.items()},
                  "per_op_ms": parts, "step_med_s": round(med["all_gather"], 5),
                  "params": n, "digest": hashlib.sha256(out.numpy().tobytes()).hexdigest()[:16]})
# one write (torchrun runs its ranks unbuffered on one stdout: print's
# two writes, text and newline, interleave with a neighbour's)
sys.stdout.write(res + "\n")
sys.stdout.flush()
dist.destroy_process_group()
