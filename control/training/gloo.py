# SPDX-License-Identifier: Apache-2.0
"""The gloo baseline: every rank a DistributedDataParallel worker, no parameter server.

Backward all-reduces the gradients (their mean over the workers), so every
replica steps alike; rank 0 also evaluates and reports. Same data, model,
seeds and straggler slow-down as the parameter-server runs, so the numbers
compare like with like (bsp only: there is no PS to weight wbsp's uploads).
"""
from __future__ import annotations

import time
from datetime import timedelta

import torch

from ..torchapi import breakdown
from ..torchapi.settings import Settings
from .context import Coord, RankContext
from .config import iterations_per_epoch
from .data import BatchStream, Split, split
from .local import Clock, Evaluator, Stepper, eval_due, setup_torch
from .model import build_mlp, param_digest
from ..torchapi.job import joined, shutdown
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def calibrate(stepper: Stepper, module: torch.nn.Module, data: Split, ctx: RankContext) -> None:
    """Time one local step (not synced), so a straggler's first sleep has a
    measure: under DDP it sleeps before backward, on the previous step's time."""
    cfg = ctx.cfg
    xb, yb = BatchStream(data, ctx.worker_id, ctx.workers, cfg.batch, cfg.seed + 1).next()
    t0 = time.thread_time()
    torch.nn.functional.cross_entropy(module(torch.from_numpy(xb)),
                                      torch.from_numpy(yb)).backward()
    stepper.last_c = time.thread_time() - t0
    module.zero_grad(set_to_none=True)


def run_gloo(ctx: RankContext, backend: str = "gloo") -> dict:
    """backend gloo, or ltp (`ltp train --transport ddp-ltp`: the rank has
    joined the LTP job already; DDP's buckets then go over LTP)."""
    setup_torch(ctx.cfg.seed)
    co = Coord(ctx.store, ctx.workers, ctx.timeout_s)   # sets the store's timeout first
    dist.init_process_group(backend, store=ctx.store, rank=ctx.rank, world_size=ctx.world,
                            timeout=timedelta(seconds=ctx.timeout_s))
    try:
        return _train(ctx, co)
    finally:
        dist.destroy_process_group()


def _train(ctx: RankContext, co: Coord) -> dict:
    cfg, W, wid = ctx.cfg, ctx.workers, ctx.worker_id
    data = split(cfg.seed)
    module = build_mlp(cfg.hidden, cfg.seed)
    stepper = Stepper(module, cfg.straggler.get(wid, 1.0))
    stream = BatchStream(data, wid, W, cfg.batch, cfg.seed)
    calibrate(stepper, module, data, ctx)
    # buckets of ltpx.torch's size (4 MB, not DDP's 25): gradients leave while
    # backward runs, as in the parameter-server runs it is compared with
    ddp = DDP(module, bucket_cap_mb=Settings.bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    ipe = iterations_per_epoch(len(data.x_train), W, cfg.batch)
    total = cfg.total_iterations(len(data.x_train), W)
    stepper.module = ddp
    clock = Clock()
    lead = ctx.rank == 0
    ev = Evaluator(module, data, clock, ctx.emit, cfg.target_accuracy) if lead else None
    if lead:
        ctx.emit({"event": "start", "transport": cfg.transport, "sync": "bsp", "workers": W,
                  "iterations": total, "iterations_per_epoch": ipe,
                  "params": sum(p.numel() for p in module.parameters())})
        ev(0, 0.0)
    dist.barrier()
    timer = StepTimer() if joined() is not None else None   # ddp-ltp: the breakdown
    clock.start()
    for t in range(1, total + 1):
        if timer is None:
            opt.zero_grad()
            stepper.step(stream)            # backward all-reduces (mean over workers)
            opt.step()
        else:
            timer.step(opt, stepper, stream)
        if lead:
            ctx.emit({"event": "iter", "t": t, "of": total, "epoch": round(t / ipe, 3),
                      "wall_s": clock.elapsed(), "reason": "complete", "delivered": 1.0,
                      "k": [1] * W})
            if eval_due(t, total, ipe, cfg.eval_every):
                ev(t, t / ipe)
    wall = clock.elapsed()
    vec = torch.nn.utils.parameters_to_vector(module.parameters()).detach().numpy()
    digest = param_digest(vec)
    co.set_json(f"done/{wid}", {"worker": wid, "digest": digest,
                                "times": {"compute_s": round(stepper.compute_s, 4),
                                          "straggle_s": round(stepper.straggle_s, 4)},
                                "breakdown": breakdown.worker_summary()})
    if not lead:
        return {"event": "worker_done", "worker": wid, "digest": digest}
    done = {w: co.get_json(f"done/{w}") for w in range(W)}
    return _result(ctx, ev, done, total=total, ipe=ipe, wall=wall, params=int(vec.size))


def _result(ctx: RankContext, ev: Evaluator, done: dict[int, dict], *, total: int, ipe: int,
            wall: float, params: int) -> dict:
    """Rank 0's result: the keys of the PS's (ps.PsRun.result) but ps_times and downlink."""
    W = ctx.workers
    ltp = ltp_rounds()
    server = server_summary()
    return {
        "event": "result", "transport": ctx.cfg.transport, "sync": "bsp", "workers": W,
        "cc": None, "bubble": None, **ev.summary(total=total, ipe=ipe, wall=wall, params=params),
        "delivered_fraction": ltp.get("delivered", 1.0),
        "rounds_early_closed": ltp.get("early_buckets", 0),
        "rounds_by_reason": {"complete": total}, "round_s_median": None, "ltp": ltp or None,
        **ev.target_fields(), "local_steps": {str(w): total for w in range(W)},
        "ps_digest": None, "worker_digests": {str(w): done[w]["digest"] for w in range(W)},
        "replicas_identical": len({d["digest"] for d in done.values()}) == 1,
        "version_chain": None,
        "worker_times": {str(w): done[w]["times"] for w in range(W)},
        "ps_times": server.get("ps_times"),
        "streamed_answers": server.get("streamed_answers"),
        "breakdown": breakdown.combine(
            {w: d.get("breakdown") for w, d in done.items()},
            [s.get("breakdown") for s in server.get("servers") or [server]] if server else [],
            wall / total if total else None) if ltp else None,
        **ev.tail(ctx.cfg),
    }


class StepTimer:
    """A DDP step over the `ltp` backend, timed by phase (breakdown.py): the
    reducer waits for the answers inside backward, from the last bucket's
    hand-off (TolerantReduce.handed) to backward's end."""

    def __init__(self):
        self.phases = breakdown.worker()
        self.phases.discard()       # the set-up's ops are no step

    def step(self, opt, stepper: Stepper, stream: BatchStream) -> None:
        ph = self.phases
        ph.start_step()
        opt.zero_grad()
        t0, staged = time.perf_counter(), ph.get("staging")
        stepper.step(stream)
        t1 = time.perf_counter()
        red = getattr(joined(), "tolerant", None)
        wait = t1 - red.handed if red is not None and red.handed > t0 else 0.0
        split = breakdown.ddp_wait(wait, ph.get("comm_pull"), ph.get("comm_copy_back"))
        for name, v in split.items():
            ph.add(name, v)
        ph.add("compute", max(0.0, t1 - t0 - (ph.get("staging") - staged) - wait))
        with ph.timed("optimizer"):
            opt.step()
        ph.end_step()


def server_summary() -> dict:
    """ddp-ltp, on the lead: the LTP job ended (every trainer's
    destroy_process_group says goodbye too) and its server's summary; gloo: {}."""
    if joined() is None:
        return {}
    return shutdown() or {}


def ltp_rounds() -> dict:
    """ddp-ltp: what the LTP rounds of this rank's buckets did (ddp.TolerantReduce:
    buckets, early_buckets, delivered, ...); gloo: {}."""
    job = joined()
    red = job.tolerant if job is not None else None
    if red is None:
        return {}
    return red.stats()
