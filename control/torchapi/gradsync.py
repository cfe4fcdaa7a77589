# SPDX-License-Identifier: Apache-2.0
"""`GradientSync`: what a DistributedOptimizer (optimizer.py) does with a step's
gradients, over LTP.

Given the optimizer's parameters (in buckets, buckets.py), per step:

  bsp, overlap (the default)  a hook on every parameter counts the gradients
      backward has produced; when a bucket (buckets.py) is complete it is
      copied into the send buffer and pushed from a communication thread,
      so the push overlaps the rest of backward. step() sends what is left
      (parameters that got no gradient contribute zeros), waits for the
      pushes, takes the server's answer, makes it every parameter's .grad
      and (optimizer.py) the optimizer's own step runs.
  bsp, overlap=False  the same, all in step().
  wbsp  step() adds this gradient to the bucket buffers and arrives at the
      round's barrier after the first one; until the slowest worker has
      arrived it answers False: the model must not move yet (the caller draws
      the next mini-batch); then it pushes the mean of its k gradients, reports k,
      and applies the answer. `steps` counts the moves.

With lt.init(compress="uint8") each bucket goes up as 8-bit codes, a min
and a scale per LTP chunk (codec.py), and the aggregate comes back the same
way; with error_feedback (the default) what rounding left out of a bucket
is added to the same bucket's next gradient. With compress auto (the
default) and float32 gradients under bsp, the server's loss policy may
choose the bfloat16 wire for heavy loss (losspolicy.py, "The wire"): each
step's report says which, this optimizer applies it from its next step
(`follow`), carries its own rounding into the next step while it holds, and
adds what it still carries to its first float32 step after.

Every step's StepReport is `last_report` (with who the step waited for:
the server's straggler from the NIC's arrival times, and this worker's own
wait at the step's barrier); when a worker's whole
contribution to a bucket was Bubble-Filled a `FilledWarning` says so on
worker 0 and on that worker, at the first time and every `warn_every`-th.
"""
from __future__ import annotations

import contextlib
import functools
import json
import time
import warnings
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np
import torch

from ...errors import UsageError
from ..transport.bubble import STRATEGIES
from ..transport.early_close import EarlyCloseConfig
from ..transport.rate import quiet_gc
from .breakdown import worker as worker_phases
from .buckets import BucketPlan, named_params
from .flight import trigger as flight_trigger
from .carry import Carry
from .codec import deferred_answers, wire_for
from .shards import split_op
from .job import current
from .ops import STEP, Op, StepReport
from .threads import CallThread

SYNCS = ("bsp", "wbsp")


class FilledWarning(UserWarning):
    """A worker's whole contribution to a round was Bubble-Filled."""


def filled_text(rep: StepReport, now: int, total: int, gone: list[int]) -> str:
    """The FilledWarning of a step: whose gradient was filled wholly, and why
    that may be: a worker that left the job (dead or hung) is named as one;
    the others were given up on for starting late."""
    text = (f"ltpx.torch step {rep.step}: nothing of worker(s) {rep.missing_workers}'s "
            f"gradient arrived in {now} bucket round(s) before the server closed them; "
            f"Bubble Filling stood in for all of it ({total} such round(s) so far, "
            "opt.last_report.wholly_filled_total).")
    late = [w for w in rep.missing_workers if w not in gone]
    if gone:
        text += (f" Worker(s) {gone} left the job (stopped beating or missed the barrier: "
                 "dead or hung); the others go on without them (docs/training.md, Faults).")
    if late:
        text += (f" Worker(s) {late} started pushing long after the others and were given "
                 "up on (Early Close's absent rule; docs/training.md).")
    return text


@dataclass
class StepState:
    """The step whose gradients backward is producing."""

    run: object                  # exchange.Run
    pending: list[int]           # per bucket: gradients still to come
    ready: list[bool]
    next: int = 0                # the next bucket to hand to the communication thread


def plan_step(job, op: Op):
    """The next step op's run; compressed (op.wire), its answer (each
    server's, sharded) starts with the aggregate's codes, and the links must
    know that."""
    run = job.exchange.plan(op)
    if op.wire != "none":
        links = job.link.parts()
        if len(links) == 1:
            heads = [sum(op.sizes)]
        else:
            subs, _ = split_op(op, len(links))
            heads = [sum(sub.sizes) for sub in subs]
        for link, n in zip(links, heads):
            link.expect_wire(run.seq, n, op.wire)
    return run


class GradientSync:
    """See the module docstring; `opt.ltp` of a DistributedOptimizer. Options:
    sync (bsp | wbsp), bubble (mean | zero | stale), early_close
    (EarlyCloseConfig fields, e.g. {"threshold_min": 0.97}), downlink (group |
    unicast), bucket_mb, overlap, backward_passes_per_step, warn_every,
    error_feedback (compressed jobs; default: lt.init's)."""

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters=None, *,
                 sync: str = "bsp", bubble: str = "mean", early_close: dict | None = None,
                 downlink: str | None = None, bucket_mb: float | None = None,
                 overlap: bool = True, backward_passes_per_step: int = 1,
                 warn_every: int = 10, error_feedback: bool | None = None):
        job = current()
        if job.is_server:
            raise UsageError("DistributedOptimizer: this rank is a server (lt.is_server()); "
                             "servers need no model")
        early_close = dict(early_close or {})
        self.check_options(sync, bubble, early_close, downlink, bucket_mb,
                           backward_passes_per_step, warn_every)
        bucket_mb = bucket_mb or job.s.bucket_mb
        self.plan = BucketPlan(named_params(optimizer, named_parameters),
                               max(1, int(bucket_mb * 2**20) // 4))
        # bf16 or fp16 gradients travel as such (compress auto: codec.wire_for),
        # not under wbsp, whose mean of k gradients is no longer of their dtype
        dtypes = {p.dtype for b in self.plan.buckets for p in b.params}
        wire = wire_for(job.s.compress, dtypes if sync == "bsp" else (),
                        deferred_answers(job.link))
        self.op = Op(STEP, sizes=self.plan.sizes, sync=sync, bubble=bubble,
                     early_close=json.dumps(early_close, sort_keys=True),
                     downlink=downlink or job.s.downlink, wire=wire)
        self.job, self.ex, self.rank = job, job.exchange, job.rank
        # on a GPU the host buffers are pinned: the copies to and from them are queued
        pin = any(p.device.type == "cuda" for b in self.plan.buckets for p in b.params)
        self.send_t = torch.zeros(self.plan.numel, dtype=torch.float32, pin_memory=pin)
        self.answer_t = torch.zeros(self.op.down_elems(job.workers), dtype=torch.float32,
                                    pin_memory=pin)
        self.send, self.answer = self.send_t.numpy(), self.answer_t.numpy()
        self.packing: dict = {}      # bucket -> CUDA event of its copies into send
        # the loss policy's wire is followed where LTP chooses the wire
        # (compress auto) for gradients that are all float32
        self.follows = job.s.compress == "auto" and dtypes == {torch.float32} and sync == "bsp"
        self.setup_codec(job.s, error_feedback)
        self.overlap = overlap and sync == "bsp"
        self.passes, self.warn_every = backward_passes_per_step, warn_every
        self.cur: StepState | None = None
        self.comm = CallThread("ltpx-comm") if self.overlap else None
        self.handles = [p.register_post_accumulate_grad_hook(functools.partial(self.on_grad, b.index))
                        for b in self.plan.buckets for p in b.params] if self.overlap else []
        self.steps = self.wholly_filled_total = self.k = 0
        self.ks: list[int] = []
        self.last_report: StepReport | None = None
        self.synced = False
        self.wait_s = 0.0
        self.phases = worker_phases()   # where each step's time goes (breakdown.py)
        job.optimizers.append(self)
        # The model and its optimizer exist: collect once and freeze what is
        # alive, so no full collection walks them during training (one
        # stalled a round by up to 0.7 s; the collection itself takes ~0.3 s,
        # here rather than inside the first step)
        quiet_gc()

    @staticmethod
    def check_options(sync, bubble, early_close, downlink, bucket_mb, passes, warn_every) -> None:
        if sync not in SYNCS:
            raise UsageError(f"DistributedOptimizer: sync must be bsp or wbsp, got {sync!r}")
        if bubble not in STRATEGIES:
            raise UsageError(f"DistributedOptimizer: bubble must be one of "
                             f"{', '.join(STRATEGIES)}, got {bubble!r}")
        try:
            EarlyCloseConfig(**early_close)
        except (TypeError, ValueError) as e:
            raise UsageError(f"DistributedOptimizer: early_close: {e}") from None
        if downlink not in (None, "group", "unicast"):
            raise UsageError(f"DistributedOptimizer: downlink must be group or unicast, "
                             f"got {downlink!r}")
        if bucket_mb is not None and not bucket_mb > 0:
            raise UsageError(f"DistributedOptimizer: bucket_mb must be positive, got {bucket_mb}")
        if passes < 1 or warn_every < 1:
            raise UsageError("DistributedOptimizer: backward_passes_per_step and warn_every "
                             "must be at least 1")

    def setup_codec(self, s, error_feedback: bool | None) -> None:
        """Compressed (the op's wire), each link encodes the buckets it pushes
        and leaves the rounding error in the send buffer; with error feedback
        it is kept (`residual`) and added to the next gradient of its bucket.
        A wire compress auto chose is the gradients' own dtype: nothing is
        rounded, nothing kept."""
        self.error_feedback = s.error_feedback if error_feedback is None else bool(error_feedback)
        self.residual = None
        self.carry = Carry(self.error_feedback)     # the loss policy's wire's (carry.py)
        self.wires: Counter = Counter()              # step ops by wire (Op.wire)
        if self.op.wire != "none" and self.error_feedback and s.compress != "auto":
            self.residual = np.zeros(self.plan.numel, dtype=np.float32)
            # a sharded push pads a bucket smaller than the servers (a copy): no
            # rounding error comes back for it
            self.ef_buckets = [b for b in self.plan.buckets if b.numel >= s.servers]

    def pack(self, b, add: bool = False) -> None:
        with self.phases.timed("staging"):
            ev = b.pack(self.send_t, add)
        if ev is not None:
            self.packing[b.index] = ev

    def push(self, run, i: int) -> None:
        ev = self.packing.pop(i, None)
        if ev is not None:   # its gradients' copies from the GPU are done
            ev.synchronize()
        b = self.plan.buckets[i]
        piece = self.send[b.lo:b.hi]
        if self.residual is not None:
            piece += self.residual[b.lo:b.hi]
        elif self.follows:     # the loss policy's wire: the links send piece as it is
            self.carry.into(i, piece, run.op)
        self.ex.push(run, i, piece)

    def keep_residual(self) -> None:
        """After a step's pushes: what the links left in the send buffer."""
        if self.residual is not None:
            for b in self.ef_buckets:
                np.copyto(self.residual[b.lo:b.hi], self.send[b.lo:b.hi])

    def follow(self, wire: str) -> None:
        """The loss policy's wire (a step's report) from the next step on."""
        if self.follows and wire != self.op.wire:
            self.op = replace(self.op, wire=wire, carry=wire != "none")

    def plan_run(self):
        self.wires[self.op.wire] += 1
        return plan_step(self.job, self.op)

    # ------------------------------------------------------------------ backward
    def begin_step(self) -> StepState:
        if self.cur is None:
            B = len(self.plan)
            self.cur = StepState(self.plan_run(),
                                 [len(b.params) * self.passes for b in self.plan.buckets],
                                 [False] * B)
        return self.cur

    def on_grad(self, b: int, p: torch.Tensor) -> None:
        """A parameter's gradient is complete (post-accumulate hook)."""
        st = self.begin_step()
        st.pending[b] -= 1
        if st.pending[b] < 0:
            raise UsageError("ltpx.torch: a gradient arrived after its bucket was sent; call "
                             "opt.step() after each backward, or give backward_passes_per_step")
        if st.pending[b] == 0:
            self.pack(self.plan.buckets[b])
            st.ready[b] = True
            self.hand_over(st)

    def hand_over(self, st: StepState) -> None:
        """Queue the ready buckets, in order, for the communication thread."""
        B = len(self.plan)
        while st.next < B and st.ready[st.next]:
            i = st.next
            st.next += 1
            if i == 0:
                self.comm.submit(functools.partial(self.first_push, st.run))
            self.comm.submit(functools.partial(self.push, st.run, i))

    def first_push(self, run) -> None:
        self.ex.prepare(run)
        self.ex.barrier(run)

    # ------------------------------------------------------------------ step
    def synchronize(self) -> bool:
        """Exchange this step's gradients; afterwards every .grad is the aggregate.
        False under wbsp while the slowest worker has not arrived (the model
        must not move yet)."""
        if self.synced:
            return True
        if self.op.sync == "wbsp":
            return self.sync_wbsp()
        st = self.begin_step()
        for b in self.plan.buckets:
            if not st.ready[b.index]:
                self.pack(b)
                st.ready[b.index] = True
        t0 = time.perf_counter()
        if self.overlap:
            self.hand_over(st)
            self.comm.drain()
            self.wait_s += time.perf_counter() - t0
        else:
            self.ex.prepare(st.run)
            self.ex.barrier(st.run)
            for b in self.plan.buckets:
                self.push(st.run, b.index)
        self.phases.add("push", time.perf_counter() - t0)
        self.cur = None
        self.ks.append(1)
        self.apply(self.pull(st.run))
        return True

    def pull(self, run) -> np.ndarray:
        with self.phases.timed("pull"):
            return self.ex.finish(run, self.answer)

    def sync_wbsp(self) -> bool:
        for b in self.plan.buckets:
            self.pack(b, add=self.k > 0)
        for ev in self.packing.values():   # the host buffer whole before it is added to
            ev.synchronize()
        self.packing.clear()
        self.k += 1
        if self.k == 1:
            self.wrun = self.plan_run()
            self.ex.prepare(self.wrun)
            self.ex.arrive(self.wrun)
        if not self.ex.co.gone(self.wrun.seq):
            return False
        if self.k > 1:
            self.send_t.div_(self.k)
        self.ex.co.set_k(self.wrun.seq, self.rank, self.k)
        with self.phases.timed("push"):
            for b in self.plan.buckets:
                self.push(self.wrun, b.index)
        self.ks.append(self.k)
        self.k = 0
        self.apply(self.pull(self.wrun))
        return True

    def apply(self, answer: np.ndarray) -> None:
        self.keep_residual()
        rep = StepReport.decode(answer[self.plan.numel:])
        self.follow(rep.policy.wire)
        moved = set()
        with self.phases.timed("copy_back"):
            for b in self.plan.buckets:
                moved |= b.apply(self.answer_t)
            for dev in moved:   # the copies out of answer done: the next step may write it
                torch.cuda.current_stream(dev).synchronize()
        self.steps += 1
        rep.step = self.steps     # this optimizer's step (the server counts every step op)
        seen = getattr(self.ex, "barrier_seen", None)   # bsp: this step's barrier
        if seen is not None:
            rep.barrier, self.ex.barrier_seen = seen, None
        self.note(rep)
        self.synced = True

    @contextlib.contextmanager
    def stepping(self):
        """Around the optimizer's own step, once synchronize() said True."""
        self.synced = False
        with self.phases.timed("optimizer"):
            yield
        self.phases.end_step()

    def reset(self) -> None:
        """Forget a step under way (elastic.py: a rejoining worker), and the
        rounding it carried (its state comes from the donor)."""
        self.carry.held.clear()
        self.cur = None
        self.synced = False
        self.k = 0

    def note(self, rep: StepReport) -> None:
        """Keep the report; warn when a worker's whole contribution was filled."""
        now = sum(rep.wholly_filled.values())
        before, self.wholly_filled_total = self.wholly_filled_total, self.wholly_filled_total + now
        rep.wholly_filled_total = self.wholly_filled_total
        self.last_report = rep
        crossed = before == 0 or before // self.warn_every < self.wholly_filled_total // self.warn_every
        bad = rep.nonfinite_workers
        if bad and (self.rank == 0 or self.rank in bad):
            flight_trigger("FilledWarning", f"step {rep.step}: non-finite from {bad}")
            warnings.warn(f"ltpx.torch step {rep.step}: worker(s) {bad} sent NaN or Inf in "
                          f"{sum(rep.nonfinite.values())} bucket(s); the server treated those "
                          "as lost and filled them, so every replica stays finite "
                          "(opt.last_report.nonfinite)", FilledWarning, stacklevel=3)
        if now and crossed and (self.rank == 0 or rep.wholly_filled.get(self.rank)):
            flight_trigger("FilledWarning", f"step {rep.step}: {now} bucket(s) wholly filled")
            warnings.warn(filled_text(rep, now, self.wholly_filled_total,
                                      self.gone(rep.missing_workers, rep)),
                          FilledWarning, stacklevel=3)

    def gone(self, workers: list[int], rep: StepReport) -> list[int]:
        """Which of `workers` are out of the job: absent from a barrier, dropped,
        or no longer beating (dead or hung), as this rank sees it."""
        co = self.job.coord
        return [w for w in workers if w in self.ex.lost or w in rep.absent
                or not co.worker_alive(w)]

    def times(self) -> dict:
        """Seconds this worker spent at barriers, pushing, pulling, and waiting in
        step() for pushes backward had started."""
        return {**self.ex.times, "wait_s": self.wait_s}

    def drain(self) -> None:
        if self.comm is not None:
            self.comm.drain()

    def close(self, wait_s: float = 10.0) -> None:
        """Remove the hooks; end the communication thread, waiting up to
        wait_s for what it still pushes."""
        for h in self.handles:
            h.remove()
        self.handles = []
        if self.comm is not None:
            self.comm.close(wait_s)
            self.comm = None
