# SPDX-License-Identifier: Apache-2.0
"""A 4.2M-parameter MLP on a generated task, trained over LTP with ltpx.torch in several buckets.

    sudo ltp launch --workers 4 -- python docs/examples/big_model.py
    sudo ltp launch --workers 8 -j -- python docs/examples/big_model.py --epochs 1 --no-overlap --bucket-mb 64

The data are generated on every rank alike (nothing to download): ten
classes, each a cloud of noisy points around its own random centre. The
model's 16.8 MB gradient goes up in buckets of --bucket-mb
(default 4 MB: five buckets), each pushed as soon as backward has produced
it, so sending overlaps the rest of backward; --no-overlap sends them all in
step(). The lines ending in "# ltpx" are what a single-process script
needs added. Each rank prints one JSON line at the end: test accuracy, a
digest of its parameters (equal on every worker), and iterations per second
(from the first step to the last, what docs/examples/bench_overlap.py compares).
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

import ltpx.torch as lt                                                  # ltpx

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--samples", type=int, default=4096, help="training examples")
p.add_argument("--batch", type=int, default=256, help="global batch (split over the workers)")
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--bucket-mb", type=float, default=4.0, help="gradient bucket size (MB)")
p.add_argument("--no-overlap", action="store_true", help="push every bucket in step()")
p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: all)")
a = p.parse_args()

lt.init()                                                                # ltpx
torch.set_num_threads(1)
IN, HIDDEN, OUT = 512, (2048, 1024, 1024), 10

g = torch.Generator().manual_seed(a.seed)
centres = torch.randn(OUT, IN, generator=g) * 0.3
y = torch.randint(0, OUT, (a.samples + 2000,), generator=g)
X = centres[y] + torch.randn(a.samples + 2000, IN, generator=g)
Xtr, ytr, Xte, yte = X[:a.samples], y[:a.samples], X[a.samples:], y[a.samples:]

torch.manual_seed(a.seed)
dims = (IN, *HIDDEN)
layers = [m for i, o in zip(dims, dims[1:]) for m in (torch.nn.Linear(i, o), torch.nn.ReLU())]
model = torch.nn.Sequential(*layers, torch.nn.Linear(dims[-1], OUT))
lt.broadcast_parameters(model.state_dict(), root_rank=0)                 # ltpx
opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
opt = lt.DistributedOptimizer(opt, named_parameters=model.named_parameters(),  # ltpx
                              bucket_mb=a.bucket_mb, overlap=not a.no_overlap)  # ltpx

order_gen = torch.Generator().manual_seed(a.seed + 1)
steps, losses, t0 = 0, [], None
for epoch in range(a.epochs):
    order = torch.randperm(a.samples, generator=order_gen)
    for i in range(0, a.samples - a.batch + 1, a.batch):
        idx = order[i:i + a.batch]
        idx = idx[lt.rank()::lt.size()]                                 # ltpx
        opt.zero_grad()
        loss = F.cross_entropy(model(Xtr[idx]), ytr[idx])
        loss.backward()
        opt.step()
        steps += 1
        t0 = t0 or time.perf_counter()      # from the end of the first step (set-up excluded)
        losses.append(loss.item())
        if steps == a.max_steps:
            break
    lt.report_progress(epoch + 1, a.epochs, loss=sum(losses[-10:]) / 10)  # ltpx (report)
    if steps == a.max_steps:
        break
wall = time.perf_counter() - t0

with torch.no_grad():
    accuracy = (model(Xte).argmax(1) == yte).float().mean().item()
result = {"event": "result", "accuracy": accuracy, "train_loss": sum(losses[-10:]) / 10,
          "steps": steps, "iterations_per_s": (steps - 1) / wall if steps > 1 else None,
          "params": sum(p.numel() for p in model.parameters())}
result.update(digest=lt.digest(model), buckets=list(opt.ltp.plan.sizes),       # ltpx (report)
              report=opt.last_report.to_dict(), times=opt.times())         # ltpx (report)
# one write (torchrun runs its ranks unbuffered on one stdout: print's
# two writes, text and newline, interleave with a neighbour's)
sys.stdout.write(json.dumps(result) + "\n")
lt.shutdown()                                                            # ltpx
