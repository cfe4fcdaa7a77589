# SPDX-License-Identifier: Apache-2.0
"""The built-in job on the public API: `ltp train`'s LTP and TCP runs, a user of ltpx.torch.

Every worker builds the MLP (control/training/model.py), takes worker 0's
parameters (broadcast_parameters), wraps SGD in a DistributedOptimizer and
trains on its shard of the digits (data.py); a step is zero_grad, forward,
backward (Stepper: with the straggler's slow-down), opt.step(). Under wbsp
opt.step() moves the model only once the slowest worker has arrived, so the
loop runs until `opt.steps` reaches the iteration count.

Worker 0 is the lead: it evaluates (clock paused), prints the JSON events
(start, iter, eval) `ltp train` follows, and at the end the result, with
every worker's summary (digest, version chain, local steps, times, through
the store) and the server's times. Its replica is the one evaluated, so its
digest is reported as `ps_digest` (the key the PS's model had before the
server stopped keeping one).

Faults: a worker the job went on without (coord.Excluded at its step) or
one restarted into a running job (elastic.joining) rejoins with the state
the lowest present worker hands it (elastic.py; every worker calls
`donate` after its step); with --checkpoint-every N worker 0 saves a
checkpoint every N steps to --checkpoint-dir, and a new job resumes from the
newest (checkpoint.py). The result names the workers lost and rejoined and
the step resumed from.
"""
from __future__ import annotations

import hashlib
import json
import time
from array import array

import numpy as np
import torch

from ..torchapi import (DistributedOptimizer, broadcast_parameters, digest, rank, shutdown,
                        size)
from ..torchapi import breakdown, checkpoint, elastic, trace
from ..torchapi.coord import Excluded
from ..torchapi.job import current
from ..torchapi.link_ltp_worker import LtpWorkerLink
from .config import TrainConfig, iterations_per_epoch
from .data import BatchStream, split
from .local import Clock, Evaluator, Stepper, VersionChain, eval_due, setup_torch
from .model import build_mlp
from ..transport.straggler import WAITED_REASONS
from .straggler_report import BarrierNotes, attribute_steps

EARLY = ("early", "deadline")


class Demo:
    """One worker's run of the built-in job; `run()` returns its result."""

    def __init__(self, cfg: TrainConfig, early_close: dict, emit):
        setup_torch(cfg.seed)
        self.cfg, self.emit = cfg, emit
        self.W, self.wid = size(), rank()
        self.lead = self.wid == 0
        data = self.data = split(cfg.seed)
        self.module = build_mlp(cfg.hidden, cfg.seed)
        self.params = sum(p.numel() for p in self.module.parameters())
        self.stream = BatchStream(data, self.wid, self.W, cfg.batch, cfg.seed)
        self.stepper = Stepper(self.module, cfg.straggler.get(self.wid, 1.0))
        self.ipe = iterations_per_epoch(len(data.x_train), self.W, cfg.batch)
        self.total = cfg.total_iterations(len(data.x_train), self.W)
        self.early_close = early_close
        self.clock = Clock()
        self.chain = VersionChain(cfg.verify_versions)
        # Running figures, not every step's report: a soak runs for hours
        # (keeping each StepReport grew a worker by 1.2 KB a step).
        self.reasons: dict[str, int] = {}
        self.delivered_sum = 0.0
        self.filled_error = array("d")   # per step, the ledger's worst bucket (vs noise)
        self.round_s = array("d")      # 8 bytes a round, for the median
        self.last_report = None
        self.loss_sum, self.loss_n = 0.0, 0
        self.resumed_from: int | None = None
        self.missing: dict[int, int] = {}   # worker -> steps it was named missing in
        self.nic: dict[int, int] = {}       # step -> the worker its server named straggler
        self.nic_late: dict[int, float] = {}   # step -> that worker's lateness there, s
        self.notes = BarrierNotes()         # this worker's view of the steps' barriers
        self.lateness: dict[int, array] = {}   # worker -> its lateness per step, s
        self.wall0 = 0.0            # training seconds before the checkpoint resumed from

    def run(self) -> dict:
        cfg, module = self.cfg, self.module
        opt = DistributedOptimizer(
            torch.optim.SGD(module.parameters(), lr=cfg.lr, momentum=cfg.momentum),
            named_parameters=module.named_parameters(), sync=cfg.sync, bubble=cfg.bubble,
            early_close=self.early_close, downlink=cfg.downlink)
        ev = self.ev = Evaluator(module, self.data, self.clock, self.emit,
                                 cfg.target_accuracy) if self.lead else None
        if not self.begin(opt):
            return self.leave()
        if self.lead:
            self.emit({"event": "start", "transport": cfg.transport, "sync": cfg.sync,
                       "workers": self.W, "iterations": self.total,
                       "iterations_per_epoch": self.ipe, "params": self.params,
                       "resumed_from": self.resumed_from})
            if not ev.curve and not current().exchange.rejoined:
                self.evaluate(0)   # (a lead that rejoined has no curve: it starts mid-job)
        self.add_version()
        self.clock.start()
        phases = breakdown.worker()
        phases.discard()              # the set-up's ops (the broadcast) are no step
        while opt.steps < self.total:
            t_step = time.monotonic()
            phases.start_step()       # opt.step() ends it (the step's breakdown)
            opt.zero_grad()
            self.compute(phases)
            self.loss_n += 1
            before = opt.steps
            try:
                opt.step()
            except Excluded:           # the job went on without this worker: come back
                if not self.synced(elastic.rejoin(opt)):
                    return self.leave()
                continue
            if opt.steps > before:
                self.stepped(opt)
            elastic.donate(opt, self.extra())
            self.maybe_save(opt)
            if cfg.pace_s:
                time.sleep(max(0.0, cfg.pace_s - (time.monotonic() - t_step)))
        return self.finish(opt)

    def compute(self, phases) -> None:
        """Forward and backward on the next batch; its wall time but the
        staging backward's hooks did is the step's compute."""
        t0, staged = time.perf_counter(), phases.get("staging")
        self.loss_sum += self.stepper.step(self.stream)
        phases.add("compute", time.perf_counter() - t0 - (phases.get("staging") - staged))

    def begin(self, opt) -> bool:
        """The replicas' first state: a member's (this worker rejoins a running
        job), a checkpoint's (a restarted job), or worker 0's. False if the job
        ended before this worker was admitted."""
        if elastic.joining():
            return self.synced(elastic.rejoin(opt))
        if self.cfg.checkpoint_dir and self.synced(
                checkpoint.resume(opt, self.cfg.checkpoint_dir, self.fingerprint())):
            return True
        broadcast_parameters(self.module.state_dict(), root_rank=0)
        return True

    def synced(self, extra: dict | None) -> bool:
        """Take the script's part of a state this worker was handed."""
        if extra is None:
            return False
        self.stream = BatchStream(self.data, self.wid, self.W, self.cfg.batch, self.cfg.seed)
        for _ in range(extra.get("drawn", 0)):   # where this worker's batches would be
            self.stream.next()
        if "resumed_from" in extra:
            self.resumed_from = extra["resumed_from"]
            if self.lead:
                self.ev.curve = list(extra.get("curve", []))
                self.wall0 = extra.get("wall", 0.0)
        return True

    def extra(self) -> dict:
        """The script's part of the state a joiner or a checkpoint takes (bsp:
        every worker has drawn one batch per step)."""
        return {"drawn": self.stream.drawn}

    def fingerprint(self) -> str:
        """What a checkpoint must match to be resumed from: the job's config
        (not how it was sent: both senders train the same parameters)."""
        d = json.loads(self.cfg.to_json())
        for k in ("checkpoint_dir", "checkpoint_every", "max_missed", "sender"):
            d.pop(k, None)
        d["workers"] = self.W
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def maybe_save(self, opt) -> None:
        every = self.cfg.checkpoint_every
        if self.lead and every and self.cfg.checkpoint_dir and opt.steps % every == 0 \
                and opt.steps < self.total:
            checkpoint.save(self.cfg.checkpoint_dir, opt,
                            {**self.extra(), "curve": self.ev.curve,
                             "wall": self.wall0 + self.clock.elapsed()}, self.fingerprint())

    def leave(self) -> dict:
        """The job ended before this worker was admitted back."""
        shutdown()
        return {"event": "worker_done", "worker": self.wid, "rejoined": False}

    def finish(self, opt) -> dict:
        wall = self.wall0 + self.clock.elapsed()
        mine = self.summary(opt)
        co = current().coord
        co.set_json(f"user/train/done/{self.wid}", mine)
        if not self.lead:
            shutdown()
            return {"event": "worker_done", **mine}
        ex = current().exchange
        ids = sorted(ex.co.view.members)   # a sharded job's: its servers' (the root's has none)
        done = {w: co.get_json(f"user/train/done/{w}") for w in ids}
        server = shutdown() or {}
        res = self.result(done, server, wall)
        if self.cfg.trace:    # the servers wrote their view; the whole job's replaces it
            sums = server.get("servers") or [server]
            trace.write(self.cfg.trace, trace.chrome_trace(
                {s: d.get("timeline", []) for s, d in enumerate(sums)},
                {w: d.get("timeline", []) for w, d in done.items()},
                {"job": "ltp train", "workers": self.W, "steps": len(self.round_s),
                 # the mean step the run's straggler margin came from: a summary
                 # of the trace names the steps `-j` named (its own estimate from
                 # the slices' span differed by enough to flip one step in 30)
                 "step_s": wall / len(self.round_s) if self.round_s else 0.0}))
            res["trace"] = self.cfg.trace
        res.update(workers_lost=sorted(ex.lost), workers_rejoined=sorted(ex.rejoined),
                   resumed_from=self.resumed_from, workers_present=ids,
                   lost_at={str(w): t for w, t in sorted(ex.lost.items())},
                   dropped_at={str(w): t for w, t in sorted(ex.dropped.items())},
                   rejoined_at={str(w): t for w, t in sorted(ex.rejoined.items())},
                   missing_steps={str(w): n for w, n in sorted(self.missing.items())})
        return res

    def add_version(self) -> None:
        if self.cfg.verify_versions:
            self.chain.add(torch.nn.utils.parameters_to_vector(
                self.module.parameters()).detach().numpy())

    def stepped(self, opt: DistributedOptimizer) -> None:
        t, rep = opt.steps, opt.last_report
        self.add_version()
        self.reasons[rep.reason] = self.reasons.get(rep.reason, 0) + 1
        for w in rep.missing_workers:    # named missing: nothing of it arrived in a round
            self.missing[w] = self.missing.get(w, 0) + 1
        self.delivered_sum += rep.delivered_fraction
        if rep.straggler is not None:    # the worker the step waited for (the NIC's times)
            self.nic[rep.step] = rep.straggler
            # a round cut by its deadline waited for it, whatever its last chunk's time
            self.nic_late[rep.step] = float("inf") if rep.reason in WAITED_REASONS else \
                rep.lateness.get(rep.straggler, float("inf"))
        self.notes.add(rep)
        for w, v in rep.lateness.items():
            self.lateness.setdefault(w, array("d")).append(v)
        self.round_s.append(rep.gather_s)
        self.filled_error.append(rep.filled_error)
        self.last_report = rep
        if not self.lead:
            return
        self.emit({"event": "iter", "t": t, "of": self.total, "epoch": round(t / self.ipe, 3),
                   "wall_s": self.clock.elapsed(), "reason": rep.reason,
                   "delivered": rep.delivered_fraction,
                   "filled_chunks": sum(rep.filled_chunks.values()), "round_s": rep.gather_s,
                   "k": rep.ks, "straggler": rep.straggler})
        if eval_due(t, self.total, self.ipe, self.cfg.eval_every):
            self.evaluate(t)

    def evaluate(self, t: int) -> None:
        """The lead's evaluation after step t: the next step's wait for it is
        no straggler's (straggler_report.py)."""
        self.ev(t, t / self.ipe)
        current().exchange.set_aside("evaluation")

    def summary(self, opt: DistributedOptimizer) -> dict:
        """What the lead learns of this worker at the end."""
        times = dict(opt.times(), compute_s=self.stepper.compute_s,
                     straggle_s=self.stepper.straggle_s)
        link = current().link
        return {"worker": self.wid, "digest": digest(self.module),
                "uplink": dict(link.uplink), "sender": _sender_choice(link),
                "chain": self.chain.hexdigest(), "local_steps": int(sum(opt.ltp.ks)),
                "ks": opt.ltp.ks, "versions": self.total + 1, "wires": dict(opt.ltp.wires),
                "mean_loss": self.loss_sum / self.loss_n if self.loss_n else None,
                "barrier": self.notes.to_dict(), "breakdown": breakdown.worker_summary(),
                **({"timeline": current().exchange.timeline.records()} if self.cfg.trace
                   else {}),
                "times": {k: round(v, 4) for k, v in times.items()}}

    def straggler_fields(self, done: dict[int, dict], wall: float) -> dict:
        """Who the steps waited for (straggler_report.py, docs/slow-or-stuck.md): per
        worker the steps it was named the straggler of, the steps that named
        one, and per worker its lateness at the NIC, p50 and p99 (ms)."""
        n = len(self.round_s)
        notes = {w: d["barrier"] for w, d in done.items() if d.get("barrier")}
        return {**attribute_steps(notes, self.nic, n, wall / n if n else 0.0,
                                  nic_late=self.nic_late),
                "lateness_ms": {str(w): {"p50": round(float(np.percentile(v, 50)) * 1e3, 3),
                                         "p99": round(float(np.percentile(v, 99)) * 1e3, 3)}
                                for w, v in sorted(self.lateness.items()) if len(v)}}

    @staticmethod
    def sender_fields(done: dict[int, dict]) -> dict:
        """LTP: the sender the workers' endpoints chose (one name, or the
        names joined when they differ) and why (the distinct reasons)."""
        picks = [d["sender"] for d in done.values() if d.get("sender")]
        if not picks:
            return {"sender": None, "sender_why": None}
        return {"sender": ",".join(sorted({p["sender"] for p in picks})),
                "sender_why": "; ".join(dict.fromkeys(p["why"] for p in picks))}

    @staticmethod
    def uplink_fields(done: dict[int, dict]) -> dict:
        """LTP: the workers' pushes, those the socket sent, their DATA and
        the share of it the ACK clock made."""
        ups = [d.get("uplink") or {} for d in done.values()]
        sent = sum(u.get("sent", 0) for u in ups)
        if not sent:
            return {}
        return {"uplink_sent": sent,
                "uplink_clock_share": sum(u.get("clock_tx", 0) for u in ups) / sent,
                "uplink_pushes": sum(u.get("pushes", 0) for u in ups),
                "uplink_socket_pushes": sum(u.get("socket_pushes", 0) for u in ups)}

    def result(self, done: dict[int, dict], server: dict, wall: float) -> dict:
        cfg, ids = self.cfg, sorted(done)
        ltp = cfg.transport == "ltp"
        reasons, n = self.reasons, len(self.round_s)
        mine = done[0]
        ev_fields = self.ev.summary(total=self.total, ipe=self.ipe, wall=wall,
                                    params=self.params)
        chain = mine["chain"]
        return {
            "event": "result", "transport": cfg.transport, "sync": cfg.sync, "workers": self.W,
            "cc": cfg.cc if cfg.transport == "tcp" else None,
            "bubble": cfg.bubble if ltp else None, "downlink": cfg.downlink if ltp else None,
            **ev_fields,
            "delivered_fraction": self.delivered_sum / n if n else 1.0,
            "rounds_early_closed": sum(v for k, v in reasons.items() if k in EARLY),
            "rounds_by_reason": reasons,
            "round_s_median": float(np.median(self.round_s)) if n else None,
            "wholly_filled_rounds": self.last_report.wholly_filled_total if n else 0,
            # the loss ledger: the filled part's error against the aggregate's noise
            "filled_error_mean": float(np.mean(self.filled_error)) if n else 0.0,
            "filled_error_max": float(np.max(self.filled_error)) if n else 0.0,
            **self.ev.target_fields(),
            **self.straggler_fields(done, wall),
            "local_steps": {str(w): done[w]["local_steps"] for w in ids},
            # steps by what the gradients travelled as (Op.wire: the loss policy's)
            "wires": {str(w): done[w].get("wires") for w in ids},
            "ps_digest": mine["digest"],
            "worker_digests": {str(w): done[w]["digest"] for w in ids},
            "replicas_identical": len({done[w]["digest"] for w in ids}) == 1,
            "version_chain": ({"ps": chain, "workers": {str(w): done[w]["chain"] for w in ids}}
                              if chain is not None else None),
            "worker_times": {str(w): done[w]["times"] for w in ids},
            **self.sender_fields(done),
            **self.uplink_fields(done),
            "ps_times": server.get("ps_times"),
            "streamed_answers": server.get("streamed_answers"),
            "breakdown": breakdown.combine(
                {w: d.get("breakdown") for w, d in done.items()},
                [s.get("breakdown") for s in server.get("servers") or [server]],
                wall / n if n else None),
            "downlink_deferred": server.get("downlink_deferred"),
            # server 0's (each server chooses for its own slice)
            "loss_choices": (server.get("servers") or [server])[0].get("loss_policy"),
            **self.ev.tail(cfg),
        }


def _sender_choice(link) -> dict | None:
    """The sender this worker's LTP endpoint chose and why (SenderChoice);
    None for other transports or before its first push."""
    for part in link.parts():
        if isinstance(part, LtpWorkerLink) and part.ep is not None:
            return part.ep.sender_choice.to_dict()
    return None


def run_demo(cfg: TrainConfig, early_close: dict, emit) -> dict:
    return Demo(cfg, early_close, emit).run()
