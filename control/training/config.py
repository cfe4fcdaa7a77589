# SPDX-License-Identifier: Apache-2.0
"""What to train and how: `TrainConfig`, the same on every rank, and its choices.

Importing this module needs neither torch nor numpy, so the flag parsers that
build a TrainConfig (args.py) answer --help at once, and on a host without torch.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from ..settings_table import COMPRESS, DOWNLINKS, EXACT_COMPRESS, MAX_SERVERS, SENDERS, TABLE



@dataclass(frozen=True)
class Can:
    """What a training transport takes beyond the defaults (CAPABILITIES)."""

    servers: bool       # more than one server rank (gloo's all-reduce has none)
    compress: bool      # gradients coded on the wire (gloo's all-reduce sends float32)
    clock: bool         # the ACK clock's sender (sender=xdp): LTP's XDP path
    early_close: bool   # a loss budget, tolerant answers (loss_policy defer): LTP's rounds
    group: bool         # the answer sent once to a group address (downlink group): LTP's
    wbsp: bool          # straggler-tolerant sync: a parameter server's own API, not DDP


# The one table of what each transport of `ltp train` allows; TrainConfig.validate
# is its one reader (every run of `ltp train`, --compare items too, is a checked config).
CAPABILITIES = {
    "ltp": Can(servers=True, compress=True, clock=True, early_close=True, group=True, wbsp=True),
    "tcp": Can(servers=True, compress=True, clock=False, early_close=False, group=False,
               wbsp=True),
    "gloo": Can(servers=False, compress=False, clock=False, early_close=False, group=False,
                wbsp=False),
    "ddp-ltp": Can(servers=True, compress=True, clock=True, early_close=True, group=True,
                   wbsp=False),
}
TRAIN_TRANSPORTS = tuple(CAPABILITIES)
# over LTP's XDP path: the parameter server's own API, or stock DDP over the `ltp` backend
LTP_TRANSPORTS = tuple(t for t, c in CAPABILITIES.items() if c.early_close)
# every rank a DDP trainer (gloo's all-reduce, or the `ltp` backend with its server ranks)
DDP_TRANSPORTS = ("gloo", "ddp-ltp")
SYNCS = ("bsp", "wbsp")
BUBBLES = ("mean", "zero", "stale")
DEFAULT_HIDDEN = (512, 384)   # 234,122 parameters: a 0.94 MB gradient
# LTP's parameter downlink unless told otherwise (flags and TrainConfig alike):
# one packet per chunk for all workers; the PS finds the address (rank.py)
DEFAULT_DOWNLINK = TABLE["downlink"].default


def iterations_per_epoch(ntrain: int, workers: int, batch: int) -> int:
    """Global iterations per epoch: one pass over the training set at
    `workers` x `batch` examples per iteration (at least one)."""
    return max(1, ntrain // (workers * batch))


@dataclass
class TrainConfig:
    """What to train and how; the same on every rank."""

    transport: str = "ltp"
    sync: str = "bsp"
    epochs: int = 3
    iterations: int | None = None       # overrides epochs (e.g. "a few steps")
    batch: int = 32                     # per worker and local step
    lr: float = 0.1
    momentum: float = 0.9
    hidden: tuple[int, ...] = DEFAULT_HIDDEN
    seed: int = 0
    bubble: str = "mean"
    straggler: dict[int, float] = field(default_factory=dict)   # worker id -> factor
    eval_every: int = 0                 # iterations; 0: at epoch ends only
    target_accuracy: float | None = None
    cc: str = TABLE["cc"].default
    verify_versions: bool = False       # hash every parameter version on every rank
    # The parameter downlink: each chunk once to a broadcast/multicast address
    # ("group", LTP only), or to each worker ("unicast"). None: DEFAULT_DOWNLINK
    # for LTP, unicast for the others (they have no group sends).
    downlink: str | None = None
    # these seven are ltpx.torch settings: the settings table says what they mean
    loss_policy: str = TABLE["loss_policy"].default
    loss_budget: float = TABLE["loss_budget"].default
    servers: int = TABLE["servers"].default
    compress: str = TABLE["compress"].default
    sender: str = TABLE["sender"].default
    max_missed: int = TABLE["max_missed"].default
    trace: str | None = None            # the lead writes the job's trace here (FILE.json)
    # worker 0 checkpoints every N steps to the folder, a new job resumes from it
    checkpoint_every: int = 0
    checkpoint_dir: str | None = None
    pace_s: float = 0.0                 # at least this many seconds per step (a job to watch)

    def __post_init__(self):
        if self.downlink is None:
            self.downlink = DEFAULT_DOWNLINK if self.transport in LTP_TRANSPORTS else "unicast"

    def validate(self) -> None:
        """Raise ValueError naming the field when the combination cannot run
        (what each transport allows: CAPABILITIES)."""
        if self.transport not in CAPABILITIES:
            raise ValueError(f"transport: one of {', '.join(TRAIN_TRANSPORTS)}, got "
                             f"{self.transport!r}")
        can = CAPABILITIES[self.transport]
        if self.sync not in SYNCS:
            raise ValueError(f"sync: one of {', '.join(SYNCS)}, got {self.sync!r}")
        if self.sync == "wbsp" and not can.wbsp:
            raise ValueError(f"sync: wbsp needs a parameter server's own API (transport ltp "
                             f"or tcp); {self.transport} is DDP, bsp only")
        if self.epochs < 1 or (self.iterations is not None and self.iterations < 1):
            raise ValueError(f"epochs/iterations: must be at least 1, got {self.epochs}/"
                             f"{self.iterations}")
        if self.batch < 1:
            raise ValueError(f"batch: must be at least 1, got {self.batch}")
        if not 0 < self.lr < math.inf or not 0 <= self.momentum < math.inf:   # nan fails too
            raise ValueError(f"lr, momentum: finite, lr > 0 and momentum >= 0, got "
                             f"{self.lr}, {self.momentum}")
        if not self.hidden or any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden: layer widths must be positive, got {self.hidden}")
        if self.downlink not in DOWNLINKS:
            raise ValueError(f"downlink: one of {', '.join(DOWNLINKS)}, got {self.downlink!r}")
        if self.downlink == "group" and not can.group:
            raise ValueError("downlink: group sends need the ltp transport")
        if TABLE["servers"].problem(self.servers) or (self.servers > 1 and not can.servers):
            raise ValueError(f"servers: 1..{MAX_SERVERS} server ranks (ltp, tcp or ddp-ltp; "
                             f"gloo's all-reduce has none), got {self.servers}")
        if self.compress not in COMPRESS or (self.compress not in EXACT_COMPRESS and not can.compress):
            raise ValueError(f"compress: one of {', '.join(COMPRESS)} (ltp, tcp or ddp-ltp; "
                             f"gloo's all-reduce sends float32), got {self.compress!r}")
        if self.sender not in SENDERS or (self.sender == "xdp" and not can.clock):
            raise ValueError(f"sender: one of {', '.join(SENDERS)} (xdp, the ACK clock: ltp, "
                             f"ddp-ltp), got {self.sender!r}")
        if self.loss_policy not in TABLE["loss_policy"].choices or (
                self.loss_policy == "defer" and (not can.early_close
                                                 or self.compress not in EXACT_COMPRESS)):
            raise ValueError(f"loss-policy: one of {', '.join(TABLE['loss_policy'].choices)}"
                             f" (defer: ltp or ddp-ltp, with compress none or auto), got "
                             f"{self.loss_policy!r}")
        bad = TABLE["loss_budget"].problem(self.loss_budget)
        if bad:
            raise ValueError(f"loss-budget: {bad}")
        if self.loss_budget and not can.early_close:
            raise ValueError(f"loss-budget: Early Close is LTP's (ltp, ddp-ltp), got "
                             f"{self.loss_budget} for {self.transport}")
        if self.max_missed < 1 or self.checkpoint_every < 0:
            raise ValueError("max-missed: must be at least 1 (and checkpoint-every >= 0)")
        if self.checkpoint_every and not self.checkpoint_dir:
            raise ValueError("checkpoint-every: needs --checkpoint-dir")
        for w, f in self.straggler.items():
            if f < 1:
                raise ValueError(f"straggler: factor for worker {w} must be >= 1, got {f}")

    def total_iterations(self, ntrain: int, workers: int) -> int:
        if self.iterations is not None:
            return self.iterations
        return self.epochs * iterations_per_epoch(ntrain, workers, self.batch)

    def to_json(self) -> str:
        d = asdict(self)
        d["straggler"] = {str(k): v for k, v in self.straggler.items()}
        return json.dumps(d)

    @classmethod
    def from_json(cls, s: str) -> TrainConfig:
        d = json.loads(s)
        d["hidden"] = tuple(d["hidden"])
        d["straggler"] = {int(k): float(v) for k, v in d.get("straggler", {}).items()}
        return cls(**d)
