"""The parameter server's loop: rank 0 with transports ltp and tcp.

The PS holds the model and a torch.optim.SGD optimizer. Per iteration t it
gathers one gradient row per worker (LTP: after Early Close and Bubble
Filling), aggregates them into the flat gradient buffer, steps, and
broadcasts the parameters (version t). Under wbsp each worker's row is the
mean of its k local gradients, and the PS weights it by k (worker.py).

Aggregation is accumulated in float64 and rounded once to float32: with equal
weights it is exactly RoundResult.aggregate, so LTP with nothing lost and TCP
produce the same bits.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ..transport.rate import quiet_gc
from .config import iterations_per_epoch
from .context import Coord, RankContext
from .data import split
from .local import Clock, Evaluator, VersionChain, eval_due, setup_torch
from .model import FlatModel, build_mlp


def aggregate_into(out: np.ndarray, values: np.ndarray, weights: list[int] | None = None) -> None:
    """out (float32) = weighted mean of the rows of values, accumulated in float64.

    Equal weights give values.mean(axis=0, dtype=float64) rounded once to
    float32: bit for bit RoundResult.aggregate."""
    if weights is None or len(set(weights)) == 1:
        np.copyto(out, values.mean(axis=0, dtype=np.float64), casting="same_kind")
        return
    w = np.asarray(weights, dtype=np.float64)
    acc = np.zeros(values.shape[1], dtype=np.float64)
    for i in range(values.shape[0]):
        acc += w[i] * values[i]
    acc /= w.sum()
    np.copyto(out, acc, casting="same_kind")


def ps_comm(ctx: RankContext, nelems: int, ids: list[int]):
    """The PS's side of the transport: comm.LtpPs or comm.TcpPs."""
    # comm is imported here: it brings scapy and the XDP loader, which a gloo
    # rank never needs
    from . import comm as C
    cfg = ctx.cfg
    if cfg.transport != "ltp":
        return C.TcpPs(ctx.ip, ctx.tcp_port, ids, nelems, cc=cfg.cc, timeout_s=ctx.timeout_s)
    from ..transport.early_close import EarlyCloseConfig
    wait_s = min(ctx.timeout_s, 60.0)   # one round's hard limit; a whole rank may wait longer
    ec = {"hard_timeout_s": wait_s, **ctx.early_close}
    if ctx.deadline_min_s is not None:
        ec["min_deadline_s"] = ctx.deadline_min_s
    return C.LtpPs(ctx.dev, ctx.ip, ids, nelems, ns=ctx.netns, mode=ctx.xdp_mode,
                   capacity_bps=ctx.capacity_bps, mtu=ctx.mtu, job=ctx.job, bubble=cfg.bubble,
                   early_close=EarlyCloseConfig(**ec), timeout_s=wait_s,
                   group=ctx.group if cfg.downlink == "group" else None)


class RoundTally:
    """What the PS counts over the rounds: why each closed, what arrived, local
    steps per worker, and where its own time went."""

    def __init__(self, workers: int):
        self.reasons: dict[str, int] = {}
        self.delivered: list[float] = []
        self.round_s: list[float] = []
        self.ks = np.zeros(workers, dtype=np.int64)
        self.times = dict.fromkeys(("gather_s", "update_s", "broadcast_s"), 0.0)

    def add(self, g, ks: list[int]) -> None:
        self.reasons[g.reason] = self.reasons.get(g.reason, 0) + 1
        self.delivered.append(g.delivered_fraction)
        self.ks += ks
        self.round_s.append(g.duration_s)

    def fields(self) -> dict:
        return {"delivered_fraction": float(np.mean(self.delivered)) if self.delivered else 1.0,
                "rounds_early_closed": self.reasons.get("early", 0)
                + self.reasons.get("deadline", 0),
                "rounds_by_reason": self.reasons,
                "round_s_median": float(np.median(self.round_s)) if self.round_s else None}


class PsRun:
    """One parameter server's run: set up, then `run()` returns the result dict."""

    def __init__(self, ctx: RankContext):
        cfg = self.cfg = ctx.cfg
        setup_torch(cfg.seed)
        self.ctx = ctx
        self.ids = list(range(ctx.workers))
        self.co = Coord(ctx.store, ctx.workers, ctx.timeout_s)
        data = split(cfg.seed)
        module = build_mlp(cfg.hidden, cfg.seed)
        self.flat = FlatModel(module)
        self.opt = torch.optim.SGD(module.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        self.ipe = iterations_per_epoch(len(data.x_train), ctx.workers, cfg.batch)
        self.total = cfg.total_iterations(len(data.x_train), ctx.workers)
        self.comm = ps_comm(ctx, self.flat.n, self.ids)
        self.clock = Clock()
        self.ev = Evaluator(module, data, self.clock, ctx.emit, cfg.target_accuracy)
        self.chain = VersionChain(cfg.verify_versions)
        self.tally = RoundTally(ctx.workers)

    def run(self) -> dict:
        co, flat = self.co, self.flat
        try:
            self.start()
            for t in range(1, self.total + 1):
                self.round(t)
            wall = self.clock.elapsed()
            co.set_json("fin", {"t": self.total})
            flat.check_views()
            done = {w: co.get_json(f"done/{w}") for w in self.ids}
        finally:
            self.comm.close()
        return self.result(done, wall)

    def start(self) -> None:
        """Meet the workers, evaluate the initial model, send version 0."""
        ctx, cfg, comm = self.ctx, self.cfg, self.comm
        self.co.set_json("meta/0", ctx.meta("ps", {"transport": comm.name, **comm.address(),
                                                   "nelems": self.flat.n,
                                                   "iterations": self.total}))
        comm.connect({w: self.co.get_json(f"meta/{w + 1}") for w in self.ids})
        ctx.emit({"event": "start", "transport": cfg.transport, "sync": cfg.sync,
                  "workers": ctx.workers, "iterations": self.total,
                  "iterations_per_epoch": self.ipe, "params": self.flat.n})
        self.ev(0, 0.0)
        quiet_gc()
        comm.open(1)
        self.clock.start()
        comm.broadcast(0, self.flat.param_np)
        self.chain.add(self.flat.param_np)

    def round(self, t: int) -> None:
        """Gather round t, step, send version t."""
        cfg, comm, flat, times = self.cfg, self.comm, self.flat, self.tally.times
        t0 = time.perf_counter()
        g = comm.gather(t)
        t1 = time.perf_counter()
        ks = self.co.get_k(t, self.ids) if cfg.sync == "wbsp" else [1] * len(self.ids)
        aggregate_into(flat.grad_np, g.values, ks)
        self.opt.step()
        if t < self.total:     # the next uplink round is receivable before anyone can push
            comm.open(t + 1)
        t2 = time.perf_counter()
        times["gather_s"] += t1 - t0
        times["update_s"] += t2 - t1
        self.tally.add(g, ks)
        self.ctx.emit({"event": "iter", "t": t, "of": self.total,
                       "epoch": round(t / self.ipe, 3), "wall_s": self.clock.elapsed(),
                       "reason": g.reason, "delivered": g.delivered_fraction,
                       "filled_chunks": g.filled_chunks, "round_s": g.duration_s, "k": ks})
        if eval_due(t, self.total, self.ipe, cfg.eval_every):
            self.ev(t, t / self.ipe)
        t3 = time.perf_counter()
        comm.broadcast(t, flat.param_np)
        times["broadcast_s"] += time.perf_counter() - t3
        self.chain.add(flat.param_np)

    def result(self, done: dict[int, dict], wall: float) -> dict:
        cfg, ids, ev = self.cfg, self.ids, self.ev
        ltp = cfg.transport == "ltp"
        digest = self.flat.digest()
        chain = self.chain.hexdigest()
        return {
            "event": "result", "transport": cfg.transport, "sync": cfg.sync,
            "workers": len(ids), "cc": cfg.cc if cfg.transport == "tcp" else None,
            "bubble": cfg.bubble if ltp else None, "downlink": cfg.downlink if ltp else None,
            **ev.summary(total=self.total, ipe=self.ipe, wall=wall, params=self.flat.n),
            **self.tally.fields(), **ev.target_fields(),
            "local_steps": {str(w): int(self.tally.ks[i]) for i, w in enumerate(ids)},
            "ps_digest": digest, "worker_digests": {str(w): done[w]["digest"] for w in ids},
            "replicas_identical": all(done[w]["digest"] == digest for w in ids),
            "version_chain": ({"ps": chain, "workers": {str(w): done[w]["chain"] for w in ids}}
                              if chain is not None else None),
            "worker_times": {str(w): done[w]["times"] for w in ids},
            "ps_times": {k: round(v, 4) for k, v in self.tally.times.items()},
            **ev.tail(cfg),
        }


def run_ps(ctx: RankContext) -> dict:
    return PsRun(ctx).run()
