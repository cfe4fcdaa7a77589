# SPDX-License-Identifier: Apache-2.0
"""A big-gradient DDP job for scripts/ab_loopback.py and scripts/launch_ab.sh:
an MLP 256-H-H-10 on random data (parameters in --dtype; mixed: bfloat16
but the last layer's float32, so DDP's buckets are of both), DDP's 4 MB
buckets; prints the median step, a digest and, over `ltp`, whether each of
the rank's TCP links reached its server by a Unix socket (tcp_local)."""
import argparse
import hashlib
import json
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ltpx.torch  # noqa: F401  (registers the `ltp` backend)
from ltpx.control.torchapi import breakdown

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--backend", default="ltp")
p.add_argument("--hidden", type=int, default=4096)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--dtype", default="float32",
               choices=("float32", "bfloat16", "float16", "mixed"))
p.add_argument("--bn", action="store_true", help="a BatchNorm after the first layer: buffers "
               "DDP broadcasts from rank 0 at every forward")
a = p.parse_args()
dist.init_process_group(a.backend)
torch.set_num_threads(1)
torch.manual_seed(0)
H = a.hidden
dt = torch.bfloat16 if a.dtype == "mixed" else getattr(torch, a.dtype)


class Float32(torch.nn.Module):
    def forward(self, v):
        return v.float()


net = torch.nn.Sequential(torch.nn.Linear(256, H),
                          *([torch.nn.BatchNorm1d(H)] if a.bn else []), torch.nn.ReLU(),
                          torch.nn.Linear(H, H), torch.nn.ReLU()).to(dt)
if a.dtype == "mixed":
    net.append(Float32())
net.append(torch.nn.Linear(H, 10).to(torch.float32 if a.dtype == "mixed" else dt))
model = DDP(net, bucket_cap_mb=4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(8, 256, dtype=dt), torch.randint(0, 10, (8,))
times = []
phases = breakdown.worker()
phases.discard()
for _ in range(a.steps):
    t0 = time.perf_counter()
    phases.start_step()
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x).float(), y).backward()
    opt.step()
    phases.end_step()
    times.append(time.perf_counter() - t0)
s = sorted(times[2:])            # the first two: set-up (buckets, connections)
h = hashlib.sha256(b"".join(q.detach().view(-1).view(torch.uint8).numpy().tobytes()
                            for q in net.parameters()))
bd = breakdown.worker_summary() if a.backend == "ltp" else None
local = None
if a.backend == "ltp":
    from ltpx.control.torchapi.job import current
    local = [getattr(part, "local", None) for part in current().link.parts()]
res = json.dumps({"event": "result", "rank": dist.get_rank(), "backend": a.backend,
                  "tcp_local": local,
                  "breakdown": bd and {"median": bd["median"], "comm": bd["comm"]["median"]},
                  "params": sum(q.numel() for q in net.parameters()),
                  "step_med_s": round(s[len(s) // 2], 4), "digest": h.hexdigest()[:16]})
# one write (torchrun runs its ranks unbuffered on one stdout: print's
# two writes, text and newline, interleave with a neighbour's)
sys.stdout.write(res + "\n")
sys.stdout.flush()
del model
dist.destroy_process_group()
