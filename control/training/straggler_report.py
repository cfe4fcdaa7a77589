# SPDX-License-Identifier: Apache-2.0
"""Who each step waited for, over a whole `ltp train` run (docs/slow-or-stuck.md).

Three witnesses, each step, the first that names a worker names the step:

  steady   a worker whose own time before the barrier (since its previous
           answer: its compute, exchange.Arrival.own_s) is the longest in
           more steps of a window of the last STEADY_WINDOW steps than any
           other's, and in STEADY_SHARE of them at least, and its
           median there is above the others' median by more than the
           others' medians spread, STEADY_MIN_S and STEADY_FRAC of the step:
           a rank a little slow every step (a throttled GPU, a busy host),
           too little in any one step for the rules below to tell from
           scheduling noise
  barrier  under bsp every worker meets at the step's barrier before it
           pushes, so a worker slow to compute holds the others there, and
           its chunks reach the NIC with theirs. Each worker notes the steps
           it arrived last at (it lifted the barrier) and how long it waited
           at the others; the step names its last arriver when the others'
           median wait exceeds the margin, max(BARRIER_MARGIN_S,
           BARRIER_MARGIN_FRAC x the run's mean step time), and its own
           time that step explains the wait: it exceeds the others' median
           own time by EXPLAINS x their median wait. A last arriver whose
           own time was the others' came late because its answer did (the
           answers reach the workers up to 10 ms apart on a busy host) or
           its core was taken: the step did not wait for its compute
  NIC      otherwise the server's own attribution from the arrival times
           (StepReport.straggler, control/transport/straggler.py): a worker
           whose chunks came last, beyond its margin, or whom a round cut by
           its deadline waited for; where the worker's lateness that step is
           known, only beyond the barrier's margin too: the NIC's own margin
           (2 ms) is a round's, and on a busy host the pushes leave a lifted
           barrier that far apart in most steps of a healthy run

A step neither names is not attributed, nor is a step whose time before
the barrier some worker spent aside (the lead's evaluation: Arrival.aside).
Why the steady rule reads own times, not the barrier's order: on a shared
host the order is much the scheduler's. With 8 workers on 2 cores and
worker 2 slowed 3 ms a step (its compute 3x), the answers reached the
workers up to 10 ms apart, and worker 2 came last to 39 % of the barriers
(the lead, evaluating, 27 %); its own time was the longest in 75 % of the
steps, 6.5 ms against the others' 3.2 ms in the median.
Each worker keeps its waits sparse (only above BARRIER_MARGIN_S) and its own
times dense, at most MAX_NOTES of each, and hands them to the lead with its
summary.
"""
from __future__ import annotations

from array import array

import numpy as np

BARRIER_MARGIN_S = 0.005   # a busy 2-core host's store round trips and scheduling
BARRIER_MARGIN_FRAC = 0.1  # of the mean step time
EXPLAINS = 0.5             # of the others' wait: the last arriver's own excess that names it
STEADY_WINDOW = 20         # steps: a steady straggler is slow in most of them
STEADY_SHARE = 0.4         # of the window: 8 workers' noise makes each the slowest in 1/8
STEADY_MIN_S = 0.0005      # a lag under this is no straggler's
STEADY_FRAC = 0.01         # of the mean step time: a rank costing under 1 % of a step is none
MAX_NOTES = 100_000        # per worker and kind: a soak's notes stay bounded


class BarrierNotes:
    """One worker's notes of the steps' barriers, as its optimizer saw them."""

    def __init__(self):
        self.last = array("l")                 # steps it arrived last at
        self.waited: dict[int, float] = {}     # step -> seconds waited, above the floor
        self.own: dict[int, float] = {}        # step -> its own time before the barrier, s
        self.aside: array = array("l")         # steps whose own time held other work

    def add(self, rep) -> None:
        seen = rep.barrier
        if seen is None:
            return
        if seen.last and len(self.last) < MAX_NOTES:
            self.last.append(rep.step)
        elif seen.wait_s > BARRIER_MARGIN_S and len(self.waited) < MAX_NOTES:
            self.waited[rep.step] = seen.wait_s
        if seen.own_s is not None and len(self.own) < MAX_NOTES:
            self.own[rep.step] = seen.own_s
        if seen.aside and len(self.aside) < MAX_NOTES:
            self.aside.append(rep.step)

    def to_dict(self) -> dict:
        return {"last": list(self.last),
                "waited_ms": {str(s): round(v * 1e3, 3) for s, v in self.waited.items()},
                "own_ms": {str(s): round(v * 1e3, 3) for s, v in self.own.items()},
                "aside": list(self.aside)}


def steady(notes: dict[int, dict], keys: list[int], step_s: float) -> dict[int, tuple[int, float]]:
    """The steady rule: step -> (the worker it names, its lag in seconds: its
    window median minus the others' median). notes as attribute_steps's;
    keys: the steps attributable (in order, none aside)."""
    workers = sorted(w for w, n in notes.items() if n.get("own_ms"))
    if len(workers) < 2 or len(keys) < STEADY_WINDOW:
        return {}
    own = np.full((len(keys), len(workers)), np.nan)
    for j, w in enumerate(workers):
        got = notes[w]["own_ms"]
        own[:, j] = [got.get(str(s), np.nan) for s in keys]
    own /= 1e3
    floor = max(STEADY_MIN_S, STEADY_FRAC * step_s)
    out: dict[int, tuple[int, float]] = {}
    for i in range(STEADY_WINDOW - 1, len(keys)):
        win = own[i - STEADY_WINDOW + 1:i + 1]
        seen = (~np.isnan(win)).sum(axis=0) * 2 >= STEADY_WINDOW   # in half the window
        if seen.sum() < 2:
            continue
        med = np.where(seen, np.nanmedian(np.where(seen, win, 0.0), axis=0), np.nan)
        c = int(np.nanargmax(med))
        others = np.delete(med, c)
        others = others[~np.isnan(others)]
        lag = float(med[c] - np.median(others))
        timed = win[~np.isnan(win).all(axis=1)]        # steps someone's own time is of
        times = np.bincount(np.nanargmax(np.where(np.isnan(timed), -np.inf, timed), axis=1),
                            minlength=len(workers))    # steps each was the slowest in
        if lag > max(floor, float(others.max() - others.min())) and \
                times[c] == times.max() and times[c] >= STEADY_SHARE * STEADY_WINDOW:
            out[keys[i]] = (workers[c], lag)
    return out


def _explains(own: dict[int, dict[int, float]], w: int, s: int, wait: float) -> bool:
    """Whether worker w's own time at step s explains the others' wait for
    it there (True where its or the others' own times are not known)."""
    mine = own.get(w, {}).get(s)
    theirs = [o[s] for v, o in own.items() if v != w and s in o]
    if mine is None or not theirs:
        return True
    return mine - float(np.median(theirs)) >= EXPLAINS * wait


def attribute_steps(notes: dict[int, dict], nic: dict[int, int], steps: int,
                    step_s: float, keys=None, nic_late: dict[int, float] | None = None) -> dict:
    """The run's straggler fields: per worker the steps it was named in, the
    steps attributed, by which witness and whom each named, the steady
    rule's median lag per worker it named, the steps set aside, and the
    namings from the first step with a whole window behind it. notes: worker -> its
    BarrierNotes.to_dict() (missing: it kept none); nic: step -> the worker
    the server named; keys: the steps' numbers (default 1..steps); nic_late:
    step -> the lateness (s) of the worker nic names there, where known."""
    margin = max(BARRIER_MARGIN_S, BARRIER_MARGIN_FRAC * step_s)
    last_at: dict[int, int] = {}
    aside = set()
    for w, n in notes.items():
        for s in n.get("last", []):
            last_at.setdefault(int(s), w)
        aside.update(int(s) for s in n.get("aside", []))
    waited = {w: {int(s): v / 1e3 for s, v in n.get("waited_ms", {}).items()}
              for w, n in notes.items()}
    own = {w: {int(s): v / 1e3 for s, v in n.get("own_ms", {}).items()}
           for w, n in notes.items()}
    keys = [s for s in (range(1, steps + 1) if keys is None else keys) if s not in aside]
    chronic = steady(notes, keys, step_s)
    named: dict[int, int] = {}
    by: dict[str, dict[int, int]] = {"steady": {}, "barrier": {}, "nic": {}}
    lags: dict[int, list[float]] = {}
    judged = set(keys[STEADY_WINDOW - 1:])   # the steps the steady rule could judge
    later: dict[int, int] = {}
    for s in keys:
        w = last_at.get(s)
        others = [waited[o].get(s, 0.0) for o in waited if o != w]
        if s in chronic:
            (w, lag), rule = chronic[s], "steady"
            lags.setdefault(w, []).append(lag)
        elif w is not None and others and float(np.median(others)) > margin and \
                _explains(own, w, s, float(np.median(others))):
            rule = "barrier"
        elif s in nic and (nic_late or {}).get(s, margin) >= margin:
            w, rule = nic[s], "nic"
        else:
            continue
        named[w] = named.get(w, 0) + 1
        by[rule][w] = by[rule].get(w, 0) + 1
        if s in judged:
            later[w] = later.get(w, 0) + 1
    return {"straggler_rounds": {str(w): n for w, n in sorted(named.items())},
            "rounds_attributed": sum(named.values()),
            "attributed_by": {k: sum(v.values()) for k, v in by.items()},
            "named_by": {k: {str(w): n for w, n in sorted(v.items())} for k, v in by.items()},
            "steady_lag_ms": {str(w): round(float(np.median(v)) * 1e3, 3)
                              for w, v in sorted(lags.items())},
            "steps_aside": len(aside),
            # from the first step a whole window stands behind: what the
            # steady rule is judged by (docs/slow-or-stuck.md)
            "after_window": {"steps": len(judged),
                             "named": {str(w): n for w, n in sorted(later.items())}},
            "straggler_margin_ms": round(margin * 1e3, 3)}
