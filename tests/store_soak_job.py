# SPDX-License-Identifier: Apache-2.0
"""One rank of a long, small ltpx.torch job (tests/test_store_trust.py):
`python store_soak_job.py STEPS`.

Each worker runs STEPS optimizer steps of a tiny model, with an all-reduce
every 10th step (another kind of op), and worker 0 prints the number of
keys in the rendezvous store at every 25th step as
{"step": s, "keys": n}; at the end every worker prints
{"event": "result", "digest": ...}.
"""
import json
import sys

import torch
import torch.nn.functional as F

import ltpx.torch as lt
from ltpx.control.torchapi.job import current

steps = int(sys.argv[1])
lt.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
lt.broadcast_parameters(model.state_dict(), root_rank=0)
opt = lt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                              named_parameters=model.named_parameters(), bucket_mb=0.001)
g = torch.Generator().manual_seed(1 + lt.rank())
for s in range(steps):
    x = torch.randn(16, 8, generator=g)
    opt.zero_grad()
    F.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
    opt.step()
    if s % 10 == 9:
        lt.allreduce(torch.ones(3))
    if lt.rank() == 0 and s % 25 == 0:
        print(json.dumps({"step": s, "keys": current().store.num_keys()}), flush=True)
print(json.dumps({"event": "result", "digest": lt.digest(model),
                  "buckets": len(opt.ltp.plan)}), flush=True)
lt.shutdown()
