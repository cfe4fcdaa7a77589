"""A worker's loop (ranks 1.. with transports ltp and tcp): pull version t-1, compute, push round t.

  bsp   one mini-batch gradient per round; every worker waits at the round's
        barrier until all have computed, then all push at once.
  wbsp  worker-busy synchronous parallel: after its first gradient a worker
        arrives at the barrier, but instead of waiting it keeps computing
        gradients on further mini-batches, on the same (current) model,
        accumulating them, until the slowest worker arrives. Then every
        worker pushes the average of its k gradients and reports k. The PS
        weights each worker's upload by k:  g = sum_i k_i g_i / sum_i k_i,
        which is the plain mean over every mini-batch gradient computed in
        the round. The global model still moves once per round, when the
        slowest worker's upload is in, so every worker pulls the same version.

The barrier and the k values go through the rendezvous store (context.Coord),
the tensors through the transport (comm.py).
"""
from __future__ import annotations

import time

import numpy as np

from ..transport.rate import quiet_gc
from .context import Coord, RankContext
from .data import BatchStream, split
from .local import Stepper, VersionChain, setup_torch
from .model import FlatModel, build_mlp


def worker_comm(ctx: RankContext, nelems: int):
    """This worker's side of the transport: comm.LtpWorker or comm.TcpWorker."""
    from . import comm as C   # here: scapy and the XDP loader load only when used
    cfg = ctx.cfg
    if cfg.transport != "ltp":
        return C.TcpWorker(ctx.worker_id, nelems, cc=cfg.cc, timeout_s=ctx.timeout_s)
    return C.LtpWorker(ctx.dev, ctx.ip, ctx.worker_id, nelems, workers=ctx.workers,
                       ns=ctx.netns, mode=ctx.xdp_mode, capacity_bps=ctx.capacity_bps,
                       mtu=ctx.mtu, job=ctx.job, timeout_s=min(ctx.timeout_s, 60.0))


class WorkerRun:
    """One worker's run: set up, then `run()` returns its `worker_done` dict."""

    def __init__(self, ctx: RankContext):
        cfg = self.cfg = ctx.cfg
        setup_torch(cfg.seed)
        self.ctx, self.wid = ctx, ctx.worker_id
        self.co = Coord(ctx.store, ctx.workers, ctx.timeout_s)
        data = split(cfg.seed)
        module = build_mlp(cfg.hidden, cfg.seed)
        self.flat = FlatModel(module)
        self.stream = BatchStream(data, self.wid, ctx.workers, cfg.batch, cfg.seed)
        self.stepper = Stepper(module, cfg.straggler.get(self.wid, 1.0))
        self.total = cfg.total_iterations(len(data.x_train), ctx.workers)
        self.comm = worker_comm(ctx, self.flat.n)
        self.chain = VersionChain(cfg.verify_versions)
        self.times = dict.fromkeys(("barrier_s", "push_s", "pull_s"), 0.0)
        self.ks: list[int] = []
        self.losses: list[float] = []

    def run(self) -> dict:
        co, comm, flat = self.co, self.comm, self.flat
        try:
            comm.connect(co.get_json("meta/0"))
            quiet_gc()
            comm.expect(0)
            co.set_json(f"meta/{self.ctx.rank}", self.ctx.meta("worker", comm.address()))
            comm.pull(0, flat.param_np)
            self.chain.add(flat.param_np)
            for t in range(1, self.total + 1):
                self.compute(t)
                self.exchange(t)
            flat.check_views()
            summary = self.summary()
            co.set_json(f"done/{self.wid}", summary)
            # Stay reachable until the PS's last broadcast has returned: an ACK of
            # it may have been lost, and only a live receiver answers the re-send.
            co.get_json("fin")
        finally:
            comm.close()
        return {"event": "worker_done", **summary}

    def compute(self, t: int) -> None:
        """Round t's gradient in the flat buffer: one mini-batch (bsp), or the mean
        of every mini-batch computed until the slowest worker arrived (wbsp)."""
        co, times, wbsp = self.co, self.times, self.cfg.sync == "wbsp"
        self.flat.zero_grad()
        k = 0
        while True:
            self.losses.append(self.stepper.step(self.stream))
            k += 1
            tb = time.perf_counter()
            if k == 1:
                co.arrive(t)
            if not wbsp:
                co.wait_go(t)
            done = not wbsp or co.gone(t)   # wbsp: the slowest has its gradient
            times["barrier_s"] += time.perf_counter() - tb
            if done:
                break
        if k > 1:
            self.flat.grads.div_(k)
        if wbsp:
            co.set_k(t, self.wid, k)
        self.ks.append(k)

    def exchange(self, t: int) -> None:
        """Push round t's gradient, pull version t of the parameters."""
        comm, flat = self.comm, self.flat
        comm.expect(t)   # before the push: the PS may answer before push() returns
        tp = time.perf_counter()
        comm.push(t, flat.grad_np)
        tq = time.perf_counter()
        comm.pull(t, flat.param_np)
        self.times["push_s"] += tq - tp
        self.times["pull_s"] += time.perf_counter() - tq
        self.chain.add(flat.param_np)

    def summary(self) -> dict:
        """What the PS learns of this worker at the end (`done/<w>`)."""
        times = dict(self.times, compute_s=self.stepper.compute_s,
                     straggle_s=self.stepper.straggle_s)
        return {"worker": self.wid, "digest": self.flat.digest(),
                "chain": self.chain.hexdigest(),
                "local_steps": int(sum(self.ks)), "ks": self.ks, "versions": self.total + 1,
                "mean_loss": float(np.mean(self.losses)) if self.losses else None,
                "times": {k: round(v, 4) for k, v in times.items()}}


def run_worker(ctx: RankContext) -> dict:
    return WorkerRun(ctx).run()
