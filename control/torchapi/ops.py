# SPDX-License-Identifier: Apache-2.0
"""The job's sequence of operations, the same on every rank: what each op
sends, which LTP rounds it uses, and the report a step's answer carries.

Every worker runs the same ops in the same order (steps of one optimizer,
broadcasts, all-reduces, gathers, the shutdown), so each side numbers rounds alone:
op s answers on downlink round s; an op with k uplink pieces takes the next
k uplink rounds (the first is 1). The last worker to arrive at op s's
barrier stores the op's description as the value of `go/<s>`; the server
reads it there and needs no model of its own.

A step's answer is the aggregate gradient followed by a `StepReport` as
float32 words (`REPORT_WORDS` + 7 per worker + 1 per bucket + 7), so every
worker learns what happened to the round at no extra cost, membership
changes included (`status`: a worker dropped after too many missed steps, or
admitted back with its join ticket).

Membership (`Members`, kept alike by every rank): the workers of the job
(`members`) and those of them the last barrier went on without (`absent`:
dead, or late past the server's patience). A step's rounds include every
member, absent ones too, until the server drops one (`--max-missed`); other
ops include the members present. Each op's barrier value (`Go`) carries the
absent set; each step's report carries the drops and admissions.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

from .losspolicy import WHY, Choice

STEP, BROADCAST, ALLREDUCE, SHUTDOWN = "step", "broadcast", "allreduce", "shutdown"
ALLGATHER = "allgather"   # every worker's piece, by worker id: the answer holds a row per worker
KINDS = (STEP, BROADCAST, ALLREDUCE, ALLGATHER, SHUTDOWN)
REASONS = ("complete", "early", "deadline", "timeout")   # a round's close, worst last
REPORT_MAGIC = 0x1CE
REPORT_WORDS = 4            # magic, step, buckets, workers; then the per-bucket and per-worker words
PER_WORKER = 7              # delivered, filled, wholly filled, k, status, non-finite, lateness
DROPPED = -1                # status: no longer a member (missed --max-missed steps, or gone)


WIRES = ("none", "uint8", "bf16", "fp16")   # what a step's gradients travel as (Op.wire)


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
    wire: str = "none"              # a step's gradients and aggregate as: none (float32),
                                    # uint8, bf16, fp16 (codec.py; codec.wire_for)
    carry: bool = False             # the wire is the loss policy's for float32 gradients
                                    # (losspolicy.py): each side carries its rounding on

    def differs(self, other: Op) -> list[str]:
        """The fields where `other` (another rank's view of this op) differs,
        as `field: mine vs theirs`; [] when the ranks agree."""
        return [f"{k}: {v!r} here, {getattr(other, k)!r} in the barrier's"
                for k, v in asdict(self).items() if v != getattr(other, k)]

    @property
    def reliable(self) -> bool:
        """Uplink class: a step's gradients are tolerable, anything else reliable."""
        return self.kind != STEP

    def participants(self, workers: int) -> list[int]:
        return [self.root] if self.kind == BROADCAST else list(range(workers))

    def down_elems(self, workers: int) -> int:
        """Elements of the answer (downlink round): the result, plus a step's report."""
        tail = report_words(len(self.sizes), workers) if self.kind == STEP else 0
        return sum(self.answer_width(i, workers) for i in range(len(self.sizes))) + tail

    def answer_width(self, i: int, workers: int) -> int:
        """Elements of the answer uplink piece i fills: its size, a gather's
        once per worker (a gather has one piece)."""
        return self.sizes[i] * (workers if self.kind == ALLGATHER else 1)

    def max_elems(self, workers: int) -> int:
        """The largest round this op sends: what an endpoint must hold."""
        return max([self.down_elems(workers), *self.sizes])

    def offsets(self) -> list[int]:
        """Where each uplink piece starts in the answer."""
        return [int(x) for x in np.cumsum((0,) + self.sizes[:-1])] if self.sizes else []

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Op:
        d = json.loads(text)
        d["sizes"] = tuple(d.get("sizes", ()))    # as storevalues.op_value reads it
        if d.get("kind") not in KINDS:
            raise ValueError(f"unknown op {d.get('kind')!r}")
        return cls(**d)


AHEAD = (STEP, BROADCAST, ALLREDUCE, ALLGATHER)   # kinds whose rounds may be opened ahead


def preopened(guess: Op | None, op: Op) -> int:
    """How many of op's uplink rounds the server opened before op's barrier,
    having guessed `guess` (Ahead.guess) would come: its first two, if so."""
    if op.kind in AHEAD and guess == op:
        return min(2, len(op.sizes))
    return 0


class Ahead:
    """Which op the server opens ahead, alike on every rank.

    Before it answers an op the server opens the first rounds of the op it
    guesses comes next, so data can flow the moment the barrier lifts; any
    other op's rounds are opened after it and announced through the store.
    The guess is the op that followed this one the last time it ran, else
    the same op again: a step after a step, FSDP's gathers of equal layers,
    and DDP's two buffer broadcasts (a model with BatchNorm) before each
    step, then the step. A step is guessed only if it is the latest step:
    the server's link holds that step's wire, Early Close and Bubble
    Filling, which a round opened ahead takes. The server and every worker
    see every op in order, so each keeps the same table; a joiner takes it
    (snapshot)."""

    KEEP = 64                      # ops remembered (the oldest go first)

    def __init__(self):
        self.prev: Op | None = None
        self.step: Op | None = None    # the latest step
        self.after: dict[Op, Op] = {}

    def guess(self) -> Op | None:
        """The op the server opens ahead after answering `prev`."""
        nxt = self.after.get(self.prev, self.prev)
        return self.prev if nxt is not None and nxt.kind == STEP and nxt != self.step else nxt

    def take(self, op: Op, kept: bool = True) -> int:
        """op comes now: how many of its rounds were opened ahead for it
        (preopened; 0 unless `kept`: see Members.still_ahead), then op is
        what followed prev."""
        n = preopened(self.guess(), op) if kept else 0
        if self.prev is not None:
            self.after.pop(self.prev, None)      # the newest last
            self.after[self.prev] = op
            if len(self.after) > self.KEEP:
                del self.after[next(iter(self.after))]
        self.prev = op
        if op.kind == STEP:
            self.step = op
        return n

    def snapshot(self) -> dict:
        return {"prev": self.prev.to_json() if self.prev else None,
                "step": self.step.to_json() if self.step else None,
                "after": [[a.to_json(), b.to_json()] for a, b in self.after.items()]}

    def restore(self, d: dict) -> None:
        self.prev = Op.from_json(d["prev"]) if d.get("prev") else None
        self.step = Op.from_json(d["step"]) if d.get("step") else None
        self.after = {Op.from_json(a): Op.from_json(b) for a, b in d.get("after", [])}


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
    # gather_s, filled_error, straggler; the loss policy's cap, budget, why and wire
    return REPORT_WORDS + buckets + PER_WORKER * workers + 7


@dataclass(frozen=True)
class Go:
    """The value of op s's barrier: the op, and the members it went on without."""

    op: Op
    absent: tuple[int, ...] = ()

    def to_json(self) -> str:
        return json.dumps({"op": asdict(self.op), "absent": list(self.absent)},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Go:
        d = json.loads(text)
        return cls(Op.from_json(json.dumps(d["op"])), tuple(d.get("absent", ())))


class Members:
    """Who takes part in the next op, as every rank computes it alike."""

    def __init__(self, workers: int):
        self.members: set[int] = set(range(workers))
        self.absent: set[int] = set()

    def expect(self) -> set[int]:
        """The workers the next barrier waits for."""
        return self.members - self.absent

    def participants(self, op: Op) -> list[int]:
        """Whose rows op's uplink rounds hold: a step's every member (absent ones
        until dropped), a broadcast its root, an all-reduce the present members."""
        if op.kind == BROADCAST:
            return [op.root]
        if op.kind == STEP:
            return sorted(self.members)
        return sorted(self.expect())

    def opened_for(self, op: Op) -> tuple:
        """What rounds opened ahead for op hold now: a step's every member (the
        absent too), another op's participants (see still_ahead)."""
        return tuple(sorted(self.members)) if op.kind == STEP else tuple(self.participants(op))

    def still_ahead(self, op: Op, opened_for: tuple) -> bool:
        """Whether op's rounds opened ahead (for `opened_for`, opened_for() then)
        still hold its rows after its barrier: not when the barrier went on
        without one of a gather's or an all-reduce's members (a step's rounds
        take the absent too). Every rank asks it alike: the server
        (Server.execute) and each worker (Exchange.agreed), after the go."""
        return op.kind == STEP or self.opened_for(op) == opened_for

    def after_go(self, go: Go) -> None:
        self.absent = set(go.absent) & self.members

    def after_report(self, rep: StepReport) -> None:
        for w, st in rep.status.items():
            if st == DROPPED:
                self.members.discard(w)
                self.absent.discard(w)
            elif st > 0:     # admitted with ticket st
                self.members.add(w)
                self.absent.discard(w)

    def donor(self) -> int | None:
        """The present member that hands its state to joiners (the lowest)."""
        present = self.expect()
        return min(present) if present else None

    def snapshot(self) -> dict:
        return {"members": sorted(self.members), "absent": sorted(self.absent)}

    def restore(self, d: dict) -> None:
        self.members, self.absent = set(d["members"]), set(d["absent"])


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
    # per worker: 0 a member as it was, DROPPED (no longer a member), or n > 0 (admitted
    # back with join ticket n); absent ones: not at this step's barrier
    status: dict[int, int] = field(default_factory=dict)
    absent: list[int] = field(default_factory=list)
    # per worker: buckets of this step whose delivered values held NaN or Inf
    # (treated as lost and filled, so the aggregate stays finite)
    nonfinite: dict[int, int] = field(default_factory=dict)
    # the ledger: the worst bucket's filled error against the aggregate's own
    # sampling noise (bubble.error_estimate; 0 when nothing was filled)
    filled_error: float = 0.0
    # who the step waited for (control/transport/straggler.py): the worker named
    # in most of its rounds (None: none named, or no arrival times: TCP), and
    # per worker its last chunk's arrival at the NIC minus the round's median
    # last arrival, seconds, averaged over the step's rounds
    straggler: int | None = None
    lateness: dict[int, float] = field(default_factory=dict)
    # this worker's own view of the step's barrier (exchange.Arrival: set by
    # its optimizer under bsp, not sent): its wait there, whether it arrived
    # last, its own time before arriving and what that held aside
    barrier: object = None
    # the loss policy's choice at this step (losspolicy.Choice): the most of
    # this answer it deferred, the uplink's loss budget from now on, and why
    policy: Choice = field(default_factory=Choice)

    @property
    def nonfinite_workers(self) -> list[int]:
        return sorted(w for w, n in self.nonfinite.items() if n)

    @property
    def dropped(self) -> list[int]:
        return sorted(w for w, s in self.status.items() if s == DROPPED)

    @property
    def admitted(self) -> dict[int, int]:
        """Worker -> join ticket, of the workers admitted back after this step."""
        return {w: s for w, s in sorted(self.status.items()) if s > 0}

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
                "gather_s": round(self.gather_s, 6), "absent": self.absent,
                "dropped": self.dropped, "admitted": sorted(self.admitted),
                "nonfinite_workers": self.nonfinite_workers,
                "filled_error": round(self.filled_error, 6), "straggler": self.straggler,
                "lateness_s": {str(w): round(v, 6) for w, v in self.lateness.items()},
                "loss_policy": self.policy.to_dict()}

    def encode(self, out: np.ndarray) -> None:
        """Write the report into `out` (float32 [report_words(B, W)])."""
        W, B = len(self.delivered), len(self.reasons)
        ids = sorted(self.delivered)
        words = [REPORT_MAGIC, self.step, B, W, *(REASONS.index(r) for r in self.reasons),
                 *(self.delivered[w] for w in ids), *(self.filled_chunks[w] for w in ids),
                 *(self.wholly_filled[w] for w in ids), *self.ks,
                 *(-2 if w in self.absent and not self.status.get(w) else self.status.get(w, 0)
                   for w in ids), *(self.nonfinite.get(w, 0) for w in ids),
                 *(self.lateness.get(w, np.nan) for w in ids), self.gather_s,
                 self.filled_error, -1 if self.straggler is None else self.straggler,
                 self.policy.cap, self.policy.budget, WHY.index(self.policy.why),
                 WIRES.index(self.policy.wire)]
        out[:] = np.asarray(words, dtype=np.float32)

    @classmethod
    def decode(cls, words: np.ndarray) -> StepReport:
        w = [float(x) for x in words]
        if int(w[0]) != REPORT_MAGIC:
            raise ValueError("the answer carries no step report (server and worker disagree "
                             "on the op)")
        step, B, W = int(w[1]), int(w[2]), int(w[3])
        i = REPORT_WORDS
        reasons = [REASONS[int(x)] for x in w[i:i + B]]
        i += B
        per = [w[i + k * W:i + (k + 1) * W] for k in range(PER_WORKER)]
        st = [int(x) for x in per[4]]
        pol = w[i + PER_WORKER * W + 3:i + PER_WORKER * W + 7]
        return cls(step=step, reasons=reasons,
                   delivered={k: per[0][k] for k in range(W)},
                   filled_chunks={k: int(per[1][k]) for k in range(W)},
                   wholly_filled={k: int(per[2][k]) for k in range(W)},
                   ks=[int(x) for x in per[3]], gather_s=w[i + PER_WORKER * W],
                   filled_error=w[i + PER_WORKER * W + 1],
                   straggler=None if w[i + PER_WORKER * W + 2] < 0 else int(w[i + PER_WORKER * W + 2]),
                   lateness={k: x for k, x in enumerate(per[6]) if not np.isnan(x)},
                   status={k: v for k, v in enumerate(st) if v != -2},
                   absent=[k for k, v in enumerate(st) if v == -2],
                   nonfinite={k: int(x) for k, x in enumerate(per[5]) if x},
                   policy=Choice(cap=pol[0], budget=pol[1], why=WHY[int(pol[2])],
                                 wire=WIRES[int(pol[3])]))
