# SPDX-License-Identifier: Apache-2.0
"""A stock Hugging Face Accelerate script, trained with DDP over the `ltp`
backend (or gloo).

On the CPU Accelerate takes the backend it is given only if the process
group already exists (`Accelerator()` would start gloo's, and an
`InitProcessGroupKwargs(backend="ltp")` is refused with a ValueError), so
the script makes it first: `dist.init_process_group("ltp")`, then
`Accelerator(cpu=True)`, which adopts it (docs/training.md, "Accelerate").
On CUDA `InitProcessGroupKwargs(backend="ltp")` works as well. Run by a
launcher that sets torchrun's variables (`ltp launch`, torchrun,
tests/ddp_local.py). Each trainer prints one JSON line: its rank, the test
accuracy, the loss reduced over the ranks (`accelerator.reduce`, exact),
and a digest of its parameters (equal on every rank).
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json

import torch
import torch.distributed as dist
import torch.nn.functional as F
from accelerate import Accelerator
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="ltp")
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    dist.init_process_group(args.backend)      # a server rank of `ltp` serves here, and exits
    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.long)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(TensorDataset(x[:1400], y[:1400]), batch_size=32, shuffle=True)
    model, opt, loader = acc.prepare(model, opt, loader)
    loss = torch.zeros(())
    for _ in range(args.epochs):
        for xb, yb in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            acc.backward(loss)
            opt.step()
    mean_loss = acc.reduce(loss.detach(), reduction="mean")
    net = acc.unwrap_model(model)
    with torch.no_grad():
        accuracy = float((net(x[1400:]).argmax(1) == y[1400:]).float().mean())
    h = hashlib.sha256()
    for p in net.parameters():
        h.update(p.detach().numpy().tobytes())
    print(json.dumps({"event": "result", "rank": acc.process_index, "world": acc.num_processes,
                      "backend": dist.get_backend(), "accuracy": accuracy,
                      "loss": float(mean_loss), "digest": h.hexdigest()[:16]}), flush=True)
    # the DDP model (its reducer holds the group) goes before the group: a
    # gloo group freed last, at the interpreter's exit, can hang joining its
    # threads (seen over gloo alone, about one run in ten on 2 busy cores)
    del model, opt, loader, net
    acc.free_memory()
    gc.collect()
    acc.end_training()


if __name__ == "__main__":
    main()
