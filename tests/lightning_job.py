# SPDX-License-Identifier: Apache-2.0
"""A stock PyTorch Lightning script, trained with DDP over the `ltp` backend
(or gloo): `Trainer(strategy=DDPStrategy(process_group_backend="ltp"))`.

Nothing LTP-specific but the backend's name (the `ltp` backend registers at
torch's import: no `import ltpx.torch`). Run by a launcher that sets
torchrun's variables (`ltp launch`, torchrun, tests/ddp_local.py): Lightning
takes the ranks from them. Devices and nodes follow LOCAL_WORLD_SIZE and
WORLD_SIZE (one rank per rig host under `ltp launch`: devices=1, one node
each). Each trainer prints one JSON line: its rank, the test accuracy, the
logged mean of the training loss (a sync_dist all-reduce, AVG) and a
digest of its parameters (equal on every rank: the replicas are
bit-identical).
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.strategies import DDPStrategy
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset


def digits():
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.long)
    return TensorDataset(x[:1400], y[:1400]), (x[1400:], y[1400:])


class Digits(pl.LightningModule):
    def __init__(self, lr: float):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                       torch.nn.Linear(128, 10))
        self.lr = lr

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, _):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="ltp")
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    train, (xt, yt) = digits()
    model = Digits(lr=0.05)
    trainer = pl.Trainer(accelerator="cpu", devices=devices, num_nodes=world // devices,
                         strategy=DDPStrategy(process_group_backend=args.backend),
                         max_epochs=args.epochs, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         deterministic=True)
    trainer.fit(model, DataLoader(train, batch_size=32, shuffle=True))
    with torch.no_grad():
        acc = float((model(xt).argmax(1) == yt).float().mean())
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    print(json.dumps({"event": "result", "rank": trainer.global_rank, "world": trainer.world_size,
                      "backend": torch.distributed.get_backend() if
                      torch.distributed.is_initialized() else None,
                      "accuracy": acc,
                      "train_loss": float(trainer.callback_metrics["train_loss"]),
                      "digest": h.hexdigest()[:16]}), flush=True)
    # the DDP model (its reducer holds the group) goes before the group, which
    # Lightning leaves to the interpreter's exit (where a gloo group can hang
    # joining its threads): the script ends it, as a torchrun script would
    del trainer, model
    gc.collect()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
