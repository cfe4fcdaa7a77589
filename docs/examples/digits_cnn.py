# SPDX-License-Identifier: Apache-2.0
"""A small CNN on scikit-learn's handwritten digits, trained over LTP with ltpx.torch.

    sudo ltp launch --workers 4 -- python docs/examples/digits_cnn.py
    sudo ltp launch --workers 4 --loss 0.01 -j -- python docs/examples/digits_cnn.py --epochs 12

The lines ending in "# ltpx" are all that was added to the single-process
script (delete them and it runs alone: `python digits_cnn.py`). Every worker
takes its share of the same global batch, so with nothing lost the workers'
mean gradient is the single-process gradient of that batch; "# ltpx (report)"
lines only print what the test and `ltp launch -j` read. Each rank prints one
JSON line at the end: test accuracy, final train loss, a digest of the
parameters (equal on every worker: the replicas are bit-identical).
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import ltpx.torch as lt                                                  # ltpx

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--epochs", type=int, default=8)
p.add_argument("--batch", type=int, default=64, help="global batch (split over the workers)")
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--seed", type=int, default=0)
a = p.parse_args()

lt.init()                                                                # ltpx
torch.set_num_threads(1)
torch.manual_seed(a.seed)
X, y = load_digits(return_X_y=True)
X = torch.tensor(X / 16.0, dtype=torch.float32).reshape(-1, 1, 8, 8)
y = torch.tensor(y)
perm = torch.randperm(len(X), generator=torch.Generator().manual_seed(a.seed))
test, train = perm[:360], perm[360:]

model = torch.nn.Sequential(
    torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
    torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
    torch.nn.Flatten(), torch.nn.Linear(32 * 4 * 4, 64), torch.nn.ReLU(),
    torch.nn.Linear(64, 10))
lt.broadcast_parameters(model.state_dict(), root_rank=0)                 # ltpx
opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
opt = lt.DistributedOptimizer(opt, named_parameters=model.named_parameters())  # ltpx

order_gen = torch.Generator().manual_seed(a.seed + 1)
steps, losses = 0, []
for epoch in range(a.epochs):
    order = train[torch.randperm(len(train), generator=order_gen)]
    for i in range(0, len(order) - a.batch + 1, a.batch):
        idx = order[i:i + a.batch]
        idx = idx[lt.rank()::lt.size()]                                 # ltpx
        opt.zero_grad()
        loss = F.cross_entropy(model(X[idx]), y[idx])
        loss.backward()
        opt.step()
        steps += 1
        losses.append(loss.item())
    lt.report_progress(epoch + 1, a.epochs, loss=sum(losses[-10:]) / 10)  # ltpx (report)

with torch.no_grad():
    accuracy = (model(X[test]).argmax(1) == y[test]).float().mean().item()
result = {"event": "result", "accuracy": accuracy, "train_loss": sum(losses[-10:]) / 10,
          "steps": steps}
result.update(digest=lt.digest(model), report=opt.last_report.to_dict())  # ltpx (report)
# one write (torchrun runs its ranks unbuffered on one stdout: print's
# two writes, text and newline, interleave with a neighbour's)
sys.stdout.write(json.dumps(result) + "\n")
lt.shutdown()                                                            # ltpx
