# SPDX-License-Identifier: Apache-2.0
"""A stock DistributedDataParallel script; its one LTP line is the backend string.

    sudo ltp launch --workers 4 -- python docs/examples/ddp_backend.py
    sudo ltp launch --workers 4 --loss 0.05 -j -- python docs/examples/ddp_backend.py
    sudo ltp launch --workers 4 --servers 0 -- python docs/examples/ddp_backend.py --backend gloo
    sudo ltp launch --workers 4 -- python docs/examples/ddp_backend.py --hook

Plain torch.distributed otherwise: a DistributedSampler, gradient
accumulation with no_sync(), find_unused_parameters=True (one layer is
used only on odd steps: the first finds it unused, so torch does not
warn that nothing was), a metric all_reduce, broadcast_object_list and
all_gather_object. Under `--backend ltp` DDP's gradient buckets go over
LTP (Early Close, Bubble Filling); every other collective is exact.
`--hook` registers LTP's comm hook instead, to choose its options and read
its report. `--device cuda` trains on the GPU (each rank on
cuda:LOCAL_RANK). Each rank prints one JSON line at the end: accuracy, a
digest of the parameters (equal on every rank: the replicas are
bit-identical), the exact collectives' results.
"""
import argparse
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ltpx.torch as lt                   # registers the `ltp` backend (and the hook)

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--backend", default="ltp")
p.add_argument("--hook", action="store_true", help="LTP's comm hook, with bubble=zero")
p.add_argument("--epochs", type=int, default=8)
p.add_argument("--batch", type=int, default=16, help="per rank and micro-batch")
p.add_argument("--accumulate", type=int, default=2, help="micro-batches per step (no_sync)")
p.add_argument("--lr", type=float, default=0.2)
p.add_argument("--device", default="cpu")
p.add_argument("--seed", type=int, default=0)
p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
               help="the model's parameters (and so its gradients)")
a = p.parse_args()
if a.device == "cuda" and not torch.cuda.is_available():
    p.error("--device cuda: this machine has no CUDA device torch can use")

dist.init_process_group(a.backend)
rank, world = dist.get_rank(), dist.get_world_size()
# one GPU per local rank where there are enough; ranks share them round-robin where not
dev = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
       if a.device == "cuda" else torch.device("cpu"))
if dev.type == "cuda":
    torch.cuda.set_device(dev)
torch.set_num_threads(1)
torch.manual_seed(a.seed + rank)          # different on every rank: DDP broadcasts rank 0's

X, y = load_digits(return_X_y=True)
X, y = torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y)
perm = torch.randperm(len(X), generator=torch.Generator().manual_seed(a.seed))
test, train = perm[:360], perm[360:]
data = TensorDataset(X[train], y[train])
sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=a.seed)
loader = DataLoader(data, batch_size=a.batch, sampler=sampler, drop_last=True)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                        torch.nn.Linear(128, 64), torch.nn.ReLU())
        self.extra = torch.nn.Linear(64, 64)      # used on even steps only
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x, use_extra: bool):
        h = self.body(x)
        return self.head(torch.relu(self.extra(h)) if use_extra else h)


dtype = getattr(torch, a.dtype)
model = DDP(Net().to(dev, dtype), find_unused_parameters=True)
state = None
if a.hook:
    state = lt.ddp_state(bubble="zero")
    model.register_comm_hook(state, lt.ddp_hook)
opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)

steps, losses = 0, []
for epoch in range(a.epochs):
    sampler.set_epoch(epoch)
    batches = list(loader)
    for i in range(0, len(batches) - a.accumulate + 1, a.accumulate):
        opt.zero_grad()
        for j, (xb, yb) in enumerate(batches[i:i + a.accumulate]):
            last = j == a.accumulate - 1
            with (model.no_sync() if not last else torch.enable_grad()):
                out = model(xb.to(dev, dtype), steps % 2 == 1)
                loss = F.cross_entropy(out.float(), yb.to(dev))
                (loss / a.accumulate).backward()
        opt.step()
        steps += 1
        losses.append(loss.item())

net = model.module
with torch.no_grad():
    correct = (net(X[test].to(dev, dtype), True).argmax(1).cpu() == y[test]).sum()
# exact collectives: a metric sum, a max, an object from rank 0, everyone's object
total = torch.tensor([int(correct), len(test)], dtype=torch.int64, device=dev)
dist.all_reduce(total)
worst = torch.tensor([sum(losses[-5:]) / 5], device=dev)
dist.all_reduce(worst, op=dist.ReduceOp.MAX)
cfg = [{"epochs": a.epochs, "from": rank}] if rank == 0 else [None]
dist.broadcast_object_list(cfg, src=0)
ranks = [None] * world
dist.all_gather_object(ranks, {"rank": rank, "steps": steps})

h = hashlib.sha256()
for t in net.parameters():
    h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
result = {"event": "result", "rank": rank, "world": world, "backend": a.backend,
          "accuracy": total[0].item() / total[1].item(), "train_loss": sum(losses[-5:]) / 5,
          "worst_loss": worst.item(), "cfg": cfg[0], "ranks": ranks, "steps": steps,
          "digest": h.hexdigest()[:16], "device": str(dev)}
if state is not None:
    result["hook"] = state.stats()
# one write (torchrun runs its ranks unbuffered on one stdout: print's
# two writes, text and newline, interleave with a neighbour's)
sys.stdout.write(json.dumps(result) + "\n")
dist.destroy_process_group()
