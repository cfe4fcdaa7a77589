# SPDX-License-Identifier: Apache-2.0
"""A worker's side of the op sequence (ops.py): get ready, meet at the op's
barrier, push its pieces, take the server's answer.

An op runs in four calls so a step can spread them over two threads (the
optimizer pushes each bucket from a communication thread while backward
goes on, then takes the answer in step()):

  plan(op)        numbers only: the op's sequence number and uplink rounds
  prepare(run)    the endpoint is large enough, the answer's round is open
                  (before the first push: the server may answer before it returns)
  barrier(run)    arrive; wait until every worker has (wbsp: arrive, and ask `gone`)
  push(run, i)    piece i, once the server has opened its round
  finish(run)     the answer, into the caller's buffer; the clock moves on

Membership (ops.Members, kept in coord.view): each barrier's value names
the absent, each step's report the dropped and the admitted. A worker the
job went on without raises coord.Excluded at its next op; it (like a
restarted worker, which finds the job already running: `joining`) comes
back through elastic.py: a join ticket, the state a present member hands it
(`snapshot`/`restore` carry this side's part: clock and membership), then
the next op as a member.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ...errors import CommError
from .breakdown import worker as worker_phases
from .flight import BARRIER, COMPUTE, PULL, PUSH
from .flight import enter as flight_enter, heard as flight_heard
from .coord import Excluded, PeerGone
from .trace import OpRecord, Timeline, now_ns
from .runqueue import RunQueue
from .ops import STEP, Ahead, Go, Op, RoundClock, SHUTDOWN, StepReport

log = logging.getLogger("ltpx.torch.exchange")


@dataclass
class Arrival:
    """This worker's view of an op's barrier: seconds it waited there after
    arriving, whether it arrived last (it lifted the barrier: under bsp the
    one the others waited for), its own time before arriving (since its
    previous answer came: its compute, a straggler's lag; None for its first
    op), and what that time also held that is not the step's (`aside`, e.g.
    "evaluation": such a step names no straggler)."""

    seq: int
    wait_s: float
    last: bool
    own_s: float | None = None
    aside: str = ""


@dataclass
class Run:
    """One op in flight on this worker."""

    op: Op
    seq: int                 # the op's number; its answer is downlink round seq
    rounds: list[int]        # its uplink rounds
    npre: int                # how many of them the server opened before the barrier
    go: Go | None = None     # the barrier's value, once read
    ahead_for: tuple = ()    # opened ahead for these (Members.opened_for)
    rec: OpRecord | None = None   # its timeline record (trace.py)


@runtime_checkable
class OpExchange(Protocol):
    """What the job asks of its worker's exchange: `Exchange` (one server)
    and shards.ShardedExchange (several) both are one (tests/test_shards.py
    checks their members)."""

    id: int
    co: object                      # the coordination (coord.Coord, or the shards' ShardCoord)
    barrier_seen: Arrival | None    # the latest barrier, as this worker saw it
    donations: dict                 # worker -> the ticket this worker owes its state

    @property
    def joining(self) -> bool: ...
    @property
    def times(self) -> dict: ...
    @property
    def lost(self) -> dict[int, int]: ...
    @property
    def dropped(self) -> dict[int, int]: ...
    @property
    def rejoined(self) -> dict[int, int]: ...
    @property
    def timeline(self) -> Timeline: ...

    def plan(self, op: Op): ...
    def prepare(self, run) -> None: ...
    def arrive(self, run) -> bool: ...
    def barrier(self, run) -> None: ...
    def push(self, run, i: int, piece: np.ndarray) -> None: ...
    def finish(self, run, out: np.ndarray) -> np.ndarray: ...
    def run(self, op: Op, pieces: list[np.ndarray] | None, out: np.ndarray) -> np.ndarray: ...
    def set_aside(self, why: str) -> None: ...
    def left_out(self) -> set[int]: ...
    def shutdown(self) -> dict: ...


class Exchange:
    """This worker's op loop over `link` (link_ltp / link_tcp) and `coord`."""

    def __init__(self, link, coord, worker: int, workers: int):
        self.link, self.co, self.id, self.workers = link, coord, worker, workers
        coord.me = worker
        self.busy: set[int] = set()  # threads pushing or pulling (they wait on rounds, not the store)
        self.server_gone = False
        coord.on_server_dead = lambda _server: self.server_dead()
        self.clock = RoundClock()
        self.ahead = Ahead()         # what the server opens ahead, guessed as it guesses
        self.times = dict.fromkeys(("barrier_s", "push_s", "pull_s"), 0.0)
        self.phases = worker_phases()    # the process's step breakdown (comm_* phases)
        self.barrier_seen: Arrival | None = None   # the latest barrier, as seen here
        self.answered_ns = 0         # when the latest answer came (its own time starts)
        self.runq = RunQueue()       # the training thread's waits for a CPU
        self.answered_waited = 0     # ... as they stood then
        self.aside_why = ""          # set_aside(): what the time before the next op held
        self.timeline = Timeline()   # the latest ops' records (trace.py)
        # the job ran before this process joined it: it must be admitted first
        self.joining = coord.started()
        self.donations: dict[int, int] = {}   # worker -> ticket this worker owes its state
        self.lost: dict[int, int] = {}        # worker -> the first step that went on without it
        self.dropped: dict[int, int] = {}     # worker -> the step the server dropped it at
        self.rejoined: dict[int, int] = {}    # worker -> the step it was admitted back at

    def check_member(self) -> None:
        if self.joining:
            raise Excluded(f"worker {self.id} joined a running job: it must be admitted "
                           "first (elastic.rejoin)")

    def plan(self, op: Op) -> Run:
        """Number the next op; the clock moves on now, so a later op can be
        planned while this one is still being pushed."""
        run = Run(op, self.clock.seq, self.clock.rounds(op), self.ahead.take(op))
        if run.npre:   # the server opened it for the members it knew then
            run.ahead_for = self.co.view.opened_for(op)
        run.rec = OpRecord(run.seq, op.kind)
        self.clock.advance(op)
        return run

    def prepare(self, run: Run) -> None:
        self.link.ensure(run.op.max_elems(self.workers))
        self.link.expect(run.seq, run.op.down_elems(self.workers), tolerant=run.op.kind == STEP)

    def set_aside(self, why: str) -> None:
        """This worker's time before its next op holds work that is not the
        step's (the lead's evaluation): the op names no straggler for it."""
        self.aside_why = why

    def own(self, rec: OpRecord) -> tuple[float | None, str]:
        """This worker's own time before arriving at rec's op (seconds since
        its previous answer, less its training thread's waits for a CPU:
        runqueue.py; None before its first) and what it held aside; both go
        into rec."""
        aside, self.aside_why = self.aside_why, ""
        own = 0
        if self.answered_ns:
            rec.cpu_wait_ns = self.runq.waited_ns() - self.answered_waited
            own = rec.arrive_ns - self.answered_ns - rec.cpu_wait_ns
        rec.own_ns, rec.aside = max(0, own), aside
        return (own / 1e9 if own > 0 else None), aside

    def arrive(self, run: Run) -> bool:
        self.check_member()
        flight_enter(BARRIER, run.seq)
        run.rec.arrive_ns = now_ns()
        self.own(run.rec)
        run.rec.last = self.co.arrive(run.seq, run.op)
        return run.rec.last

    def agreed(self, run: Run, go: Go) -> Go:
        """go, once this worker's op is the one the barrier went on with (the
        server sums what that op describes: a rank whose own layout differs,
        e.g. its LTP_BUCKET_MB, would push pieces the server cuts elsewhere);
        a CommError naming the difference otherwise."""
        diff = run.op.differs(go.op)
        if diff:
            raise CommError(f"worker {self.id}: op {run.seq} is not the same on every rank "
                            f"({'; '.join(diff)}): give every rank the same settings "
                            "(LTP_* variables, ddp_state and init options) and model")
        if run.npre and not self.co.view.still_ahead(run.op, run.ahead_for):
            run.npre = 0   # the barrier went on without someone: the server opens it anew
        return go

    def barrier(self, run: Run) -> None:
        t0 = time.perf_counter()
        self.check_member()
        flight_enter(BARRIER, run.seq)
        run.rec.arrive_ns = int(t0 * 1e9)
        own, aside = self.own(run.rec)
        last = self.co.arrive(run.seq, run.op)
        t1 = time.perf_counter()
        run.go = self.agreed(run, self.co.wait_go(run.seq))
        t2 = time.perf_counter()
        self.times["barrier_s"] += t2 - t0
        self.phases.add("comm_barrier", t2 - t0)
        self.barrier_seen = Arrival(run.seq, t2 - t1, last, own, aside)
        run.rec.lift_ns, run.rec.last = int(t2 * 1e9), last
        run.rec.wait_ns = int((t2 - t1) * 1e9)

    def push(self, run: Run, i: int, piece: np.ndarray) -> None:
        """Piece i of the op (one bucket of a step) into its uplink round."""
        t0 = time.perf_counter()
        if run.go is None:      # wbsp: arrived, saw the barrier lift (coord.gone)
            run.go = self.agreed(run, self.co.read_go(run.seq))
        r = run.rounds[i]
        flight_enter(PUSH, run.seq, r)
        if self.link.opens and i >= run.npre:
            self.co.wait_open(r)
        with self.on_rounds():
            self.link.push(r, piece, run.op.reliable, answer=run.seq,
                           at=run.op.offsets()[i], wire=run.op.wire)
        run.rec.pushes.append((r, int(t0 * 1e9), now_ns()))
        dt = time.perf_counter() - t0
        self.times["push_s"] += dt
        self.phases.add("comm_push", dt)

    def finish(self, run: Run, out: np.ndarray,
               parts: list[np.ndarray] | None = None) -> np.ndarray:
        """The op's answer, copied into out[:down_elems] (returned); or, with
        `parts` (the link `scatters`), into them in turn, the last of which
        (out itself) holds what follows the pieces: a step's report."""
        t0 = time.perf_counter()
        view = out[:run.op.down_elems(self.workers)] if parts is None else out
        flight_enter(PULL, run.seq)
        with self.on_rounds():
            if parts is None:
                self.link.pull(run.seq, view)
            else:
                self.link.pull_parts(run.seq, parts)
        dt = time.perf_counter() - t0
        self.times["pull_s"] += dt
        self.phases.add("comm_pull", dt)
        run.rec.pull = (int(t0 * 1e9), now_ns())
        self.answered_ns, self.answered_waited = run.rec.pull[1], self.runq.waited_ns()
        flight_heard(0, run.rec.pull[1])      # the server's answer: its latest packet here
        flight_enter(COMPUTE, run.seq)
        self.timeline.add(run.rec)
        if run.op.kind == STEP:
            self.follow(StepReport.decode(view[sum(run.op.sizes):] if parts is None else view))
        return view

    def server_dead(self) -> None:
        """The heartbeat thread saw the server stop. A push or a pull waits on a
        round, not on the store, and would take the round's whole time limit
        (60 s): end this process as a SIGTERM would (it unwinds and detaches
        its XDP program); the launcher restarts the job, or reports it. Later
        pushes and pulls raise PeerGone at once."""
        self.server_gone = True
        if self.busy:
            log.error("ltpx.torch worker %s: the server stopped beating while this worker "
                      "was sending to it or waiting for its answer: ending", self.id)
            os.kill(os.getpid(), signal.SIGTERM)

    @contextlib.contextmanager
    def on_rounds(self):
        """Around a push or a pull: the server must still be beating."""
        me = threading.get_ident()
        self.busy.add(me)
        try:
            if self.server_gone:
                raise PeerGone(f"worker {self.id}: the server (rank {self.co.hb_server}) "
                               "stopped beating")
            yield
        finally:
            self.busy.discard(me)

    def follow(self, rep: StepReport) -> None:
        """A step's membership changes: drops, admissions, and whom this worker
        (the lowest present member) owes its state."""
        donor = self.co.view.donor()
        self.co.view.after_report(rep)
        for w in set(rep.absent) | set(rep.dropped) | set(rep.admitted):   # it was out
            self.lost.setdefault(w, rep.step)
        self.dropped.update(dict.fromkeys(rep.dropped, rep.step))
        self.rejoined.update(dict.fromkeys(rep.admitted, rep.step))
        if donor == self.id:
            self.donations.update(rep.admitted)

    # ------------------------------------------------------------------ rejoin
    def snapshot(self) -> dict:
        """This side of the state a joiner takes (after this worker's last op)."""
        return {"seq": self.clock.seq, "up": self.clock.up,
                "ahead": self.ahead.snapshot(),
                "view": self.co.view.snapshot(), "lost": dict(self.lost),
                "dropped": dict(self.dropped), "rejoined": dict(self.rejoined)}

    def restore(self, d: dict) -> None:
        """Take a member's snapshot: the next op is the member's next op."""
        self.clock.seq, self.clock.up = d["seq"], d["up"]
        self.ahead.restore(d["ahead"])
        self.co.view.restore(d["view"])
        self.lost, self.rejoined = dict(d["lost"]), dict(d["rejoined"])
        self.dropped = dict(d["dropped"])
        self.joining = False
        self.donations = {}

    def run(self, op: Op, pieces: list[np.ndarray] | None, out: np.ndarray) -> np.ndarray:
        """A whole op in this thread (pieces: this worker's, None if it sends none)."""
        run = self.plan(op)
        self.prepare(run)
        self.barrier(run)
        for i, piece in enumerate(pieces or []):
            self.push(run, i, piece)
        return self.finish(run, out)

    def left_out(self) -> set[int]:
        """The workers the latest op went on without (absent, or dropped)."""
        return set(range(self.workers)) - self.co.view.expect()

    def shutdown(self) -> dict:
        """The last op: arrive, then wait for the server's summary (until then
        this worker's endpoint still answers re-sends of the last answer)."""
        run = self.plan(Op(SHUTDOWN))
        if not self.joining and self.id in self.co.view.expect():
            self.co.arrive(run.seq, run.op)
        self.co.wait(["fin"], server=True)
        return self.co.get_json("fin")
