# SPDX-License-Identifier: Apache-2.0
"""Who each step waited for, over a whole `ltp train` run (docs/slow-or-stuck.md).

Two witnesses, each step:

  barrier  under bsp every worker meets at the step's barrier before it
           pushes, so a worker slow to compute holds the others there, and
           its chunks reach the NIC with theirs. Each worker notes the steps
           it arrived last at (it lifted the barrier) and how long it waited
           at the others; the step names its last arriver when the others'
           median wait exceeds the margin, max(BARRIER_MARGIN_S,
           BARRIER_MARGIN_FRAC x the run's mean step time)
  NIC      otherwise the server's own attribution from the arrival times
           (StepReport.straggler, control/transport/straggler.py): a worker
           whose chunks came last, beyond its margin, or whom a round cut by
           its deadline waited for

A step neither names is not attributed. Each worker keeps its notes sparse
(waits only above BARRIER_MARGIN_S, at most MAX_NOTES of each), and hands
them to the lead with its summary.
"""
from __future__ import annotations

from array import array

import numpy as np

BARRIER_MARGIN_S = 0.005   # a busy 2-core host's store round trips and scheduling
BARRIER_MARGIN_FRAC = 0.1  # of the mean step time
MAX_NOTES = 100_000        # per worker and kind: a soak's notes stay bounded


class BarrierNotes:
    """One worker's notes of the steps' barriers, as its optimizer saw them."""

    def __init__(self):
        self.last = array("l")                 # steps it arrived last at
        self.waited: dict[int, float] = {}     # step -> seconds waited, above the floor

    def add(self, rep) -> None:
        if rep.barrier_wait_s is None:
            return
        if rep.barrier_last and len(self.last) < MAX_NOTES:
            self.last.append(rep.step)
        elif rep.barrier_wait_s > BARRIER_MARGIN_S and len(self.waited) < MAX_NOTES:
            self.waited[rep.step] = rep.barrier_wait_s

    def to_dict(self) -> dict:
        return {"last": list(self.last),
                "waited_ms": {str(s): round(v * 1e3, 3) for s, v in self.waited.items()}}


def attribute_steps(notes: dict[int, dict], nic: dict[int, int], steps: int,
                    step_s: float, keys=None) -> dict:
    """The run's straggler fields: per worker the steps it was named in, the
    steps attributed, and by which witness. notes: worker -> its
    BarrierNotes.to_dict() (missing: it kept none); nic: step -> the worker
    the server named; keys: the steps' numbers (default 1..steps)."""
    margin = max(BARRIER_MARGIN_S, BARRIER_MARGIN_FRAC * step_s)
    last_at: dict[int, int] = {}
    for w, n in notes.items():
        for s in n.get("last", []):
            last_at.setdefault(int(s), w)
    waited = {w: {int(s): v / 1e3 for s, v in n.get("waited_ms", {}).items()}
              for w, n in notes.items()}
    named: dict[int, int] = {}
    by = {"barrier": 0, "nic": 0}
    for s in (range(1, steps + 1) if keys is None else keys):
        w = last_at.get(s)
        others = [waited[o].get(s, 0.0) for o in waited if o != w]
        if w is not None and others and float(np.median(others)) > margin:
            named[w] = named.get(w, 0) + 1
            by["barrier"] += 1
        elif s in nic:
            named[nic[s]] = named.get(nic[s], 0) + 1
            by["nic"] += 1
    return {"straggler_rounds": {str(w): n for w, n in sorted(named.items())},
            "rounds_attributed": sum(named.values()), "attributed_by": by,
            "straggler_margin_ms": round(margin * 1e3, 3)}
