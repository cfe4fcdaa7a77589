"""The job's sequence of operations, the same on every rank: what each op
sends, which LTP rounds it uses, and the report a step's answer carries.

Every worker runs the same ops in the same order (steps of one optimizer,
broadcasts, all-reduces, the shutdown), so each side numbers rounds alone:
op s answers on downlink round s; an op with k uplink pieces takes the next
k uplink rounds (the first is 1). The last worker to arrive at op s's
barrier stores the op's description as the value of `go/<s>`; the server
reads it there and needs no model of its own.

A step's answer is the aggregate gradient followed by a `StepReport` as
float32 words (`REPORT_WORDS` + 4 per worker + 1 per bucket), so every
worker learns what happened to the round at no extra cost.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

STEP, BROADCAST, ALLREDUCE, SHUTDOWN = "step", "broadcast", "allreduce", "shutdown"
KINDS = (STEP, BROADCAST, ALLREDUCE, SHUTDOWN)
REASONS = ("complete", "early", "deadline", "timeout")   # a round's close, worst last
REPORT_MAGIC = 0x1CE
REPORT_WORDS = 4            # magic, step, buckets, workers; then the per-bucket and per-worker words


@dataclass(frozen=True)
class Op:
    """One operation of the job, as every rank sees it."""

    kind: str
    sizes: tuple[int, ...] = ()     # float32 elements of each uplink round (a step: per bucket)
    root: int | None = None         # broadcast: the worker whose data everyone gets
    sync: str = "bsp"               # a step's: bsp | wbsp
    bubble: str = "mean"            # a step's Bubble Filling
    early_close: str = "{}"         # a step's EarlyCloseConfig fields, as sorted JSON
    average: bool = True            # all-reduce: mean (else sum)
    downlink: str = "group"         # the answer: once to the group address, or per worker

    @property
    def reliable(self) -> bool:
        """Uplink class: a step's gradients are tolerable, anything else reliable."""
        return self.kind != STEP

    def participants(self, workers: int) -> list[int]:
        return [self.root] if self.kind == BROADCAST else list(range(workers))

    def down_elems(self, workers: int) -> int:
        """Elements of the answer (downlink round): the result, plus a step's report."""
        tail = report_words(len(self.sizes), workers) if self.kind == STEP else 0
        return sum(self.sizes) + tail

    def max_elems(self, workers: int) -> int:
        """The largest round this op sends: what an endpoint must hold."""
        return max([self.down_elems(workers), *self.sizes])

    def offsets(self) -> list[int]:
        """Where each uplink piece starts in the answer."""
        return [int(x) for x in np.cumsum((0,) + self.sizes[:-1])] if self.sizes else []

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> "Op":
        d = json.loads(text)
        d["sizes"] = tuple(d["sizes"])
        if d.get("kind") not in KINDS:
            raise ValueError(f"unknown op {d.get('kind')!r}")
        return cls(**d)


def preopened(prev: Op | None, op: Op) -> int:
    """How many of op's uplink rounds the server opened before op's barrier.

    After a step the server opens the first two rounds of the same step again
    (the likely next op), so data can flow the moment the barrier lifts; any
    other op's rounds are opened after it and announced through the store."""
    if op.kind == STEP and prev == op:
        return min(2, len(op.sizes))
    return 0


class RoundClock:
    """Op and uplink round numbers, advanced alike on every rank."""

    def __init__(self):
        self.seq = 0     # the next op; its answer is downlink round `seq`
        self.up = 1      # the next uplink round

    def rounds(self, op: Op) -> list[int]:
        return list(range(self.up, self.up + len(op.sizes)))

    def advance(self, op: Op) -> None:
        self.seq += 1
        self.up += len(op.sizes)


def report_words(buckets: int, workers: int) -> int:
    return REPORT_WORDS + buckets + 4 * workers + 1


@dataclass
class StepReport:
    """What happened to one optimizer step's gradients (`opt.last_report`).

    delivered: per worker, the fraction of its gradient chunks that arrived;
    filled_chunks: per worker, the chunks Bubble Filling wrote instead;
    wholly_filled: per worker, the buckets of this step it delivered nothing
    of (its whole contribution there was filled); ks: gradients averaged per
    worker (wbsp: more for fast workers); reasons: how each bucket's round
    closed (complete | early | deadline | timeout)."""

    step: int
    reasons: list[str]
    delivered: dict[int, float]
    filled_chunks: dict[int, int]
    wholly_filled: dict[int, int]
    ks: list[int]
    gather_s: float
    wholly_filled_total: int = 0       # this worker's count of such events over the job
    extra: dict = field(default_factory=dict)

    @property
    def early_closed(self) -> bool:
        return any(r in ("early", "deadline") for r in self.reasons)

    @property
    def reason(self) -> str:
        """The step's worst round close."""
        return max(self.reasons, key=REASONS.index) if self.reasons else "complete"

    @property
    def missing_workers(self) -> list[int]:
        return sorted(w for w, n in self.wholly_filled.items() if n)

    @property
    def delivered_fraction(self) -> float:
        return float(np.mean(list(self.delivered.values()))) if self.delivered else 1.0

    def to_dict(self) -> dict:
        return {"step": self.step, "reason": self.reason, "reasons": self.reasons,
                "early_closed": self.early_closed,
                "delivered_fraction": round(self.delivered_fraction, 6),
                "delivered": {str(w): round(v, 6) for w, v in self.delivered.items()},
                "filled_chunks": {str(w): v for w, v in self.filled_chunks.items()},
                "missing_workers": self.missing_workers,
                "wholly_filled": {str(w): v for w, v in self.wholly_filled.items()},
                "wholly_filled_total": self.wholly_filled_total, "ks": self.ks,
                "gather_s": round(self.gather_s, 6)}

    def encode(self, out: np.ndarray) -> None:
        """Write the report into `out` (float32 [report_words(B, W)])."""
        W, B = len(self.delivered), len(self.reasons)
        ids = sorted(self.delivered)
        words = [REPORT_MAGIC, self.step, B, W, *(REASONS.index(r) for r in self.reasons),
                 *(self.delivered[w] for w in ids), *(self.filled_chunks[w] for w in ids),
                 *(self.wholly_filled[w] for w in ids), *self.ks, self.gather_s]
        out[:] = np.asarray(words, dtype=np.float32)

    @classmethod
    def decode(cls, words: np.ndarray) -> "StepReport":
        w = [float(x) for x in words]
        if int(w[0]) != REPORT_MAGIC:
            raise ValueError("the answer carries no step report (server and worker disagree "
                             "on the op)")
        step, B, W = int(w[1]), int(w[2]), int(w[3])
        i = REPORT_WORDS
        reasons = [REASONS[int(x)] for x in w[i:i + B]]
        i += B
        per = [w[i + k * W:i + (k + 1) * W] for k in range(4)]
        return cls(step=step, reasons=reasons,
                   delivered={k: per[0][k] for k in range(W)},
                   filled_chunks={k: int(per[1][k]) for k in range(W)},
                   wholly_filled={k: int(per[2][k]) for k in range(W)},
                   ks=[int(x) for x in per[3]], gather_s=w[i + 4 * W])
