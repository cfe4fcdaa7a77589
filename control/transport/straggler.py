# SPDX-License-Identifier: Apache-2.0
"""Who a round waited for: straggler attribution from the NIC's arrival times.

Each worker's lateness in a round is its last chunk's arrival at the NIC
(results.Arrivals.last_ns) minus the median of the workers' last arrivals;
a worker none of whose chunks came counts as arriving at the close. The
round names its critical-path worker:

  waited  the round closed by its deadline or hard timeout with holes: the
          worker with the fewest chunks delivered (ties: the latest), whom
          the round waited for until it gave up
  last    otherwise the worker whose last chunk came last, but only when its
          lateness exceeds the margin, max(MARGIN_MIN_S, MARGIN_FRAC x the
          round's span: median last minus median first arrival). Inside the
          margin the round is not attributed: on a busy host the order of the
          last chunks is scheduling noise (docs/slow-or-stuck.md)

A step of several rounds (buckets) names the worker named in most of its
rounds (ties: the larger summed lateness), and a worker's lateness is its
mean over the step's rounds.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MARGIN_MIN_S = 0.002   # 2 ms: a busy 2-core host's scheduling noise on the last chunk
MARGIN_FRAC = 0.1      # of the round's span (median first to median last arrival)
WAITED_REASONS = ("deadline", "timeout")


@dataclass
class Attribution:
    """One round's answer to "who was slow"."""

    critical: int | None             # the worker named (None: not attributed)
    cause: str                       # "waited" | "last" | "" (not attributed)
    lateness: dict[int, float] = field(default_factory=dict)   # worker -> seconds
    margin_s: float = 0.0            # what "last" had to exceed

    def to_dict(self) -> dict:
        return {"critical": self.critical, "cause": self.cause,
                "lateness_s": {str(w): round(v, 6) for w, v in self.lateness.items()},
                "margin_s": round(self.margin_s, 6)}


def attribute(arrivals, workers: list[int], delivered: np.ndarray, reason: str) -> Attribution:
    """Attribute a closed round (arrivals: results.Arrivals; delivered: chunks
    per worker; reason: how it closed)."""
    if arrivals is None or not len(workers):
        return Attribution(None, "")
    came = arrivals.last_ns > 0
    if not came.any():
        return Attribution(None, "")
    last = np.where(came, arrivals.last_ns, arrivals.close_ns).astype(np.float64)
    med = float(np.median(last[came]))
    late = (last - med) / 1e9
    lateness = {w: float(late[i]) for i, w in enumerate(workers)}
    span = (med - float(np.median(arrivals.first_ns[came]))) / 1e9
    margin = max(MARGIN_MIN_S, MARGIN_FRAC * max(0.0, span))
    delivered = np.asarray(delivered)
    if reason in WAITED_REASONS and ((delivered < delivered.max()).any() or (~came).any()):
        # the fewest delivered, then the latest: lexsort's last key is the primary one
        i = int(np.lexsort((-last, delivered))[0])
        return Attribution(workers[i], "waited", lateness, margin)
    i = int(np.argmax(last))
    if late[i] > margin:
        return Attribution(workers[i], "last", lateness, margin)
    return Attribution(None, "", lateness, margin)


class StepStragglers:
    """A step's rounds' attributions, folded into the step's: the worker
    named in most rounds, each worker's mean lateness."""

    def __init__(self, workers: int):
        self.named = np.zeros(workers, dtype=np.int64)
        self.late_sum = np.zeros(workers, dtype=np.float64)
        self.late_n = np.zeros(workers, dtype=np.int64)

    def add(self, att: Attribution | None) -> None:
        if att is None:
            return
        for w, v in att.lateness.items():
            self.late_sum[w] += v
            self.late_n[w] += 1
        if att.critical is not None:
            self.named[att.critical] += 1

    def straggler(self) -> int | None:
        if not self.named.any():
            return None
        top = np.flatnonzero(self.named == self.named.max())
        return int(top[np.argmax(self.late_sum[top])])

    def lateness(self) -> dict[int, float]:
        return {int(w): float(self.late_sum[w] / self.late_n[w])
                for w in np.flatnonzero(self.late_n)}
