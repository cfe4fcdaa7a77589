# SPDX-License-Identifier: Apache-2.0
"""Where a training step's time goes: seconds per phase and per step, on one rank.

A rank keeps one `Phases`: a worker the process's (`worker()`), a server its
Server's. Each phase is timed with perf_counter where it runs, at its
boundaries only (a few calls per bucket, none per chunk, nothing on the
packet path), and added to the step under way; `end_step` closes the step:
its wall time, `other` (the wall time no phase accounts for) and one row in
a ring of the latest RING steps, from which `summary` takes the medians;
totals cover every step.

A worker's phases are of two kinds. Those of the step's own thread add up
to its wall time (WORKER_STEP): forward and backward (`compute`), gradients
copied into the send buffer (`staging`: device to host where it applies),
the wait for the step's barrier and pushes (`push`), for the answer
(`pull`), the answer made the gradients (`copy_back`), the optimizer's step
(`optimizer`). Those of the communication calls (WORKER_COMM: `barrier`,
`push`, `pull`, `copy_back` as the calls took them, on whichever thread
ran them; sharded, summed over the shards' threads) overlap compute, so
they are reported apart. Under DDP the reducer waits for the answers
inside backward: `ddp_wait` splits that wait (from the last bucket's hand-off
to the end of backward) into the answer's pull and copy back, as the
communication thread measured them, and the pushes' rest.

A server's phases per step op (SERVER): the wait for the workers at the
op's barrier (`idle`), for rounds to close (`gather`), summing and the
non-finite check (`aggregate`), the answer's send (`send`, of it `sign`:
the answer's signature), and `other`.
"""
from __future__ import annotations

import contextlib
import threading
import time

import numpy as np

RING = 2048    # steps whose phases a rank keeps for the medians
WORKER_STEP = ("compute", "staging", "push", "pull", "copy_back", "optimizer")
WORKER_COMM = ("barrier", "push", "pull", "copy_back")
SERVER = ("idle", "gather", "aggregate", "send")
SERVER_OVERLAP = ("sign",)      # inside `send`: not added into the sum


class Phases:
    """One rank's phases: the step under way, a ring of the latest steps, totals.

    parts: the phases that add up to a step's wall time (`other` is what is
    left of it); overlap: phases timed beside them (`comm.push`, ...). Safe to
    add to from several threads."""

    def __init__(self, parts: tuple, overlap: tuple = (), ring: int = RING):
        self.parts, self.overlap = tuple(parts), tuple(overlap)
        self.names = (*self.parts, "other", "wall", *self.overlap)
        self.cur = dict.fromkeys(self.parts + self.overlap, 0.0)
        self.total = dict.fromkeys(self.names, 0.0)
        self.ring = np.zeros((ring, len(self.names)))
        self.steps = 0
        self.lock = threading.Lock()
        self.t0 = time.perf_counter()   # where the next step's wall time starts
        self.started = False

    def add(self, name: str, seconds: float) -> None:
        with self.lock:
            self.cur[name] += seconds

    def get(self, name: str) -> float:
        return self.cur[name]

    @contextlib.contextmanager
    def timed(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def start_step(self) -> None:
        """A step begins now (a caller that knows: the first call of a step
        counts); without it a step's wall time runs from the last end_step."""
        if not self.started:
            self.t0, self.started = time.perf_counter(), True

    def discard(self) -> None:
        """Forget the step under way (an op that is no step)."""
        with self.lock:
            self.cur = dict.fromkeys(self.cur, 0.0)
        self.t0, self.started = time.perf_counter(), False

    def end_step(self, wall: float | None = None) -> dict:
        """Close the step (wall: its seconds, else since start_step or the last
        end_step); its row (phase -> seconds) is returned."""
        now = time.perf_counter()
        with self.lock:
            row, self.cur = self.cur, dict.fromkeys(self.cur, 0.0)
        row["wall"] = now - self.t0 if wall is None else wall
        row["other"] = max(0.0, row["wall"] - sum(row[p] for p in self.parts))
        self.ring[self.steps % len(self.ring)] = [row[n] for n in self.names]
        for n in self.names:
            self.total[n] += row[n]
        self.steps += 1
        self.t0, self.started = now, False
        return row

    def summary(self) -> dict:
        """{steps, median: phase -> s per step (the latest RING steps), total:
        phase -> s over every step}."""
        n = min(self.steps, len(self.ring))
        med = np.median(self.ring[:n], axis=0) if n else np.zeros(len(self.names))
        return {"steps": self.steps,
                "median": {k: round(float(v), 6) for k, v in zip(self.names, med)},
                "total": {k: round(v, 6) for k, v in self.total.items()}}


def ddp_wait(wait: float, pull: float, copy_back: float) -> dict:
    """A DDP step's wait inside backward (the last bucket's hand-off to
    backward's end), split: the answer's pull and copy back as the
    communication thread took them (they come after every push), at most the
    wait, and the rest: pushes and barrier not yet done."""
    wait = max(0.0, wait)
    p = min(max(0.0, pull), wait)
    c = min(max(0.0, copy_back), wait - p)
    return {"pull": p, "copy_back": c, "push": wait - p - c}


_worker: Phases | None = None


def worker() -> Phases:
    """This process's worker phases (a worker rank is one process)."""
    global _worker
    if _worker is None:
        _worker = Phases(WORKER_STEP, tuple(f"comm_{n}" for n in WORKER_COMM))
    return _worker


def worker_summary() -> dict | None:
    """This worker's phases, or None if it recorded no step."""
    if _worker is None or not _worker.steps:
        return None
    s = _worker.summary()
    comm = tuple(f"comm_{n}" for n in WORKER_COMM)
    return {"steps": s["steps"],
            **{k: {n: v for n, v in s[k].items() if n not in comm} for k in ("median", "total")},
            "comm": {k: {n[5:]: v for n, v in s[k].items() if n in comm}
                     for k in ("median", "total")}}


def combine(workers: dict, servers: list[dict], step_s: float | None) -> dict | None:
    """A run's breakdown from its workers' and servers' summaries: per phase
    the median of the workers' medians (and of their totals), the servers'
    largest median and total (the slowest server bounds a step), and each
    rank's own beside it. step_s: the run's mean seconds per step."""
    ws = {w: b for w, b in workers.items() if b}
    ss = [b for b in servers if b]
    if not ws and not ss:
        return None

    def mid(rows, key):
        names = rows[0][key].keys()
        return {n: round(float(np.median([r[key][n] for r in rows])), 6) for n in names}

    def top(rows, key):
        names = rows[0][key].keys()
        return {n: round(max(r[key][n] for r in rows), 6) for n in names}
    out: dict = {"unit": "seconds per step", "step_s": step_s}
    if ws:
        rows = list(ws.values())
        out["worker"] = {"median": mid(rows, "median"), "total": mid(rows, "total")}
        out["comm"] = {"median": mid([r["comm"] for r in rows], "median"),
                       "total": mid([r["comm"] for r in rows], "total")}
        out["per_worker"] = {str(w): b for w, b in sorted(ws.items())}
    if ss:
        out["server"] = {"median": top(ss, "median"), "total": top(ss, "total")}
        out["per_server"] = ss
    return out
