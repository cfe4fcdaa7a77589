# SPDX-License-Identifier: Apache-2.0
"""A DDP model whose backward makes a blocking all-reduce of its own (as
SyncBatchNorm's statistics do), under any backend.

    python tests/ddp_backward_job.py --backend ltp     (tests/ddp_local.py starts it)

The call is torch.distributed's Python API with async_op=False, in backward,
of one float tensor: the `ltp` backend must keep it exact (not a DDP bucket)
and must not let it wait on the step op that carries DDP's buckets. Each
trainer prints one JSON line: what the blocking calls returned, a digest of
the parameters and, over `ltp`, how the group's calls went.
"""
from __future__ import annotations

import argparse
import hashlib
import json

import torch
import torch.distributed as dist

import ltpx.torch  # noqa: F401  (registers the `ltp` backend)

SEEN: list[float] = []


class Synced(torch.autograd.Function):
    """Identity forward; backward sums a statistic of the gradient over the
    ranks with a blocking all-reduce and scales the gradient by it."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        stat = g.abs().mean().reshape(1).clone()
        dist.all_reduce(stat, op=dist.ReduceOp.SUM, async_op=False)
        SEEN.append(float(stat))
        return g / (1.0 + stat)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 64)
        self.b = torch.nn.Linear(64, 64)
        self.c = torch.nn.Linear(64, 4)

    def forward(self, x):
        return self.c(torch.tanh(self.b(Synced.apply(torch.tanh(self.a(x))))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="ltp")
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    dist.init_process_group(a.backend)
    rank = dist.get_rank()
    torch.manual_seed(0)
    # small buckets: the layers after Synced have sent theirs when it runs
    model = torch.nn.parallel.DistributedDataParallel(Net(), bucket_cap_mb=0.005)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1 + rank)
    for _ in range(a.steps):
        opt.zero_grad()
        model(torch.randn(8, 16, generator=gen)).pow(2).mean().backward()
        opt.step()
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().view(-1).view(torch.uint8).numpy().tobytes())
    print(json.dumps({"event": "result", "rank": rank, "seen": SEEN,
                      "digest": h.hexdigest()[:16],
                      "routes": dict(getattr(dist.group.WORLD, "routes", {}))}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
