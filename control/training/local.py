# SPDX-License-Identifier: Apache-2.0
"""A rank's local work, whatever the transport: compute steps, evaluation, the training clock,
and the result fields every run reports.

Timing: `wall_s` runs from the first parameter broadcast (gloo: the first
step) to the last, with evaluation excluded: the clock is paused while the
evaluating rank evaluates, and the others are idle then, waiting for it.
"""
from __future__ import annotations

import hashlib
import time

import torch

from .config import TrainConfig
from .data import BatchStream, Split
from .model import evaluate


def setup_torch(seed: int) -> None:
    torch.set_num_threads(1)       # one core per rank: the rig shares a few cores among all
    torch.manual_seed(seed)


def eval_due(t: int, total: int, ipe: int, every: int) -> bool:
    """Evaluate after iteration t? At the end, at each epoch's end, and every `every`."""
    return t == total or t % ipe == 0 or (every > 0 and t % every == 0)


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

    A straggler with factor F sleeps (F - 1) x its compute time (CPU time of
    this thread: on a shared machine wall time would add other processes'
    work), between forward and backward, as a slow GPU would be slow before
    its gradients are ready: the gradients leave from backward's hooks
    (ltpx.torch's buckets, DDP's all-reduce), so a sleep after backward
    would overlap their round trip and delay nothing. The compute time is
    the previous step's (the first step's: 3x its forward)."""

    def __init__(self, module: torch.nn.Module, factor: float = 1.0):
        self.module, self.factor = module, factor
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
        self._slow(self.last_c or 3 * c)
        t1 = time.thread_time()
        loss.backward()
        c += time.thread_time() - t1
        self.last_c = c
        self.compute_s += c
        self.steps += 1
        return float(loss.detach())


class Evaluator:
    """Test accuracy and losses of the evaluating rank's model, with the clock paused;
    keeps the curve and the time to the target accuracy, and emits each point."""

    def __init__(self, module, data: Split, clock: Clock, emit, target: float | None):
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

    def summary(self, *, total: int, ipe: int, wall: float, params: int) -> dict:
        """The result fields of the run's length, model, accuracy, losses and speed."""
        last = self.curve[-1]
        return {"iterations": total, "iterations_per_epoch": ipe,
                "epochs": round(total / ipe, 3), "params": params,
                "final_accuracy": last["accuracy"], "final_test_loss": last["test_loss"],
                "initial_train_loss": self.curve[0]["train_loss"],
                "final_train_loss": last["train_loss"],
                "iterations_per_s": total / wall if wall > 0 else None, "wall_s": wall}

    def target_fields(self) -> dict:
        return {"time_to_target": self.time_to_target, "target_accuracy": self.target}

    def tail(self, cfg: TrainConfig) -> dict:
        """The result's last fields: the accuracy curve and the stragglers."""
        return {"curve": [{k: e[k] for k in ("t", "wall_s", "accuracy", "train_loss")}
                          for e in self.curve],
                "straggler": {str(k): v for k, v in cfg.straggler.items()}}


class VersionChain:
    """sha256 over every parameter version a rank holds, in order (--verify-versions):
    equal chains on every rank mean every worker pulled every version bit for bit."""

    def __init__(self, on: bool):
        self.h = hashlib.sha256() if on else None

    def add(self, params) -> None:
        if self.h is not None:
            self.h.update(memoryview(params).cast("B"))

    def hexdigest(self) -> str | None:
        return self.h.hexdigest()[:16] if self.h is not None else None
