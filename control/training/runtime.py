"""The rank loops: parameter server, worker (bsp | wbsp), and the gloo DDP worker.

Parameter server (rank 0, transports ltp and tcp): holds the model and a
torch.optim.SGD optimizer. Per iteration t it gathers one gradient row per
worker (LTP: after Early Close and Bubble Filling), aggregates them into the
flat gradient buffer, steps, and broadcasts the parameters (version t).

Worker: pulls version t-1, computes, pushes its gradient for round t.
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
The barrier and the k values go through the rendezvous store (TCPStore), the
tensors through the transport.

Aggregation is accumulated in float64 and rounded once to float32: with equal
weights it is exactly RoundResult.aggregate, so LTP with nothing lost and TCP
produce the same bits.

Timing: `wall_s` runs from the first parameter broadcast to the last, with
evaluation excluded (the clock is paused while the PS evaluates, and the
workers are idle then, waiting for parameters).
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Callable

import numpy as np
import torch

from ..transport.rate import quiet_gc
from .data import BatchStream, iterations_per_epoch, split
from .model import DEFAULT_HIDDEN, FlatModel, build_mlp, evaluate, param_digest

TRANSPORTS = ("ltp", "tcp", "gloo")
SYNCS = ("bsp", "wbsp")
DOWNLINKS = ("unicast", "group")
# Store keys; a torchrun restart starts a fresh key space (an agent store
# outlives attempts, and a stale barrier key would let a round run early).
KEY = f"ltpx/train/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"


@dataclass
class TrainConfig:
    """What to train and how; the same on every rank."""

    transport: str = "ltp"
    sync: str = "bsp"
    epochs: int = 3
    iterations: int | None = None       # overrides epochs (e.g. "a few steps")
    batch: int = 32                     # per worker and local step
    lr: float = 0.1
    momentum: float = 0.9
    hidden: tuple[int, ...] = DEFAULT_HIDDEN
    seed: int = 0
    bubble: str = "mean"
    straggler: dict[int, float] = field(default_factory=dict)   # worker id -> factor
    eval_every: int = 0                 # iterations; 0: at epoch ends only
    target_accuracy: float | None = None
    cc: str = "cubic"
    verify_versions: bool = False       # hash every parameter version on every rank
    downlink: str = "unicast"           # ltp parameter downlink: unicast | group (one packet
                                        # per chunk to a broadcast/multicast address)

    def validate(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport: one of {', '.join(TRANSPORTS)}, got {self.transport!r}")
        if self.sync not in SYNCS:
            raise ValueError(f"sync: one of {', '.join(SYNCS)}, got {self.sync!r}")
        if self.sync == "wbsp" and self.transport == "gloo":
            raise ValueError("sync: wbsp needs a parameter server (transport ltp or tcp); "
                             "gloo all-reduce is bsp only")
        if self.epochs < 1 or (self.iterations is not None and self.iterations < 1):
            raise ValueError("epochs/iterations: must be at least 1")
        if self.batch < 1:
            raise ValueError(f"batch: must be at least 1, got {self.batch}")
        if not self.hidden or any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden: layer widths must be positive, got {self.hidden}")
        if self.downlink not in DOWNLINKS:
            raise ValueError(f"downlink: one of {', '.join(DOWNLINKS)}, got {self.downlink!r}")
        if self.downlink == "group" and self.transport != "ltp":
            raise ValueError("downlink: group sends need the ltp transport")
        for w, f in self.straggler.items():
            if f < 1:
                raise ValueError(f"straggler: factor for worker {w} must be >= 1, got {f}")

    def total_iterations(self, ntrain: int, workers: int) -> int:
        if self.iterations is not None:
            return self.iterations
        return self.epochs * iterations_per_epoch(ntrain, workers, self.batch)

    def to_json(self) -> str:
        d = asdict(self)
        d["straggler"] = {str(k): v for k, v in self.straggler.items()}
        return json.dumps(d)

    @classmethod
    def from_json(cls, s: str) -> "TrainConfig":
        d = json.loads(s)
        d["hidden"] = tuple(d["hidden"])
        d["straggler"] = {int(k): float(v) for k, v in d.get("straggler", {}).items()}
        return cls(**d)


@dataclass
class RankContext:
    """One rank's place in the job (from the env:// rendezvous and its flags)."""

    rank: int
    world: int
    store: object                       # torch.distributed.Store
    cfg: TrainConfig
    dev: str | None = None
    ip: str | None = None
    xdp_mode: str = "native"
    capacity_bps: float = 1e9
    mtu: int = 1500
    job: int = 0x7472
    tcp_port: int = 0
    timeout_s: float = 300.0
    deadline_min_s: float | None = None
    early_close: dict = field(default_factory=dict)   # EarlyCloseConfig fields (LTP PS)
    netns: str | None = None            # the namespace this rank runs in (names its pins)
    group: str | None = None            # address of downlink "group" (broadcast or multicast)
    emit: Callable[[dict], None] = lambda obj: None

    @property
    def workers(self) -> int:
        return self.world if self.cfg.transport == "gloo" else self.world - 1

    @property
    def worker_id(self) -> int:
        return self.rank if self.cfg.transport == "gloo" else self.rank - 1


# --------------------------------------------------------------------------- coordination

class Coord:
    """Barriers and metadata through the rendezvous store (never the tensors)."""

    def __init__(self, store, workers: int, timeout_s: float):
        self.store, self.workers = store, workers
        self.timeout = timedelta(seconds=timeout_s)
        store.set_timeout(self.timeout)

    def set_json(self, key: str, obj) -> None:
        self.store.set(KEY + key, json.dumps(obj))

    def get_json(self, key: str):
        self.store.wait([KEY + key], self.timeout)
        return json.loads(self.store.get(KEY + key))

    def arrive(self, t: int) -> bool:
        """This worker has a gradient for round t; True if it was the last."""
        if self.store.add(f"{KEY}ready/{t}", 1) == self.workers:
            self.store.set(f"{KEY}go/{t}", "1")
            return True
        return False

    def wait_go(self, t: int) -> None:
        self.store.wait([f"{KEY}go/{t}"], self.timeout)

    def gone(self, t: int) -> bool:
        return self.store.check([f"{KEY}go/{t}"])

    def set_k(self, t: int, worker: int, k: int) -> None:
        self.store.set(f"{KEY}k/{t}/{worker}", str(k))

    def get_k(self, t: int, ids: list[int]) -> list[int]:
        keys = [f"{KEY}k/{t}/{w}" for w in ids]
        self.store.wait(keys, self.timeout)
        return [int(v) for v in self.store.multi_get(keys)]


class Clock:
    """Wall time with pauses (evaluation is not training time)."""

    def __init__(self):
        self.t0 = None
        self.paused_at = None
        self.paused = 0.0

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def pause(self) -> None:
        self.paused_at = time.perf_counter()

    def resume(self) -> None:
        self.paused += time.perf_counter() - self.paused_at
        self.paused_at = None

    def elapsed(self) -> float:
        if self.t0 is None:
            return 0.0
        now = self.paused_at if self.paused_at is not None else time.perf_counter()
        return now - self.t0 - self.paused


class Stepper:
    """Forward + backward on one mini-batch, with an optional straggler slow-down.

    A straggler with factor F sleeps (F - 1) x its measured compute time (CPU
    time of this thread: on a shared machine wall time would add other
    processes' work). The sleep goes after backward, or, for DDP (whose
    backward is also the all-reduce), between forward and backward using the
    previous step's compute time."""

    def __init__(self, module: torch.nn.Module, factor: float = 1.0, ddp: bool = False):
        self.module, self.factor, self.ddp = module, factor, ddp
        self.last_c = 0.0
        self.compute_s = self.straggle_s = 0.0
        self.steps = 0

    def _slow(self, c: float) -> None:
        if self.factor > 1.0:
            s = (self.factor - 1.0) * c
            time.sleep(s)
            self.straggle_s += s

    def step(self, stream: BatchStream) -> float:
        xb, yb = stream.next()
        t0 = time.thread_time()
        loss = torch.nn.functional.cross_entropy(self.module(torch.from_numpy(xb)),
                                                 torch.from_numpy(yb))
        c = time.thread_time() - t0
        if self.ddp:
            self._slow(self.last_c)
        t1 = time.thread_time()
        loss.backward()
        c += time.thread_time() - t1
        if not self.ddp:
            self._slow(c)
        self.last_c = c
        self.compute_s += c
        self.steps += 1
        return float(loss.detach())


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


class _Evaluator:
    def __init__(self, module, data, clock: Clock, emit, target: float | None):
        self.module, self.clock, self.emit, self.target = module, clock, emit, target
        self.xte, self.yte = torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)
        self.xtr, self.ytr = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
        self.curve: list[dict] = []
        self.time_to_target = None

    def __call__(self, t: int, epoch: float) -> dict:
        self.clock.pause()
        acc, loss = evaluate(self.module, self.xte, self.yte)
        _, train_loss = evaluate(self.module, self.xtr, self.ytr)
        self.clock.resume()
        ev = {"event": "eval", "t": t, "epoch": round(epoch, 3), "wall_s": self.clock.elapsed(),
              "accuracy": acc, "test_loss": loss, "train_loss": train_loss}
        self.curve.append(ev)
        if self.target is not None and self.time_to_target is None and acc >= self.target:
            self.time_to_target = {"t": t, "wall_s": ev["wall_s"]}
        self.emit(ev)
        return ev


def _eval_due(t: int, T: int, ipe: int, every: int) -> bool:
    return t == T or t % ipe == 0 or (every > 0 and t % every == 0)


def _setup_torch(seed: int) -> None:
    torch.set_num_threads(1)       # one core per rank: the rig shares a few cores among all
    torch.manual_seed(seed)


def _meta(ctx: RankContext, role: str, extra: dict) -> dict:
    return {"rank": ctx.rank, "role": role, "worker": None if role == "ps" else ctx.worker_id,
            "dev": ctx.dev, "ip": ctx.ip, "host": socket.gethostname(), "pid": os.getpid(),
            **extra}


# --------------------------------------------------------------------------- PS

def run_ps(ctx: RankContext) -> dict:
    from . import comm as C
    from ..transport.early_close import EarlyCloseConfig
    cfg = ctx.cfg
    _setup_torch(cfg.seed)
    W = ctx.workers
    ids = list(range(W))
    co = Coord(ctx.store, W, ctx.timeout_s)
    data = split(cfg.seed)
    module = build_mlp(cfg.hidden, cfg.seed)
    flat = FlatModel(module)
    opt = torch.optim.SGD(module.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    ipe = iterations_per_epoch(len(data.x_train), W, cfg.batch)
    T = cfg.total_iterations(len(data.x_train), W)
    if cfg.transport == "ltp":
        ec = {"hard_timeout_s": min(ctx.timeout_s, 60.0), **ctx.early_close}
        if ctx.deadline_min_s is not None:
            ec["min_deadline_s"] = ctx.deadline_min_s
        comm = C.LtpPs(ctx.dev, ctx.ip, ids, flat.n, ns=ctx.netns, mode=ctx.xdp_mode,
                       capacity_bps=ctx.capacity_bps, mtu=ctx.mtu, job=ctx.job,
                       bubble=cfg.bubble, early_close=EarlyCloseConfig(**ec), timeout_s=min(ctx.timeout_s, 60.0),
                       group=ctx.group if cfg.downlink == "group" else None)
    else:
        comm = C.TcpPs(ctx.ip, ctx.tcp_port, ids, flat.n, cc=cfg.cc, timeout_s=ctx.timeout_s)
    clock = Clock()
    ev = _Evaluator(module, data, clock, ctx.emit, cfg.target_accuracy)
    chain = hashlib.sha256() if cfg.verify_versions else None
    reasons: dict[str, int] = {}
    delivered: list[float] = []
    ks_total = np.zeros(W, dtype=np.int64)
    round_s: list[float] = []
    ps_times = dict.fromkeys(("gather_s", "update_s", "broadcast_s"), 0.0)
    try:
        co.set_json("meta/0", _meta(ctx, "ps", {"transport": comm.name, **comm.address(),
                                                "nelems": flat.n, "iterations": T}))
        metas = {w: co.get_json(f"meta/{w + 1}") for w in ids}
        comm.connect(metas)
        ctx.emit({"event": "start", "transport": cfg.transport, "sync": cfg.sync, "workers": W,
                  "iterations": T, "iterations_per_epoch": ipe, "params": flat.n})
        ev(0, 0.0)
        quiet_gc()
        comm.open(1)
        clock.start()
        comm.broadcast(0, flat.param_np)
        if chain is not None:
            chain.update(memoryview(flat.param_np).cast("B"))
        for t in range(1, T + 1):
            t0 = time.perf_counter()
            g = comm.gather(t)
            t1 = time.perf_counter()
            ks = co.get_k(t, ids) if cfg.sync == "wbsp" else [1] * W
            aggregate_into(flat.grad_np, g.values, ks)
            opt.step()
            if t < T:
                comm.open(t + 1)
            t2 = time.perf_counter()
            ps_times["gather_s"] += t1 - t0
            ps_times["update_s"] += t2 - t1
            reasons[g.reason] = reasons.get(g.reason, 0) + 1
            delivered.append(g.delivered_fraction)
            ks_total += ks
            round_s.append(g.duration_s)
            ctx.emit({"event": "iter", "t": t, "of": T, "epoch": round(t / ipe, 3),
                      "wall_s": clock.elapsed(), "reason": g.reason,
                      "delivered": g.delivered_fraction, "filled_chunks": g.filled_chunks,
                      "round_s": g.duration_s, "k": ks})
            if _eval_due(t, T, ipe, cfg.eval_every):
                ev(t, t / ipe)
            t3 = time.perf_counter()
            comm.broadcast(t, flat.param_np)
            ps_times["broadcast_s"] += time.perf_counter() - t3
            if chain is not None:
                chain.update(memoryview(flat.param_np).cast("B"))
        wall = clock.elapsed()
        co.set_json("fin", {"t": T})
        flat.check_views()
        done = {w: co.get_json(f"done/{w}") for w in ids}
    finally:
        comm.close()
    digest = flat.digest()
    last = ev.curve[-1]
    early = reasons.get("early", 0) + reasons.get("deadline", 0)
    return {
        "event": "result", "transport": cfg.transport, "sync": cfg.sync, "workers": W,
        "cc": cfg.cc if cfg.transport == "tcp" else None,
        "bubble": cfg.bubble if cfg.transport == "ltp" else None,
        "downlink": cfg.downlink if cfg.transport == "ltp" else None,
        "iterations": T, "iterations_per_epoch": ipe, "epochs": round(T / ipe, 3),
        "params": flat.n, "final_accuracy": last["accuracy"], "final_test_loss": last["test_loss"],
        "initial_train_loss": ev.curve[0]["train_loss"], "final_train_loss": last["train_loss"],
        "iterations_per_s": T / wall if wall > 0 else None, "wall_s": wall,
        "delivered_fraction": float(np.mean(delivered)) if delivered else 1.0,
        "rounds_early_closed": early, "rounds_by_reason": reasons,
        "round_s_median": float(np.median(round_s)) if round_s else None,
        "time_to_target": ev.time_to_target, "target_accuracy": cfg.target_accuracy,
        "local_steps": {str(w): int(ks_total[i]) for i, w in enumerate(ids)},
        "ps_digest": digest, "worker_digests": {str(w): done[w]["digest"] for w in ids},
        "replicas_identical": all(done[w]["digest"] == digest for w in ids),
        "version_chain": ({"ps": chain.hexdigest()[:16],
                           "workers": {str(w): done[w]["chain"] for w in ids}}
                          if chain is not None else None),
        "worker_times": {str(w): done[w]["times"] for w in ids},
        "ps_times": {k: round(v, 4) for k, v in ps_times.items()},
        "curve": [{k: e[k] for k in ("t", "wall_s", "accuracy", "train_loss")} for e in ev.curve],
        "straggler": {str(k): v for k, v in cfg.straggler.items()},
    }


# --------------------------------------------------------------------------- worker

def run_worker(ctx: RankContext) -> dict:
    from . import comm as C
    cfg = ctx.cfg
    _setup_torch(cfg.seed)
    W, wid = ctx.workers, ctx.worker_id
    co = Coord(ctx.store, W, ctx.timeout_s)
    data = split(cfg.seed)
    module = build_mlp(cfg.hidden, cfg.seed)
    flat = FlatModel(module)
    stream = BatchStream(data, wid, W, cfg.batch, cfg.seed)
    stepper = Stepper(module, cfg.straggler.get(wid, 1.0))
    T = cfg.total_iterations(len(data.x_train), W)
    if cfg.transport == "ltp":
        comm = C.LtpWorker(ctx.dev, ctx.ip, wid, flat.n, workers=W, ns=ctx.netns,
                           mode=ctx.xdp_mode,
                           capacity_bps=ctx.capacity_bps, mtu=ctx.mtu, job=ctx.job,
                           timeout_s=min(ctx.timeout_s, 60.0))
    else:
        comm = C.TcpWorker(wid, flat.n, cc=cfg.cc, timeout_s=ctx.timeout_s)
    chain = hashlib.sha256() if cfg.verify_versions else None
    times = dict.fromkeys(("barrier_s", "push_s", "pull_s"), 0.0)
    ks: list[int] = []
    losses: list[float] = []
    try:
        comm.connect(co.get_json("meta/0"))
        quiet_gc()
        comm.expect(0)
        co.set_json(f"meta/{ctx.rank}", _meta(ctx, "worker", comm.address()))
        comm.pull(0, flat.param_np)
        if chain is not None:
            chain.update(memoryview(flat.param_np).cast("B"))
        for t in range(1, T + 1):
            flat.zero_grad()
            k = 0
            while True:
                losses.append(stepper.step(stream))
                k += 1
                tb = time.perf_counter()
                if k == 1:
                    co.arrive(t)
                if cfg.sync == "bsp":
                    co.wait_go(t)
                    times["barrier_s"] += time.perf_counter() - tb
                    break
                if co.gone(t):           # wbsp: the slowest has its gradient
                    times["barrier_s"] += time.perf_counter() - tb
                    break
                times["barrier_s"] += time.perf_counter() - tb
            if k > 1:
                flat.grads.div_(k)
            if cfg.sync == "wbsp":
                co.set_k(t, wid, k)
            ks.append(k)
            comm.expect(t)
            tp = time.perf_counter()
            comm.push(t, flat.grad_np)
            tq = time.perf_counter()
            comm.pull(t, flat.param_np)
            times["push_s"] += tq - tp
            times["pull_s"] += time.perf_counter() - tq
            if chain is not None:
                chain.update(memoryview(flat.param_np).cast("B"))
        flat.check_views()
        times.update(compute_s=stepper.compute_s, straggle_s=stepper.straggle_s)
        summary = {"worker": wid, "digest": flat.digest(),
                   "chain": chain.hexdigest()[:16] if chain is not None else None,
                   "local_steps": int(sum(ks)), "ks": ks, "versions": T + 1,
                   "mean_loss": float(np.mean(losses)) if losses else None,
                   "times": {k: round(v, 4) for k, v in times.items()}}
        co.set_json(f"done/{wid}", summary)
        # Stay reachable until the PS's last broadcast has returned: an ACK of
        # it may have been lost, and only a live receiver answers the re-send.
        co.get_json("fin")
    finally:
        comm.close()
    return {"event": "worker_done", **summary}


# --------------------------------------------------------------------------- gloo DDP

def run_gloo(ctx: RankContext) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    cfg = ctx.cfg
    _setup_torch(cfg.seed)
    W, wid = ctx.workers, ctx.worker_id
    co = Coord(ctx.store, W, ctx.timeout_s)
    dist.init_process_group("gloo", store=ctx.store, rank=ctx.rank, world_size=ctx.world,
                            timeout=timedelta(seconds=ctx.timeout_s))
    try:
        data = split(cfg.seed)
        module = build_mlp(cfg.hidden, cfg.seed)
        stepper = Stepper(module, cfg.straggler.get(wid, 1.0), ddp=True)
        stream = BatchStream(data, wid, W, cfg.batch, cfg.seed)
        # Calibrate the straggler's first sleep with one local step (not synced).
        xb, yb = BatchStream(data, wid, W, cfg.batch, cfg.seed + 1).next()
        t0 = time.thread_time()
        torch.nn.functional.cross_entropy(module(torch.from_numpy(xb)),
                                          torch.from_numpy(yb)).backward()
        stepper.last_c = time.thread_time() - t0
        module.zero_grad(set_to_none=True)
        ddp = DDP(module)
        opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        ipe = iterations_per_epoch(len(data.x_train), W, cfg.batch)
        T = cfg.total_iterations(len(data.x_train), W)
        stepper.module = ddp
        clock = Clock()
        lead = ctx.rank == 0
        ev = _Evaluator(module, data, clock, ctx.emit, cfg.target_accuracy) if lead else None
        if lead:
            ctx.emit({"event": "start", "transport": "gloo", "sync": "bsp", "workers": W,
                      "iterations": T, "iterations_per_epoch": ipe,
                      "params": sum(p.numel() for p in module.parameters())})
            ev(0, 0.0)
        dist.barrier()
        clock.start()
        for t in range(1, T + 1):
            opt.zero_grad()
            stepper.step(stream)            # backward all-reduces (mean over workers)
            opt.step()
            if lead:
                ctx.emit({"event": "iter", "t": t, "of": T, "epoch": round(t / ipe, 3),
                          "wall_s": clock.elapsed(), "reason": "complete", "delivered": 1.0,
                          "k": [1] * W})
                if _eval_due(t, T, ipe, cfg.eval_every):
                    ev(t, t / ipe)
        wall = clock.elapsed()
        vec = torch.nn.utils.parameters_to_vector(module.parameters()).detach().numpy()
        digest = param_digest(vec)
        co.set_json(f"done/{wid}", {"worker": wid, "digest": digest,
                                    "times": {"compute_s": round(stepper.compute_s, 4),
                                              "straggle_s": round(stepper.straggle_s, 4)}})
        if not lead:
            return {"event": "worker_done", "worker": wid, "digest": digest}
        done = {w: co.get_json(f"done/{w}") for w in range(W)}
        last = ev.curve[-1]
        return {
            "event": "result", "transport": "gloo", "sync": "bsp", "workers": W, "cc": None,
            "bubble": None, "iterations": T, "iterations_per_epoch": ipe,
            "epochs": round(T / ipe, 3), "params": int(vec.size),
            "final_accuracy": last["accuracy"], "final_test_loss": last["test_loss"],
            "initial_train_loss": ev.curve[0]["train_loss"], "final_train_loss": last["train_loss"],
            "iterations_per_s": T / wall if wall > 0 else None, "wall_s": wall,
            "delivered_fraction": 1.0, "rounds_early_closed": 0,
            "rounds_by_reason": {"complete": T}, "round_s_median": None,
            "time_to_target": ev.time_to_target, "target_accuracy": cfg.target_accuracy,
            "local_steps": {str(w): T for w in range(W)},
            "ps_digest": None, "worker_digests": {str(w): done[w]["digest"] for w in range(W)},
            "replicas_identical": len({d["digest"] for d in done.values()}) == 1,
            "version_chain": None,
            "worker_times": {str(w): done[w]["times"] for w in range(W)},
            "curve": [{k: e[k] for k in ("t", "wall_s", "accuracy", "train_loss")}
                      for e in ev.curve],
            "straggler": {str(k): v for k, v in cfg.straggler.items()},
        }
    finally:
        dist.destroy_process_group()
