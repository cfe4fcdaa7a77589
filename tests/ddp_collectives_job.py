# SPDX-License-Identifier: Apache-2.0
"""The collectives a DDP script uses, on fixed inputs, under any backend.

    ltp launch --workers 3 -- python tests/ddp_collectives_job.py ltp
    ltp launch --workers 3 --servers 0 -- python tests/ddp_collectives_job.py gloo
    ltp launch --workers 3 -- python tests/ddp_collectives_job.py ltp die   (rank 1 dies)

Each rank prints one JSON line: every result as hex bytes (so the test
compares the `ltp` backend's with gloo's bit for bit), the errors the
unsupported calls raise, and a short DDP run's parameter digest.
"""
import hashlib
import json
import os
import signal
import sys
import warnings

import torch
import torch.distributed as dist

import ltpx.torch  # noqa: F401  (registers the `ltp` backend)

warnings.simplefilter("ignore", FutureWarning)   # reduce_scatter_tensor's new name
backend = sys.argv[1]
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(100 + rank)
out: dict = {}


def keep(name: str, t) -> None:
    ts = t if isinstance(t, (list, tuple)) else [t]
    out[name] = [x.contiguous().view(-1).view(torch.uint8).numpy().tobytes().hex() for x in ts]


# sums, products, minima and maxima of integer and floating tensors
for dt in (torch.int32, torch.int64, torch.uint8):
    x = (torch.arange(7) * (rank + 3) % 251).to(dt)
    for op in ("SUM", "MIN", "MAX", "PRODUCT"):
        y = x.clone()
        dist.all_reduce(y, op=getattr(dist.ReduceOp, op))
        keep(f"{dt}/{op}", y)
for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
    x = torch.randn(33).to(dt)
    for op in ("SUM", "MIN", "MAX", "AVG"):
        y = x.clone()
        dist.all_reduce(y, op=getattr(dist.ReduceOp, op))
        keep(f"{dt}/{op}", y)

# broadcast and gathers
b = torch.arange(10, dtype=torch.int64) * (rank + 1)
dist.broadcast(b, src=world - 1)
keep("broadcast", b)
mine = torch.randn(5)
g = [torch.empty(5) for _ in range(world)]
dist.all_gather(g, mine)
keep("all_gather", g)
flat = torch.empty(5 * world)
dist.all_gather_into_tensor(flat, mine)
keep("all_gather_into_tensor", flat)
rs = torch.empty(4, dtype=torch.int64)
dist.reduce_scatter_tensor(rs, torch.arange(4 * world, dtype=torch.int64) * (rank + 1))
keep("reduce_scatter_tensor", rs)
objs = [None] * world
dist.all_gather_object(objs, {"rank": rank, "name": f"r{rank}"})
lst = [{"k": [1, 2, 3]}, "x"] if rank == 0 else [None, None]
dist.broadcast_object_list(lst, src=0)
out["objects"] = [objs, lst]
dist.barrier()

# async: a work to wait on, and its future
w = dist.all_reduce(torch.ones(3, dtype=torch.int64), async_op=True)
w.wait()
t = torch.full((3,), rank, dtype=torch.int64)
w = dist.all_reduce(t, async_op=True)
out["future"] = [int(v) for v in w.get_future().wait()[0]]

# a subgroup of ranks 0 and 1 (every rank calls new_group)
sub = dist.new_group([0, 1])
if rank < 2:
    s = torch.tensor([rank + 10], dtype=torch.int64)
    dist.all_reduce(s, group=sub)
    out["subgroup"] = int(s)

# an integer AVG (gloo has none): the sum divided by the ranks, truncated
# toward zero as NCCL's (Lightning averages its integer batch counts)
if backend == "ltp":
    v = (1, 2, 4)[rank % 3]
    t = torch.tensor([v, -v], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    out["avg_int"] = t.tolist()

# what is not supported says so (gloo's send would wait for a recv)
errors = {}
unsupported = (("send", lambda: dist.send(torch.ones(1), dst=(rank + 1) % world)),
               ("avg_bool", lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool),
                                                    op=dist.ReduceOp.AVG)))
for name, call in [] if backend != "ltp" else unsupported:
    try:
        call()
        errors[name] = None
    except Exception as e:   # noqa: BLE001 (the message is what is compared)
        errors[name] = f"{type(e).__name__}: {e}"
out["errors"] = errors

# a short DDP run: the replicas' digest
torch.manual_seed(rank)
model = torch.nn.parallel.DistributedDataParallel(   # several buckets a step
    torch.nn.Sequential(torch.nn.Linear(20, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256),
                        torch.nn.Tanh(), torch.nn.Linear(256, 4)), bucket_cap_mb=0.1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
gen = torch.Generator().manual_seed(7 + rank)
for step in range(15):
    if sys.argv[2:] == ["die"] and rank == 1 and step == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    opt.zero_grad()
    x = torch.randn(16, 20, generator=gen)
    model(x).pow(2).mean().backward()
    opt.step()
total = torch.tensor([step + 1])
dist.all_reduce(total)          # exact: after a rank died, gloo says so here
out["steps"] = int(total)
h = hashlib.sha256()
for p in model.parameters():
    h.update(p.detach().view(-1).view(torch.uint8).numpy().tobytes())
out["digest"] = h.hexdigest()[:16]
if backend == "ltp":   # the buckets' LTP ops (ddp.TolerantReduce), how each call went
    from ltpx.control.torchapi.job import current
    out["tolerant"] = current().tolerant.stats()
    out["routes"] = dict(dist.group.WORLD.routes)
    # this trainer's place on its host: as the launcher says, as LTP counts
    out["local"] = [int(os.environ.get("LOCAL_RANK", 0)), ltpx.torch.local_rank()]
print(json.dumps({"event": "result", "rank": rank, "world": world, **out}))
dist.destroy_process_group()
