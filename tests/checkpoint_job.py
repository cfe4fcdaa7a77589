# SPDX-License-Identifier: Apache-2.0
"""One rank of the job test_checkpoint.py starts over TCP on loopback:
`python checkpoint_job.py DIR`.

Every worker trains a small model three steps; worker 0 saves a checkpoint
in DIR; then each worker moves its parameters its own way and resumes,
with checkpoint.PIECE_BYTES from the environment (CKPT_PIECE). Each worker
prints one JSON line: the digest saved (worker 0's), the digest after
resume, the ops resume ran, the checkpoint's size and its `extra`.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

import ltpx.torch as lt
from ltpx.control.torchapi import checkpoint
from ltpx.control.torchapi.job import current

lt.init()
ckdir = sys.argv[1]
checkpoint.PIECE_BYTES = int(os.environ["CKPT_PIECE"])
DEV = torch.device(os.environ.get("JOB_DEVICE", "cpu"))   # cuda: tests/gpu
torch.manual_seed(1)
model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(),
                            torch.nn.Linear(32, 3)).to(DEV)
lt.broadcast_parameters(model.state_dict(), root_rank=0)
opt = lt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                              named_parameters=model.named_parameters())
g = torch.Generator().manual_seed(2)
for _ in range(3):
    x = torch.randn(8, 12, generator=g).to(DEV)
    opt.zero_grad()
    F.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
    opt.step()
saved = lt.digest(model)
path = checkpoint.save(ckdir, opt, {"note": "three steps"}, "fp") if lt.rank() == 0 else None
with torch.no_grad():
    for p in model.parameters():
        p.add_(lt.rank() + 1.0)
before = current().exchange.clock.seq
extra = checkpoint.resume(opt, ckdir, "fp")
ops = current().exchange.clock.seq - before
size = len(torch.load(path, weights_only=True)["blob"]) if path else None
state_devices = sorted({v.device.type for s in opt.state.values() for v in s.values()
                        if torch.is_tensor(v)})
print(json.dumps({"rank": lt.rank(), "saved": saved, "resumed": lt.digest(model), "ops": ops,
                  "size": size, "extra": extra, "steps": opt.steps,
                  "devices": sorted({p.device.type for p in model.parameters()}),
                  "state_devices": state_devices}), flush=True)
lt.shutdown()
