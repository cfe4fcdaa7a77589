# SPDX-License-Identifier: Apache-2.0
"""The server rank: sums what arrives and answers, op after op, with no model of its own.

For each op (ops.py) the server opens its uplink rounds (two at a time: a
round lives in bank r % 2 of the XDP program), gathers each round after
Early Close and Bubble Filling, combines the rows, and sends the answer to
every worker over the reliable class:

  step       the k-weighted mean of the workers' buckets (bsp: every k = 1;
             wbsp: k = the gradients a worker averaged), summed in float32 in
             one fixed order across threads (transport/aggregate.py: its
             accuracy contract), a worker's NaN or Inf contained in the same
             pass; then a StepReport. Every worker applies the one answer
             with its own optimizer, so the replicas stay bit-identical
  broadcast  the root worker's piece, sent reliably, back to everyone
  allreduce  the mean (or sum) of every worker's piece, sent reliably
  shutdown   the summary goes into the store; the loop ends

After a step it opens the first two rounds of the same step again, before it
answers: a worker may push the next step the moment it has the answer.

Faults (Hoplite's rule): a worker that delivers nothing of a step is
missing there (the report names it); after `max_missed` such steps in a row
(LTP_MAX_MISSED) the server drops it (status DROPPED in that step's report),
and later steps neither include nor wait for it. The op barrier goes on
without workers that stopped beating (coord.py); they stay in a step's
rounds, weighted 0, until dropped. A worker that asks to come back
(coord.tickets.request_join) is admitted in the next step's report; the lowest
present worker then hands it its state (elastic.py). A worker silent to
an answer's downlink for FIRST_TRY_S is left out of it and dropped at the
next step.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from ...errors import DeadPeerError, LtpError, TransportError
from ..transport import sumkernel
from ..transport.aggregate import aggregate_into, contain_nonfinite, sum_step
from ..transport.rate import quiet_gc
from ..transport.straggler import StepStragglers
from .breakdown import SERVER as SERVER_PHASES, SERVER_OVERLAP, Phases
from .flight import GATHER, OPS, SEND
from .flight import current as flight_current, enter as flight_enter, heard as flight_heard
from .flight import trigger as flight_trigger
from .losspolicy import Choice
from .trace import Timeline, answer_record, now_ns, rank_trace, round_record
from .trace import write as write_trace
from .ops import ALLGATHER, ALLREDUCE, BROADCAST, DROPPED, SHUTDOWN, STEP, Ahead, Op, RoundClock
from .ops import StepReport, preopened

FIRST_TRY_S = 3.0   # an answer's first try: long enough for a live worker to answer

log = logging.getLogger("ltpx.torch.server")


class StepTally:
    """One step's outcome per worker, as its rounds are gathered."""

    def __init__(self, workers: int):
        self.reasons: list[str] = []
        self.delivered = np.zeros(workers, dtype=np.int64)
        self.chunks = 0
        self.filled = np.zeros(workers, dtype=np.int64)
        self.wholly = np.zeros(workers, dtype=np.int64)
        self.nonfinite = np.zeros(workers, dtype=np.int64)
        self.gather_s = 0.0
        self.filled_error = 0.0
        self.stragglers = StepStragglers(workers)

    def add(self, g, seconds: float) -> None:
        ids = np.asarray(g.workers, dtype=np.int64)   # the round's rows, by worker id
        self.reasons.append(g.reason)
        self.delivered[ids] += g.delivered
        self.chunks += g.chunks
        self.filled[ids] += g.filled
        self.wholly[ids] += g.delivered == 0
        self.gather_s += seconds
        self.filled_error = max(self.filled_error, g.error)
        self.stragglers.add(g.attribution)

    def report(self, step: int, ws: list[int], ks: list[int]) -> StepReport:
        W = len(self.delivered)
        kw = dict(zip(ws, ks))
        return StepReport(step=step, reasons=self.reasons,
                          delivered={w: float(self.delivered[w]) / max(1, self.chunks)
                                     for w in range(W)},
                          filled_chunks={w: int(self.filled[w]) for w in range(W)},
                          wholly_filled={w: int(self.wholly[w]) for w in range(W)},
                          ks=[kw.get(w, 0) for w in range(W)], gather_s=self.gather_s,
                          nonfinite={w: int(self.nonfinite[w]) for w in range(W)
                                     if self.nonfinite[w]}, filled_error=self.filled_error,
                          straggler=self.stragglers.straggler(),
                          lateness=self.stragglers.lateness())


class Server:
    """The server's op loop over `link` (link_ltp / link_tcp) and `coord`."""

    def __init__(self, link, coord, workers: int, group_ok: bool, max_missed: int = 3):
        self.link, self.co, self.W = link, coord, workers
        # an LTP link's open rounds stay ACKed while the loop waits in the store
        self.co.on_wait = link.beat if link.opens else None
        self.view = coord.view          # membership (ops.Members), as every rank keeps it
        self.max_missed = max_missed
        self.missed = [0] * workers     # steps in a row a worker delivered nothing of
        self.silent: set[int] = set()   # left out of an answer: dropped at the next step
        self.lost: list[int] = []
        self.rejoined: list[int] = []
        self.group_ok = group_ok        # an address every worker receives exists
        self.clock = RoundClock()
        self.ahead = Ahead()            # the op after the last one, guessed alike everywhere
        self.pre: list[int] = []        # rounds opened ahead of the next op's barrier
        self.ahead_for: tuple = ()      # ... for these (Members.opened_for)
        self.answer = np.empty(0, dtype=np.float32)
        self.stale: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.steps = 0
        self.streamed = 0               # answers sent part by part as their rounds closed
        self.choice = Choice()          # the loss policy's at the latest step (losspolicy.py)
        self.times = dict.fromkeys(("gather_s", "update_s", "broadcast_s"), 0.0)
        self.phases = Phases(SERVER_PHASES, SERVER_OVERLAP)   # per step op (breakdown.py)
        # a tolerant downlink (loss_policy defer): what the last step's answer
        # left out, carried into the next answer of its shape, and the counts
        self.carry: tuple[tuple, np.ndarray] | None = None
        self.deferral = dict.fromkeys(("answers", "values", "dropped"), 0)
        self.reasons: dict[str, int] = {}
        self.delivered: list[float] = []
        self.round_s: list[float] = []
        self.timeline = Timeline()   # the latest rounds and answers (trace.py)
        self.trace: str | None = None      # write the server's view of the job here at its end
        self.index = 0                     # this server's (sharded: 0..S-1)

    def run(self) -> dict:
        """Serve until the workers shut the job down; returns the summary."""
        sumkernel.warm()               # built or loaded now, not in the first round
        try:
            while True:
                flight_enter(OPS, self.clock.seq)   # waits for the workers' arrivals
                t0 = time.perf_counter()
                op = self.co.next_op(self.clock.seq, up=self.clock.up).op
                if op.kind == SHUTDOWN:
                    break
                self.phases.add("idle", time.perf_counter() - t0)
                self.execute(op)
                if op.kind == STEP:
                    self.phases.end_step(wall=time.perf_counter() - t0)
                else:
                    self.phases.discard()
                if self.clock.seq == 1:
                    quiet_gc()   # set-up is done: never scan its objects again
            summary = self.summary()
            if self.trace:   # before fin: a lead that writes the whole job's trace comes after
                summary["timeline"] = self.timeline.records()
                write_trace(self.trace if self.index == 0 else f"{self.trace}.server{self.index}",
                            rank_trace({self.index: summary["timeline"]}, {}))
            self.co.set_json("fin", summary)
            return summary
        finally:
            self.link.close()

    def execute(self, op: Op) -> None:
        seq, rounds, n = self.clock.seq, self.clock.rounds(op), len(op.sizes)
        # opened ahead, unless for members the barrier went on without (every rank sees it)
        npre = self.ahead.take(op, kept=self.view.still_ahead(op, self.ahead_for))
        if self.link.ensure(op.max_elems(self.W)):
            self.pre = []     # a new endpoint: nothing is open on it
        need = op.down_elems(self.W) + self.link.sig_elems
        if len(self.answer) < need:
            self.answer = np.zeros(need, dtype=np.float32)
        if npre == 0:    # the op is not the one opened ahead for
            for r in self.pre:
                self.link.cancel(r)
        self.pre = []
        targets = sorted(self.view.expect())     # who gets the answer: the present
        group = self.group_ok and op.downlink == "group"
        if op.kind == STEP:
            self.link.configure(op.bubble, op.early_close, op.wire, op.carry)
        for i in range(npre, min(2, n)):
            self.open(rounds[i], op, i, announce=True)
        # a step of several rounds answers each round's part as it is summed
        stream = self.link.stream(seq, self.answer[:need], group, to=targets,
                                  wait_s=FIRST_TRY_S) if op.kind == STEP and n > 1 else None
        ws, absent = self.view.participants(op), set(self.view.absent)
        try:
            tally, ks = self.gather_all(op, rounds, ws, absent, stream)
            if op.kind == STEP:
                self.close_step(op, rounds, tally, ws, ks, absent)
            self.open_ahead(op, rounds)
            self.answer_op(op, seq, targets, group, stream)
        except BaseException:
            if stream is not None:   # no thread of it outlives the op
                stream.abort()
            raise
        self.clock.advance(op)

    def close_step(self, op: Op, rounds: list[int], tally: StepTally, ws: list[int],
                   ks: list | None, absent: set[int]) -> None:
        """A gathered step's report into the answer's tail."""
        t2 = time.perf_counter()
        self.steps += 1
        rep = tally.report(self.steps, ws, ks)
        rep.status, rep.absent = self.changes(tally, ws, len(rounds)), sorted(absent & set(ws))
        self.carry_in(op)
        # wbsp workers send a mean of k gradients as float32 (gradsync.follows)
        rep.policy = self.choice = self.link.choose(half=op.sync == "bsp")
        rep.encode(self.answer[sum(op.sizes):op.down_elems(self.W)])
        self.view.after_report(rep)
        self.note(rep)
        self.times["update_s"] += time.perf_counter() - t2

    def open_ahead(self, op: Op, rounds: list[int]) -> None:
        """Before op's answer: the first rounds of the op likely next
        (ops.Ahead) open now, before any worker can push its data; for the
        members now (Members.still_ahead)."""
        nxt, guess = rounds[-1] + 1, self.ahead.guess()
        self.ahead_for = self.view.opened_for(guess)
        for j in range(preopened(guess, guess)):
            self.open(nxt + j, guess, j, announce=False)
            self.pre.append(nxt + j)

    def gather_all(self, op: Op, rounds: list[int], ws: list[int], absent: set[int],
                   stream) -> tuple[StepTally, list | None]:
        """Every round of op from the participants `ws`, gathered and combined
        into the answer in order (each part fed to the answer's stream, if it
        has one); the tally and the participants' ks (a step's)."""
        seq, n = self.clock.seq, len(op.sizes)
        tally, ks, offs = StepTally(self.W), None, op.offsets()
        for i, r in enumerate(rounds):
            t0 = time.perf_counter()
            flight_enter(GATHER, seq, r)
            if i + 1 < n:     # a link may read it in while this one is summed
                self.link.ahead(rounds[i + 1], op.sizes[i + 1], ws)
            g = self.link.gather(r, op.sizes[i], ws)
            t1 = time.perf_counter()
            self.timeline.add(round_record(r, seq, op.kind, g))
            heard(g)
            if op.kind == STEP and ks is None:
                ks = self.co.get_k(seq, ws) if op.sync == "wbsp" else \
                    [0 if w in absent else 1 for w in ws]
            t_sum = time.perf_counter()
            width = op.answer_width(i, self.W)
            bad = self.combine(op, i, g, ks, self.answer[offs[i]:offs[i] + width])
            if stream is not None:
                stream.feed(offs[i] + op.sizes[i])
            self.phases.add("gather", t1 - t0)
            self.phases.add("aggregate", time.perf_counter() - t_sum)
            if bad is not None:
                tally.nonfinite[np.asarray(g.workers, dtype=np.int64)[bad]] += 1
            tally.add(g, t1 - t0)
            if i + 2 < n:
                self.open(rounds[i + 2], op, i + 2, announce=True)
            self.times["gather_s"] += t1 - t0
            self.times["update_s"] += time.perf_counter() - t1
        return tally, ks

    def answer_op(self, op: Op, seq: int, targets: list[int], group: bool, stream) -> None:
        """op's answer to `targets`: the rest of its stream, or (no stream, or
        one a silent worker stopped) the whole answer (answer_to)."""
        t3 = time.perf_counter()
        sign0 = self.link.sign_s
        flight_enter(SEND, seq)
        done = False
        if stream is not None:
            try:
                stream.finish()
                self.link.sign_s += stream.sign_s
                done = True
                self.streamed += 1
            except DeadPeerError as e:    # the whole answer again, to those still there
                targets = self.drop_silent(e, seq, targets)
            except TransportError as e:   # the whole answer again, as without a stream
                log.info("ltpx.torch server: answer %d's stream stopped (%s): sent whole", seq, e)
        if not done and targets:
            left = self.answer_to(targets, seq, self.answer[:op.down_elems(self.W)], group=group,
                                  critical_from=sum(op.sizes) if op.kind == STEP else None)
            if left is not None:
                self.carry_out(op, left)
        self.timeline.add(answer_record(seq, int(t3 * 1e9), now_ns(),
                                        self.choice.to_dict() if op.kind == STEP else None))
        self.times["broadcast_s"] += time.perf_counter() - t3
        self.phases.add("send", time.perf_counter() - t3)
        self.phases.add("sign", self.link.sign_s - sign0)

    def changes(self, tally: StepTally, ws: list[int], buckets: int) -> dict[int, int]:
        """This step's membership changes: worker -> DROPPED or its join ticket."""
        status = {}
        for w in ws:
            self.missed[w] = self.missed[w] + 1 if tally.wholly[w] >= buckets else 0
            if self.missed[w] >= self.max_missed or w in self.silent:
                status[w] = DROPPED
                self.lost.append(w)
        self.silent.clear()
        # the donor as every member sees it before this report (Exchange.follow)
        for w, ticket in self.co.tickets.take_joins(donor=self.view.donor()).items():
            status[w] = ticket
            self.missed[w] = 0
            self.link.readmit(w)
            if w not in self.rejoined:   # one that asked again (its donor died) once
                self.rejoined.append(w)
        return status

    def carry_in(self, op: Op) -> None:
        """Add what the last step's answer left out (a tolerant downlink's
        deferred chunks, transport/defer.py) into this step's, so every
        replica applies it now, a step late. An answer of another shape
        cannot take it: it is dropped, counted and logged."""
        if self.carry is None:
            return
        (sizes, vals), self.carry = self.carry, None
        if sizes == tuple(op.sizes):
            self.answer[:vals.size] += vals
            return
        self.deferral["dropped"] += int(np.count_nonzero(vals))
        log.warning("ltpx.torch server: %d gradient values deferred by a lossy answer are "
                    "dropped: the next step has another shape", np.count_nonzero(vals))

    def carry_out(self, op: Op, left: np.ndarray) -> None:
        """Keep the values this step's answer left out (`left`: its mask)."""
        n = sum(op.sizes)
        if not left[:n].any():
            return
        vals = np.zeros(n, dtype=np.float32)
        np.copyto(vals, self.answer[:n], where=left[:n])
        self.carry = (tuple(op.sizes), vals)
        self.deferral["answers"] += 1
        self.deferral["values"] += int(left[:n].sum())

    def answer_to(self, targets: list[int], d: int, buf: np.ndarray, group: bool,
                  critical_from: int | None = None) -> np.ndarray | None:
        """Send answer d to the present workers. A worker silent to it for
        FIRST_TRY_S (dead since the barrier) is left out, and dropped at the
        next step; the others get it within the link's own time limit.
        Returns what the answer left out (ServerLink.send), or None."""
        if not self.link.opens:   # every byte delivered or the send fails: one try
            return self.link.send(d, buf, group, critical_from=critical_from)
        to = list(targets)
        try:
            return self.link.send(d, buf, group, to=to, wait_s=FIRST_TRY_S,
                                  critical_from=critical_from)
        except DeadPeerError as e:
            to = self.drop_silent(e, d, to)
        except TransportError:
            pass                 # slow, not silent: try again with the full time
        if to:
            return self.link.send(d, buf, group, to=to, critical_from=critical_from)
        return None

    def drop_silent(self, e: DeadPeerError, d: int, to: list[int]) -> list[int]:
        """`to` without the workers silent to answer d (`e`) whose heartbeat
        stopped too: they are left out, and dropped at the next step."""
        flight_trigger("DeadPeerError", f"answer {d}: {e}")
        gone = self.co.dead_workers([p.worker for p in e.peers])
        self.silent |= gone
        if gone:
            log.warning("ltpx.torch server: worker(s) %s dead and silent to answer %s: "
                        "left out, dropped at the next step", sorted(gone), d)
        return [w for w in to if w not in gone]

    def open(self, r: int, op: Op, i: int, announce: bool) -> None:
        """Open uplink round r, op's piece i, in the bank of round r - 2
        whatever its workers do: one still pushing that round is answered
        CLOSED there (the XDP program keeps r - 2's tokens), and one pushing
        an older round ends when the op's answer arrives (docs/training.md,
        "A worker the server gave up on")."""
        self.link.open(r, op.sizes[i], self.view.participants(op), op.reliable,
                       key=(op.kind, i, op.sizes[i]))
        if announce and self.link.opens:
            self.co.announce_open(r)

    def combine(self, op: Op, i: int, g, ks: list[int] | None,
                out: np.ndarray) -> np.ndarray | None:
        """Round i's rows into its place in the answer; a step's returns the
        rows found holding NaN or Inf (contained: treated as lost)."""
        if op.kind == BROADCAST:
            np.copyto(out, g.values[0])
        elif op.kind == ALLGATHER:     # row by worker id; an absent one's stays zeros
            rows = out.reshape(self.W, -1)
            rows[:] = 0
            rows[np.asarray(g.workers, dtype=np.int64)] = g.values
        elif op.kind == ALLREDUCE:
            aggregate_into(out, g.values, average=op.average)
        elif op.bubble == "stale" and g.masks is not None:
            bad = contain_nonfinite(g, op.bubble)   # before the rows are remembered
            self.fill_stale(i, g)
            return sum_step(out, g, ks, op.bubble, bad=bad)
        else:
            return sum_step(out, g, ks, op.bubble)
        return None

    def fill_stale(self, i: int, g) -> None:
        """Bubble Filling "stale" per bucket: a chunk a worker did not deliver
        takes that worker's value from the last step in which it arrived (the
        endpoint filled zeros; zeros stay where nothing arrived yet)."""
        k, n = g.values.shape
        st = self.stale.get(i)
        if st is None or st[0].shape != (k, n):
            st = self.stale[i] = (np.zeros((k, n), np.float32), np.zeros((k, n), bool))
        vals, valid = st
        arrived = np.repeat(g.masks, g.chunk_elems, axis=1)[:, :n]
        np.copyto(g.values, vals, where=~arrived & valid)
        np.copyto(vals, g.values, where=arrived)
        valid |= arrived

    def note(self, rep: StepReport) -> None:
        self.reasons[rep.reason] = self.reasons.get(rep.reason, 0) + 1
        self.delivered.append(rep.delivered_fraction)
        self.round_s.append(rep.gather_s)

    def summary(self) -> dict:
        return {"steps": self.steps, "ops": self.clock.seq, "streamed_answers": self.streamed,
                "ps_times": {k: round(v, 4) for k, v in self.times.items()},
                "rounds_by_reason": self.reasons,
                "delivered_fraction": float(np.mean(self.delivered)) if self.delivered else 1.0,
                "round_s_median": float(np.median(self.round_s)) if self.round_s else None,
                "workers_lost": self.lost, "workers_rejoined": self.rejoined,
                "downlink_deferred": dict(self.deferral),
                "loss_policy": self.link.loss_summary(),
                "breakdown": self.phases.summary() if self.phases.steps else None}


def heard(g) -> None:
    """The flight recorder's latest packet from each worker of gathered round g
    (its last chunk's arrival at the NIC)."""
    a = g.arrivals
    if a is None or flight_current() is None:
        return
    for w, t in zip(g.workers, a.last_ns.tolist()):
        flight_heard(w, t)


def run_server(job) -> int:
    """Serve `job` (a job.Job of a server rank); 0 at a clean shutdown, 1 on an
    error (one line on stderr)."""
    srv = Server(job.link, job.coord, job.workers, group_ok=job.group is not None,
                 max_missed=job.s.max_missed)
    srv.trace, srv.index = job.s.trace, job.global_rank
    if flight_current() is not None and job.given is None:   # a dump carries the latest
        flight_current().records = srv.timeline.records     # rounds (not a partner's)
    try:
        job.summary = srv.run()
        return 0
    except LtpError as e:
        log.error("ltpx.torch server (rank %s): error: %s", job.global_rank, e)
        return 1
