# SPDX-License-Identifier: Apache-2.0
"""A stock FSDP2 script (`fully_shard`) over the `ltp` backend or gloo.

FSDP2 builds a DeviceMesh, which looks the process group up by its name, then
reduces gradients with `reduce_scatter_tensor` and gathers parameters with
`all_gather_into_tensor`. Over `ltp` both are exact (gloo's), so the result
is gloo's bit for bit; the loss-tolerant reduce-scatter is the next step
(docs/training.md, "FSDP2"). Each trainer prints one JSON line: its rank,
its last loss and a digest of the full parameters (equal on every rank).
"""
from __future__ import annotations

import argparse
import hashlib
import json

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="ltp")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    dist.init_process_group(args.backend)      # a server rank of `ltp` serves here, and exits
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    loss = torch.zeros(())
    for _ in range(args.steps):
        x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    h = hashlib.sha256()
    for k in sorted(full):
        h.update(full[k].detach().numpy().tobytes())
    # the `ltp` group counts how each collective went (ltp, tolerant, gloo)
    routes = dict(getattr(dist.group.WORLD, "routes", {}))
    print(json.dumps({"event": "result", "rank": rank, "world": dist.get_world_size(),
                      "backend": dist.get_backend(), "loss": float(loss.detach()),
                      "digest": h.hexdigest()[:16], "routes": routes}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
