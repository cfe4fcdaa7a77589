# SPDX-License-Identifier: Apache-2.0
"""A stock FSDP2 script (`fully_shard`); its one LTP line is the backend string.

    sudo ltp launch --workers 4 -- python docs/examples/fsdp2.py
    sudo ltp launch --workers 4 --loss 0.01 -j -- python docs/examples/fsdp2.py
    sudo ltp launch --workers 4 --servers 0 -- python docs/examples/fsdp2.py --backend gloo
    python tests/gpu/test_fsdp_gpu.py      (a GPU machine: the same on cuda, over loopback)

An MLP on scikit-learn's digits, each Linear layer and the whole model
wrapped with `fully_shard`, trained with SGD. Under `--backend ltp` FSDP2's
gradient reduce-scatters go over LTP's loss-tolerant class (Early Close,
Bubble Filling) and its parameter all-gathers over LTP's reliable class;
nothing goes to gloo. Each rank prints one JSON line at the end: the test
accuracy, iterations per second of the training loop, a digest of the full
parameters (equal on every rank), and how the `ltp` group's calls went.
"""
import argparse
import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.distributed.fsdp import fully_shard

import ltpx.torch  # noqa: F401  (registers the `ltp` backend)

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--backend", default="ltp")
p.add_argument("--iterations", type=int, default=150)
p.add_argument("--hidden", default="512,384", help="hidden widths (2048,2048: 4.35M parameters)")
p.add_argument("--batch", type=int, default=32, help="per rank")
p.add_argument("--lr", type=float, default=0.1)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--device", default="cpu", help="cpu, or cuda (each rank on cuda:LOCAL_RANK)")
a = p.parse_args()
if a.device == "cuda" and not torch.cuda.is_available():
    p.error("--device cuda: this machine has no CUDA device torch can use")

dist.init_process_group(a.backend)      # a server rank of `ltp` serves here, and exits
rank, world = dist.get_rank(), dist.get_world_size()
# one GPU per local rank where there are enough; ranks share them round-robin where not
dev = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
       if a.device == "cuda" else torch.device("cpu"))
if dev.type == "cuda":
    torch.cuda.set_device(dev)
torch.set_num_threads(1)
X, y = load_digits(return_X_y=True)
X, y = torch.tensor(X / 16.0, dtype=torch.float32, device=dev), torch.tensor(y, device=dev)
perm = torch.randperm(len(X), generator=torch.Generator().manual_seed(a.seed))
test, train = perm[:360], perm[360:]
mine = train[rank::world]

torch.manual_seed(a.seed)               # the same initial model on every rank
widths = [64, *(int(w) for w in a.hidden.split(",")), 10]
layers = []
for i in range(len(widths) - 1):
    layers += [torch.nn.Linear(widths[i], widths[i + 1]), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers[:-1]).to(dev)
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
gen = torch.Generator().manual_seed(a.seed + 1 + rank)

dist.barrier()
t0 = time.perf_counter()
for _ in range(a.iterations):
    idx = mine[torch.randint(len(mine), (a.batch,), generator=gen)].to(dev)
    loss = F.cross_entropy(model(X[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
wall = time.perf_counter() - t0

with torch.no_grad():
    correct = (model(X[test]).argmax(1) == y[test]).float().mean().item()
full = {k: v.full_tensor() for k, v in model.state_dict().items()}
h = hashlib.sha256()
for k in sorted(full):
    h.update(full[k].detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
res = json.dumps({"event": "result", "rank": rank, "world": world, "backend": a.backend,
                  "device": str(dev),
                  "accuracy": correct, "iterations_per_s": a.iterations / wall,
                  "wall_s": wall, "train_loss": loss.item(), "digest": h.hexdigest()[:16],
                  "routes": dict(getattr(dist.group.WORLD, "routes", {}))})
# one write (torchrun runs its ranks unbuffered on one stdout: print's
# two writes, text and newline, interleave with a neighbour's)
sys.stdout.write(res + "\n")
sys.stdout.flush()
dist.destroy_process_group()
