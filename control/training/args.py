# SPDX-License-Identifier: Apache-2.0
"""The training flags `ltp train` and one rank (`python -m ltpx.control.training`) share:
declared once here, with one default each, checked and turned into a TrainConfig one way.

The flags of ltpx.torch settings among them (--cc, --downlink, --servers,
--compress, --sender, --max-missed) are made from the settings table
(control/settings_table.py), as are a rank's network flags. Each user adds
its own flags beside them: `ltp train` the rig's (--workers,
--rate, --loss, ...), a rank its network's (--dev, --ip, --group, ...).
Importing this module needs no torch, so both answer --help without it.
"""
from __future__ import annotations

import argparse
import math
import os

from ..settings_table import TABLE, TRAIN, add_flag
from .config import BUBBLES, DEFAULT_HIDDEN, LTP_TRANSPORTS, SYNCS, TRAIN_TRANSPORTS, TrainConfig

MAX_WIDTH = 65536   # widest hidden layer the flags accept


def add_train_flags(p: argparse.ArgumentParser) -> None:
    """Add the shared training flags to `p` (`ltp train` and the rank entry point)."""
    p.add_argument("--transport", choices=TRAIN_TRANSPORTS, default=TABLE["transport"].default,
                   help="gradient transport: ltp (ltpx.torch's parameter server, the "
                   "default), tcp (the same server over TCP), gloo (DDP all-reduce), ddp-ltp "
                   "(stock DDP over the `ltp` backend and its server)")
    p.add_argument("--sync", choices=SYNCS, default="bsp",
                   help="bsp: wait for every worker; wbsp: fast workers keep computing "
                   "while the slowest finishes (default %(default)s)")
    p.add_argument("--epochs", type=int, default=3,
                   help="passes over the training set (default %(default)s)")
    p.add_argument("--iterations", type=int, default=None,
                   help="train exactly this many iterations instead")
    p.add_argument("--batch", type=int, default=32,
                   help="examples per worker and local step (default %(default)s)")
    p.add_argument("--lr", type=float, default=0.1,
                   help="SGD learning rate (default %(default)s)")
    p.add_argument("--momentum", type=float, default=0.9,
                   help="SGD momentum (default %(default)s)")
    p.add_argument("--hidden", default=",".join(map(str, DEFAULT_HIDDEN)),
                   help="MLP hidden widths (default %(default)s: 234k parameters, a 0.94 MB "
                   "gradient; e.g. 2048,2048 for 4.3M)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of data split, model, batches (default %(default)s)")
    p.add_argument("--bubble", choices=BUBBLES, default="mean",
                   help="LTP Bubble Filling of lost chunks (default %(default)s)")
    p.add_argument("--straggler", action="append", metavar="WORKER:FACTOR",
                   help="slow WORKER's compute by FACTOR, e.g. 1:3 (repeatable)")
    add_flag(p, "cc", TRAIN)
    add_flag(p, "downlink", TRAIN)
    add_flag(p, "loss_policy", TRAIN)
    add_flag(p, "loss_budget", TRAIN)
    p.add_argument("--eval-every", type=int, default=0,
                   help="evaluate every N iterations (default: at each epoch's end)")
    p.add_argument("--target-accuracy", type=float, default=None,
                   help="report the training time until the test accuracy reaches this")
    p.add_argument("--deadline-min", type=float, default=None,
                   help="LTP Early Close minimum deadline, seconds (default: the transport's)")
    add_flag(p, "servers", TRAIN)
    add_flag(p, "compress", TRAIN)
    add_flag(p, "sender", TRAIN)
    add_flag(p, "max_missed", TRAIN)
    add_flag(p, "trace", TRAIN)
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="worker 0 saves model and optimizer every N steps to "
                   "--checkpoint-dir; a job started again resumes from the newest (default: "
                   "never)")
    p.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                   help="where checkpoints go and are resumed from")
    p.add_argument("--pace", type=float, default=0.0, metavar="S",
                   help="make every step take at least S seconds (a job long enough to watch, "
                   "or to kill a rank of and see it rejoin; default 0)")
    p.add_argument("--verify-versions", action="store_true",
                   help="hash every parameter version on every rank and compare "
                   "(costs ~1 ms/MB each)")


def parse_straggler(items: list[str] | None) -> dict[int, float]:
    """['1:3', '2:1.5'] -> {1: 3.0, 2: 1.5}; ValueError names the bad item."""
    out: dict[int, float] = {}
    for item in items or []:
        w, sep, f = item.partition(":")
        try:
            if not sep:
                raise ValueError
            wid, factor = int(w), float(f)
        except ValueError:
            raise ValueError(f"--straggler: {item!r} is not WORKER:FACTOR (e.g. 1:3)") from None
        if wid < 0 or not factor >= 1.0:
            raise ValueError(f"--straggler: {item!r}: worker must be >= 0 and factor >= 1")
        out[wid] = factor
    return out


def parse_hidden(text: str) -> tuple[int, ...]:
    """'512,384' -> (512, 384); ValueError names the flag."""
    try:
        hidden = tuple(int(x) for x in text.split(","))
        if not hidden or min(hidden) < 1 or max(hidden) > MAX_WIDTH:
            raise ValueError
    except ValueError:
        raise ValueError(f"--hidden: {text!r} must be comma-separated widths in "
                         f"1..{MAX_WIDTH}, e.g. 512,384") from None
    return hidden


def check_train_flags(a: argparse.Namespace) -> None:
    """Raise ValueError naming the flag for a shared flag's value out of range."""
    if a.epochs < 1:
        raise ValueError(f"--epochs: must be at least 1, got {a.epochs}")
    if a.iterations is not None and a.iterations < 1:
        raise ValueError(f"--iterations: must be at least 1, got {a.iterations}")
    if a.batch < 1:
        raise ValueError(f"--batch: must be at least 1, got {a.batch}")
    if not 0 < a.lr < math.inf:   # nan fails both
        raise ValueError(f"--lr: must be a finite number > 0, got {a.lr}")
    if not 0 <= a.momentum < math.inf:
        raise ValueError(f"--momentum: must be a finite number >= 0, got {a.momentum}")
    if a.eval_every < 0:
        raise ValueError(f"--eval-every: must be >= 0, got {a.eval_every}")
    if a.target_accuracy is not None and not 0 < a.target_accuracy <= 1:
        raise ValueError(f"--target-accuracy: must be in (0, 1], got {a.target_accuracy}")
    if a.deadline_min is not None and not 0 < a.deadline_min < math.inf:
        raise ValueError(f"--deadline-min: must be a finite number of seconds > 0, "
                         f"got {a.deadline_min}")


def config_from_args(a: argparse.Namespace, *, transport: str | None = None,
                     cc: str | None = None) -> TrainConfig:
    """The TrainConfig the shared flags ask for (`transport`, `cc`: another run of
    `ltp train --compare`); ValueError names the flag. Only LTP has a group
    downlink: the other transports' configs say unicast, whatever --downlink is."""
    check_train_flags(a)
    transport = transport or a.transport
    cfg = TrainConfig(transport=transport, sync=a.sync, epochs=a.epochs,
                      iterations=a.iterations, batch=a.batch, lr=a.lr, momentum=a.momentum,
                      hidden=parse_hidden(a.hidden), seed=a.seed, bubble=a.bubble,
                      straggler=parse_straggler(a.straggler), eval_every=a.eval_every,
                      target_accuracy=a.target_accuracy, cc=cc or a.cc,
                      verify_versions=a.verify_versions,
                      downlink=a.downlink if transport in LTP_TRANSPORTS else "unicast",
                      loss_policy=a.loss_policy if transport in LTP_TRANSPORTS
                      else TABLE["loss_policy"].default,
                      loss_budget=a.loss_budget if transport in LTP_TRANSPORTS
                      else TABLE["loss_budget"].default,
                      servers=a.servers if transport != "gloo" else TABLE["servers"].default,
                      compress=a.compress if transport != "gloo" else TABLE["compress"].default,
                      sender=a.sender if transport in LTP_TRANSPORTS
                      else TABLE["sender"].default,
                      max_missed=a.max_missed, checkpoint_every=a.checkpoint_every,
                      trace=a.trace,
                      checkpoint_dir=os.path.abspath(a.checkpoint_dir) if a.checkpoint_dir
                      else None, pace_s=max(0.0, a.pace))
    try:
        cfg.validate()
    except ValueError as e:     # its messages start with the field: make that the flag
        raise ValueError(f"--{e}") from None
    return cfg
