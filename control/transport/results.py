# SPDX-License-Identifier: Apache-2.0
"""What the transport hands back: the peers it is given, and the reports of
its pushes (`PushReport`) and of the rounds it receives (`RoundResult`)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ...dataplane.xdp import wire as W
from .layout import ChunkLayout
from .straggler import Attribution


@dataclass
class Peer:
    """A host this endpoint talks to: its worker id (the flow owner) and address."""

    worker: int
    ip: str
    port: int = W.PORT


@dataclass
class PushReport:
    round: int
    chunks: int
    sent: int
    resent: int
    acked: int
    closed_by_receiver: bool
    duration_s: float
    passes: int
    sender: str = "socket"           # "xdp": the ACK clock sent most of it (ackclock.py)
    clock_tx: int = 0                # DATA the XDP program made of ACKs (in `sent`)
    stops: int = 0                   # ACKs the receiver's credit told to stop
    max_over_credit: int = 0         # most packets in flight above the credit, after the first ACK
    clock_retx: int = 0              # re-sends the XDP program made of ACKs (RACK in XDP; in clock_tx)
    deferred: np.ndarray | None = None   # a tolerant push's deferred chunks (defer.py)
    sender_why: str = ""             # why this sender: the endpoint's choice, or the push's own

    def to_dict(self) -> dict:
        out = dict(self.__dict__)
        if self.deferred is not None:
            out["deferred"] = int(self.deferred.sum())
        return out


@dataclass
class Arrivals:
    """When a round's chunks reached the NIC, per worker (the XDP program's
    stamps, bpf/ltp_maps.h struct ltp_progress): CLOCK_MONOTONIC ns, 0 where
    none came. first_ns and thresh_ns (when the worker's own chunks reached
    the round's Early Close threshold of its chunk count) are exact; so is
    last_ns for a worker that completed or passed its threshold (the program
    reads the clock for every chunk from there on, and for re-sends); below
    it, last_ns is its latest chunk that had a reading anyway (issue 45)."""

    open_ns: int                     # the round opened (perf_counter: the same clock)
    close_ns: int                    # ... and closed
    first_ns: np.ndarray             # int64 [W]: the first chunk taken
    last_ns: np.ndarray              # int64 [W]: the latest
    thresh_ns: np.ndarray            # int64 [W]: the one that reached the threshold

    def relative(self) -> dict[str, list]:
        """Seconds after open per worker (None: nothing came), for reports."""
        def rel(a):
            return [round((int(x) - self.open_ns) / 1e9, 6) if x else None for x in a]
        return {"first_s": rel(self.first_ns), "last_s": rel(self.last_ns),
                "thresh_s": rel(self.thresh_ns)}


def arrivals_of(progress: np.ndarray, t_open: float, t_close: float) -> Arrivals:
    """Copy a closed round's stamps out of its bank's progress rows (one per
    worker); t_open, t_close: perf_counter() seconds (CLOCK_MONOTONIC on Linux)."""
    def col(name):
        return np.array(progress[name], dtype=np.int64)
    return Arrivals(open_ns=int(t_open * 1e9), close_ns=int(t_close * 1e9),
                    first_ns=col("first_ns"), last_ns=col("last_ns"), thresh_ns=col("thresh_ns"))


@dataclass
class RoundResult:
    """What a parameter server gets when a round closes."""

    round: int
    reason: str                      # complete | early | deadline | timeout
    duration_s: float                # open -> close
    active_s: float                  # first chunk -> close
    workers: list[int]
    layout: ChunkLayout
    values: np.ndarray               # float32 [W, nelems]: per-worker, filled (mapped memory)
    masks: np.ndarray                # bool [W, nchunks]: what arrived
    filled: np.ndarray               # int [W]: chunks filled per worker
    threshold: float
    deadline_s: float
    late: int = 0                    # packets of closed rounds seen since the last report
    duplicates: int = 0
    # packets (DATA or ACK) without their round's token since the last report:
    # spoofs, or a peer holding another secret
    bad_token: int = 0
    retx_chunks: int = 0             # chunks that arrived only as a re-send
    critical_missing: dict = field(default_factory=dict)
    rebuilt: int = 0                 # a coded round: data chunks rebuilt from parity
    # the holes' cost (bubble.error_estimate, before filling): the aggregate's
    # error against its own sampling noise and against its norm
    error: dict = field(default_factory=lambda: {"vs_noise": 0.0, "vs_aggregate": 0.0})
    arrivals: Arrivals | None = None  # when each worker's chunks reached the NIC
    attribution: Attribution | None = None   # whom it waited for (straggler.attribute)

    @functools.cached_property
    def aggregate(self) -> np.ndarray:
        """float32 [nelems]: mean over workers after filling (accumulated in float64)."""
        return self.values.mean(axis=0, dtype=np.float64).astype(np.float32)

    @property
    def delivered_fraction(self) -> float:
        return float(self.masks.mean()) if self.masks.size else 1.0

    def delivered_per_worker(self) -> dict[int, float]:
        return {w: float(self.masks[i].mean()) for i, w in enumerate(self.workers)}

    @property
    def missing_workers(self) -> list[int]:
        return [w for i, w in enumerate(self.workers) if not self.masks[i].any()]

    def report(self) -> dict:
        return {"round": self.round, "reason": self.reason,
                "duration_s": round(self.duration_s, 6), "active_s": round(self.active_s, 6),
                "delivered_fraction": round(self.delivered_fraction, 6),
                "delivered_per_worker": {str(k): round(v, 6)
                                         for k, v in self.delivered_per_worker().items()},
                "filled_chunks": {str(w): int(self.filled[i]) for i, w in enumerate(self.workers)},
                "missing_workers": self.missing_workers, "late": self.late,
                "duplicates": self.duplicates, "bad_token": self.bad_token,
                "retx_chunks": self.retx_chunks,
                "error_vs_noise": round(self.error["vs_noise"], 6),
                "error_vs_aggregate": round(self.error["vs_aggregate"], 6),
                "threshold": round(self.threshold, 6), "deadline_s": round(self.deadline_s, 6),
                "critical_missing": {str(k): v for k, v in self.critical_missing.items()},
                **({"arrivals": self.arrivals.relative()} if self.arrivals else {}),
                **({"straggler": self.attribution.to_dict()} if self.attribution else {})}
