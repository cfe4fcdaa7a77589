# SPDX-License-Identifier: Apache-2.0
"""DDP's gradient buckets over LTP: the comm hook, and the tolerant all-reduce
the `ltp` backend (backend.py) runs for DDP's reducer.

A bucket goes up as a piece of a step op (ops.py) over LTP's loss-tolerant
class (Early Close, Bubble Filling); the server averages the workers' rows
and answers over the reliable class, and every rank takes the same answer
bytes, so replicas stay bit-identical. Until two steps running had the same
bucket sizes each bucket is an op of its own; then one op per step carries
them all (one barrier a step, the next step's rounds opened ahead). Ops run
on a communication thread, so a bucket leaves while backward goes on; the
caller gets a `torch.futures.Future` that DDP's reducer waits on at the end
of backward. If an op fails, every bucket taken gets the error.

The tensor may live on any device: `Staging` copies it into a float32 host
buffer (pinned, on a side stream, for CUDA) and the answer back into the
tensor's own memory; on the CPU the same code runs with plain copies, so the
CPU tests exercise every step but the device copies.

    import ltpx.torch as lt
    state = lt.ddp_state()                    # options: bubble, early_close, downlink
    ddp.register_comm_hook(state, lt.ddp_hook)
    ...
    state.last_report                         # the last op's StepReport (per bucket: reasons)
"""
from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.distributed

from ...errors import CommError, UsageError
from .. import settings_table
from .breakdown import worker as worker_phases
from .carry import Carry
from .codec import HALF, deferred_answers, staged_as_bits, wire_for
from .job import current
from .ops import STEP, Op, StepReport
from .gradsync import GradientSync, plan_step
from .staging import Staging
from .threads import CallThread


TOLERANT = settings_table.TABLE["tolerant"].choices   # LTP_TOLERANT: backend.py's rule


def tolerant_rule() -> str:
    """LTP_TOLERANT, else backward; a UsageError (BadVariable) names a bad one."""
    return settings_table.env("tolerant")


@dataclass
class Bucket:
    """One bucket on the communication thread: its tensor, its float32 host
    copy, its position in the step, the factor for the answer, its future
    (a stand-in for a piece of an abandoned layout has no tensor)."""

    t: torch.Tensor | None
    piece: np.ndarray | None
    key: int                     # its position in the step (the layout's)
    scale: float = 1.0
    fut: torch.futures.Future | None = None
    store: tuple = ()            # its tensor's memory: host buffer and rounding error
    follow: bool = True          # may take the loss policy's wire (not alone()'s: see there)


@dataclass
class Layout:
    """The bucket sizes of a step: those seen so far in this one, the last
    step's, and the layout once two steps running had it."""

    seen: list = field(default_factory=list)
    last: list | None = None
    stable: tuple | None = None

    def next_step(self) -> None:
        if self.seen and self.seen == self.last:
            self.stable = tuple(self.seen)
        self.last, self.seen = self.seen, []


def cut(n: int, most: int) -> tuple[int, ...]:
    """A bucket of n elements as the pieces (uplink rounds) it goes in: as
    few as hold at most `most` each, sizes differing by at most one. A
    round's part of the answer leaves as soon as the round is summed
    (transport/stream.py), so a large bucket in several rounds has its
    answer on the way while its later rounds still come in."""
    k = max(1, -(-n // max(1, most)))
    q, r = divmod(n, k)
    return tuple(q + (1 if i < r else 0) for i in range(k))


@dataclass
class MultiRun:
    """A step's op whose pieces are the step's buckets, each cut into
    rounds (`cut`), in order."""

    run: object                                  # exchange.Run
    buckets: tuple                               # the buckets' sizes
    most: int                                    # the largest round, in elements
    waiting: list = field(default_factory=list)  # the buckets pushed, answers to come

    def fits(self, key: int, n: int) -> bool:
        b = self.buckets
        return key == len(self.waiting) and key < len(b) and b[key] == n

    def first(self, key: int) -> int:
        """The op's piece index of bucket key's first round."""
        return sum(len(cut(n, self.most)) for n in self.buckets[:key])


class TolerantReduce:
    """Buckets' mean over the workers through LTP step ops, one at a time on a
    communication thread. One per job: the hook's state and the backend share it."""

    def __init__(self, job):
        if job.is_server:
            raise UsageError("ltpx.torch: DDP runs on trainer ranks; this rank is a server")
        self.job = job
        try:   # the backend's own buckets: LTP_EARLY_CLOSE, EarlyCloseConfig fields as JSON
            early_close = json.loads(settings_table.env("early_close") or "{}")
        except ValueError as e:
            raise UsageError(f"LTP_EARLY_CLOSE: not JSON ({e}); e.g. "
                             '\'{"threshold_min": 0.97}\'') from None
        self.base = self.op_for(early_close=early_close)
        # a compress that rounds (not none or auto), with error feedback: each bucket's error
        self.ef = job.s.compress not in settings_table.EXACT_COMPRESS and job.s.error_feedback
        self.dtypes: dict[int, torch.dtype] = {}   # a step's buckets' dtypes, by position
        self.op_wire: dict[int, str] = {}          # the wire each position's op last took
        self.deferred = deferred_answers(job.link)   # the server's deferral: auto is float32
        # the loss policy's wire for float32 buckets (compress auto), from the
        # latest step report: the ops from then on travel so (Op.carry), each
        # bucket's rounding carried into its next step here (push)
        self.lossy = "none"
        self.carry = Carry(job.s.error_feedback)
        self.wires: Counter = Counter()            # step ops by wire
        self.residual: dict[tuple, np.ndarray] = {}
        self.open: list[Bucket] = []      # taken, not yet answered
        self.staging = Staging()
        self.comm = CallThread("ltpx-ddp")
        self.lock = threading.Lock()
        self.layout = Layout()
        # the largest round a bucket goes in (`cut`): the job's bucket_mb
        self.most = max(1, int(job.s.bucket_mb * 2**20) // 4)
        self.cur: MultiRun | None = None  # the step's op while its buckets come
        self.ops = 0                      # step ops so far (one per step, once the layout is known)
        self.buckets = 0                  # buckets reduced so far
        self.rounds = 0                   # ... in so many LTP rounds (cut)
        self.early_buckets = 0            # rounds (a bucket's pieces: cut) closed early
        self.wholly_filled_total = 0
        self.delivered_sum = 0.0          # per bucket: the workers' mean delivered fraction
        self.last_report: StepReport | None = None
        self.phases = worker_phases()  # staging here, comm_* on the communication thread
        self.handed = 0.0                 # perf_counter at the latest bucket's hand-off
        self.kept: dict[tuple, torch.Tensor] = {}   # alone(): a tensor per size, dtype, device
        job.optimizers.append(self)       # drained before other ops, closed with the job

    def op_for(self, bubble: str = "mean", early_close: dict | None = None,
               downlink: str | None = None) -> Op:
        """A bucket's step op (its sizes set per bucket), after the options' checks."""
        early_close = dict(early_close or {})
        GradientSync.check_options("bsp", bubble, early_close, downlink, None, 1, 1)
        return Op(STEP, bubble=bubble, early_close=json.dumps(early_close, sort_keys=True),
                  downlink=downlink or self.job.s.downlink)

    def mean(self, t: torch.Tensor, key: int = 0, scale: float = 1.0,
             base: Op | None = None, follow: bool = True) -> torch.futures.Future:
        """A future of t, which then holds the mean of every worker's t (times
        scale), written in place. key: the bucket's position in a step (its
        host buffer and, compressed, its rounding error); base: the op's
        options (op_for)."""
        if not t.is_floating_point():
            raise UsageError(f"ltpx.torch: a tolerant all-reduce takes floating tensors, "
                             f"got {t.dtype}")
        n = t.numel()
        # keyed by the tensor's memory (DDP's bucket buffers persist): two
        # buckets in flight never share a host buffer or a rounding error
        store = (t.device.type, t.untyped_storage().data_ptr(), t.storage_offset(), n)
        with self.phases.timed("staging"):
            bits = staged_as_bits(t.dtype, self.job.s.compress, self.deferred,
                                  self.op_wire.get(key))
            host = self.staging.host(store, n, t.device, torch.int16 if bits else torch.float32)
            ev = self.staging.down(t, host)
        fut = torch.futures.Future()
        b = Bucket(t, None, key, scale, fut, store, follow)
        self.comm.submit(self.run, b, host, ev, base or self.base)
        self.handed = time.perf_counter()
        return fut

    def alone(self, t: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """t's mean over the workers (times scale), as an op of its own,
        waited for here: for a caller that blocks on each reduction (FSDP2's
        reduce-scatter), which a step op of several buckets would wait on.
        Its values go through a tensor kept per size, dtype and device, so a
        caller's fresh tensors each step reuse one host buffer (mean keys
        them by memory); the result is that tensor, valid until the next call.
        Its ops stay off the loss policy's wire: a rounding error kept per
        piece would pass from one of a caller's equal-sized tensors (FSDP's
        layers) to the next, and so would the server's per answer size."""
        key = (t.numel(), t.dtype, t.device)
        kept = self.kept.get(key)
        if kept is None:
            kept = self.kept[key] = torch.empty(t.numel(), dtype=t.dtype, device=t.device)
        kept.copy_(t.reshape(-1))
        return self.mean(kept, key=0, scale=scale, follow=False).wait()

    def run(self, b: Bucket, host, ev, base: Op) -> None:
        try:
            if ev is not None:
                ev.synchronize()
            b.piece = host.numpy()
            self.open.append(b)
            self.bucket(b, base)
        except BaseException as e:   # every caller's wait() raises it; no future is left
            self.fail(e, b)

    def fail(self, e: BaseException, *more: Bucket) -> None:
        """Every bucket taken and not answered gets e (the step's op is given up)."""
        self.cur = None
        self.layout.stable = None
        for w in [*self.open, *more]:
            if w.fut is not None and not w.fut.done():
                w.fut.set_exception(e)
        self.open = []

    def bucket(self, b: Bucket, base: Op) -> None:
        """Bucket b of a step: a piece of the step's op once the layout is known
        (the same sizes two steps running: one barrier a step, rounds opened
        ahead, as DistributedOptimizer's steps), else an op of its own."""
        n = b.piece.size
        if b.key == 0:
            self.layout.next_step()
        self.layout.seen.append(n)
        cur = self.cur
        if cur is not None and (not cur.fits(b.key, n) or self.off_wire(cur.run.op, b)):
            self.abandon()     # every rank sees the same layout change, and does the same
            cur = None
        stable, most = self.layout.stable, self.most
        if b.t is not None:
            self.dtypes[b.key] = b.t.dtype
        if cur is None and b.key == 0 and stable and stable[0] == n:
            sizes = tuple(x for m in stable for x in cut(m, most))
            wire, carry = self.wire_of([self.dtypes.get(k) for k in range(len(stable))],
                                       b.follow)
            cur = self.cur = MultiRun(self.start(replace(base, sizes=sizes, wire=wire,
                                                         carry=carry)), stable, most)
        if cur is None:
            wire, carry = self.wire_of([b.t.dtype], b.follow)
            run = self.start(replace(base, sizes=cut(n, most), wire=wire, carry=carry))
            self.push(run, 0, b)
            self.finish(run, [b])
            return
        self.push(cur.run, cur.first(b.key), b)
        cur.waiting.append(b)
        if len(cur.waiting) == len(cur.buckets):
            self.cur = None
            self.finish(cur.run, cur.waiting)

    def off_wire(self, op: Op, b: Bucket) -> bool:
        """b's dtype would be rounded by op's 2-byte wire (its position held
        another dtype the step before, when the op was chosen)."""
        return op.wire != "none" and self.wire_of([b.t.dtype], b.follow)[0] != op.wire

    def wire_of(self, dtypes: list, follow: bool = True) -> tuple[str, bool]:
        """What an op of these dtypes travels as, and whether that is the loss
        policy's wire (Op.carry): only for float32 buckets, all of them."""
        wire = wire_for(self.job.s.compress, dtypes, self.deferred)
        if follow and self.lossy != "none" and self.job.s.compress == "auto" \
                and set(dtypes) == {torch.float32}:
            return self.lossy, True
        return wire, False

    def start(self, op: Op):
        self.wires[op.wire] += 1
        run = plan_step(self.job, op)
        self.job.exchange.prepare(run)
        self.job.exchange.barrier(run)
        return run

    def push(self, run, i: int, b: Bucket) -> None:
        """Bucket b into the op's pieces from i on, a round each (`cut`)."""
        if b.t is not None:
            self.op_wire[b.key] = run.op.wire   # this position's bucket stages for it next
        if b.piece.dtype == np.int16 and run.op.wire != HALF[b.t.dtype]:
            # staged as its bits, but its op goes otherwise (float32 buckets
            # share it: from the next step on it is staged as float32)
            b.piece = torch.from_numpy(b.piece).view(b.t.dtype).float().numpy()
        if b.t is not None and b.piece.dtype == np.float32:
            self.carry_in(run.op, b)
        lo = 0
        for j, m in enumerate(cut(b.piece.size, self.most)):
            self.job.exchange.push(run, i + j, b.piece[lo:lo + m])
            lo += m

    def carry_in(self, op: Op, b: Bucket) -> None:
        """b's rounding error of its last step added to it: a compress that
        rounds leaves it in the piece (finish keeps it), the loss policy's
        wire keeps its own (carry.py)."""
        if not self.ef:
            self.carry.into(b.store, b.piece, op)
        elif (res := self.residual.get(b.store)) is not None:
            b.piece += res

    def finish(self, run, buckets: list) -> None:
        """The op's answer: each bucket's slice into its tensor, its future set."""
        op = run.op
        down = op.down_elems(self.job.workers)
        ans = self.staging.answer(down, any(b.t is not None and b.t.is_cuda for b in buckets))
        view = self.job.exchange.finish(run, ans.numpy())     # written into ans
        self.note(StepReport.decode(view[sum(op.sizes):]), len(buckets), len(op.sizes))
        offs = np.cumsum([0] + [b.piece.size for b in buckets[:-1]]).tolist()
        t0 = time.perf_counter()
        try:
            for b, off in zip(buckets, offs):
                if b.t is None:              # a stand-in
                    continue
                # what the links left in the piece is its rounding error (every
                # shard's thread is done by now); a piece smaller than the
                # servers went as a padded copy and left none
                if self.ef and b.piece.dtype == np.float32 and \
                        min(cut(b.piece.size, self.most)) >= self.job.s.servers:
                    self.residual[b.store] = b.piece.copy()
                self.staging.up(ans[off:off + b.piece.size], b.t, b.scale)
        finally:     # before the futures, also on an error: the tensors final, the buffer free
            self.staging.wait()
        self.phases.add("comm_copy_back", time.perf_counter() - t0)
        for b in buckets:
            if b.t is not None:
                b.fut.set_result(b.t)
        done = {id(b) for b in buckets}
        self.open = [w for w in self.open if id(w) not in done]

    def abandon(self) -> None:
        """The layout changed under a step's op: zeros for the pieces still to
        come, the op finished (the buckets already in it get their answers)."""
        cur, self.cur = self.cur, None
        self.layout.stable = None
        for k in range(len(cur.waiting), len(cur.buckets)):
            stand_in = Bucket(None, np.zeros(cur.buckets[k], np.float32), -1)
            self.push(cur.run, cur.first(k), stand_in)
            cur.waiting.append(stand_in)
        self.finish(cur.run, cur.waiting)

    def note(self, rep: StepReport, buckets: int = 1, rounds: int = 1) -> None:
        with self.lock:
            self.buckets += buckets
            self.rounds += rounds
            self.ops += 1
            rep.step = self.ops
            self.early_buckets += sum(r in ("early", "deadline") for r in rep.reasons)
            if rep.delivered:
                self.delivered_sum += buckets * sum(rep.delivered.values()) / len(rep.delivered)
            self.wholly_filled_total += sum(rep.wholly_filled.values())
            rep.wholly_filled_total = self.wholly_filled_total
            self.last_report = rep
            self.lossy = rep.policy.wire

    def stats(self) -> dict:
        """What its rounds did; `deferred_answers` / `deferred_chunks`: the
        answers (loss_policy defer) that left chunks out, a step late;
        `wires`: step ops by what their gradients travelled as (Op.wire)."""
        down = self.job.link.downlink if self.job.link is not None else {}
        return {"buckets": self.buckets, "rounds": self.rounds, "ops": self.ops,
                "early_buckets": self.early_buckets,
                "wholly_filled_total": self.wholly_filled_total,
                "delivered": self.delivered_sum / self.buckets if self.buckets else 1.0,
                "deferred_answers": down.get("answers", 0),
                "deferred_chunks": down.get("chunks", 0), "wires": dict(self.wires)}

    # the job's calls (job.optimizers): before another op, and at the end
    def drain(self) -> None:
        self.comm.drain()

    def close(self, wait_s: float = 10.0) -> None:
        self.comm.close(wait_s)
        if self.open:   # a step whose op never finished: its callers must not wait for ever
            self.fail(CommError("ltpx.torch: the job ended with DDP buckets unanswered"))


class HookState:
    """`model.register_comm_hook(state, ddp_hook)`'s state: the job's tolerant
    reduce, this hook's options, and what it reports (`last_report`, `stats()`)."""

    def __init__(self, reduce: TolerantReduce, base: Op):
        self.reduce, self.base = reduce, base

    @property
    def last_report(self) -> StepReport | None:
        return self.reduce.last_report

    def stats(self) -> dict:
        return self.reduce.stats()


def tolerant_reduce() -> TolerantReduce:
    """The job's TolerantReduce (made at the first call)."""
    job = current()
    if job.tolerant is None:
        job.tolerant = TolerantReduce(job)
    return job.tolerant


def ddp_state(*, bubble: str = "mean", early_close: dict | None = None,
              downlink: str | None = None) -> HookState:
    """The state for `ddp_hook`: bubble (mean | zero | stale), early_close
    (EarlyCloseConfig fields, e.g. {"threshold_min": 0.97}), downlink
    (group | unicast). Call it after init_process_group("ltp") (or lt.init())."""
    red = tolerant_reduce()
    return HookState(red, red.op_for(bubble, early_close, downlink))


def ddp_hook(state: HookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the bucket's mean over the workers, loss-tolerant.
    Returns a future of the bucket's buffer, averaged in place."""
    if not isinstance(state, HookState):
        raise UsageError("ltpx.torch.ddp_hook: register it with lt.ddp_state() as its state: "
                         "model.register_comm_hook(lt.ddp_state(), lt.ddp_hook)")
    buf = bucket.buffer()
    if tolerant_rule() == "never":   # exact, as everything else: gloo's mean
        fut = torch.distributed.all_reduce(buf, op=torch.distributed.ReduceOp.AVG,
                                           async_op=True).get_future()
        return fut.then(lambda f: buf)
    return state.reduce.mean(buf, key=bucket.index(), base=state.base)


# DDP compares the hook's annotations with the objects themselves (this
# module's are strings: `from __future__ import annotations`)
ddp_hook.__annotations__.update(state=HookState, bucket=torch.distributed.GradBucket,
                                 **{"return": torch.futures.Future[torch.Tensor]})
