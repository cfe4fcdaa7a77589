# SPDX-License-Identifier: Apache-2.0
"""Early Close: when a parameter server stops waiting for a round.

The rule (docs/transport.md has the reasoning). Each worker's flow is judged
on its own clock, which starts at its first delivered chunk, so a worker that
starts late (compute skew) is not cut short by one that started early:

    done      all of the worker's chunks arrived
    early     its delivered fraction >= threshold, and either its deadline
              passed or a grace of `grace_factor` x (the time it took to reach
              the threshold) passed since it got there
    repaired  (rule "progress", and no loss budget: a budget tolerates the
              holes instead) a flow missing no more than `repair_frac` of
              its chunks (1 %: 7 of a 1 MiB push's 737; none of a push under
              100 chunks) is waited for
              while its re-sends may still come: it is given up only once it
              has had no chunk for `repair_factor` x the longest repair seen
              lately (a stall a re-send ended; at least `repair_min_s`), or at
              `stretch_max` x its deadline. What little is missing on a path
              that rarely drops is one re-send away; cutting it cost rounds
              their completeness on a loss-free rig under CPU load (a ring's
              drop or a busy sender's late re-send: 1 ACK-clock round in 10)
    deadline  its deadline passed below the threshold and (rule "progress")
              its flow has stalled: no chunk for max(stall_s, stall_frac x
              its time so far), or `stretch_max` x its deadline passed; a
              worker that sent nothing is given up on `absent_factor` x
              deadline after the round's first chunk
The round closes when every worker is settled, and critical data is in:
    complete  every worker done
    early     some worker closed early, none by deadline
    deadline  some worker settled by deadline (the report names who)
    timeout   the hard timeout passed (the only way to close with critical
              data missing; the report says what is missing)

Adaptation, after every round:
    threshold = clamp(1 - loss_gain * loss_hat, threshold_min, threshold_max)
    with a loss budget (`budget` > 0), the floor is the budget's instead:
    threshold = clamp(1 - loss_gain * loss_hat, 1 - budget^2, threshold_max)
where budget is the filled part's error the rounds may carry, against the
aggregate's own sampling noise (bubble.error_estimate: holes spread evenly
cost sqrt(missing fraction) of it, so a budget b tolerates a b^2 fraction
without waiting for re-sends: 0.35 takes 12 % loss on the first pass);
    deadline  = max(min_deadline_s, deadline_factor * line_time,
                    history_factor * median(recent time-to-threshold))
where loss_hat is an EWMA of the fraction of chunks that were lost at least
once (arrived only as a re-send, or never), line_time = bytes * 8 / rate_hat,
and rate_hat the delivery rate learnt from past rounds, started from the
configured capacity and never above it. Rule "progress" (the default) takes
a round's rate over its delivery (first chunk to the last progress seen, so
waiting for a silent worker does not count) and adopts a lower one at once,
a higher one by EWMA; rule "capacity" (kept for A/B runs) takes an EWMA of
bytes over first-chunk-to-close, and cuts at the deadline whatever the flow
does. Why: the capacity is what the link could carry, not what a sender
reaches (a one-flow round of a CPU-bound sender on a 32 Gbit/s link was
cut at the deadline ten rounds running, at 15-80 % delivered, while every
chunk was on its way); a flow that still delivers at its deadline is not
lost, and the next rounds' deadline should come from the rate it reached.
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import asdict, dataclass

import numpy as np

COMPLETE, EARLY, DEADLINE, TIMEOUT = "complete", "early", "deadline", "timeout"
#: the deadline rules (EarlyCloseConfig.rule): "progress" cuts only a flow that
#: stalled (or at stretch_max x its deadline) and learns the rate flows reach;
#: "capacity" takes the deadline from the capacity alone, kept for A/B runs
RULES = ("progress", "capacity")


@dataclass
class EarlyCloseConfig:
    threshold_max: float = 0.999
    threshold_min: float = 0.95
    loss_gain: float = 2.0
    grace_factor: float = 0.1
    deadline_factor: float = 2.0
    absent_factor: float = 2.0
    history_factor: float = 1.5
    history: int = 8
    min_deadline_s: float = 0.02
    hard_timeout_s: float = 10.0
    ewma: float = 0.3
    rule: str = "progress"
    stall_s: float = 0.005
    stall_frac: float = 0.25
    stretch_max: float = 4.0
    repair_frac: float = 0.01
    budget: float = 0.0
    repair_min_s: float = 0.02
    repair_factor: float = 1.5

    def __post_init__(self) -> None:
        if not 0 < self.threshold_min <= self.threshold_max <= 1:
            raise ValueError("need 0 < threshold_min <= threshold_max <= 1")
        if self.hard_timeout_s <= 0 or self.min_deadline_s <= 0:
            raise ValueError("timeouts must be positive")
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {', '.join(RULES)}, got {self.rule!r}")
        if self.stall_s <= 0 or self.stall_frac < 0 or self.stretch_max < 1:
            raise ValueError("need stall_s > 0, stall_frac >= 0 and stretch_max >= 1")
        if not 0 <= self.budget < 1:
            raise ValueError(f"need 0 <= budget < 1 (0: off), got {self.budget!r}")
        if not 0 <= self.repair_frac < 1:
            raise ValueError(f"need 0 <= repair_frac < 1, got {self.repair_frac!r}")
        if self.repair_min_s <= 0 or self.repair_factor < 1:
            raise ValueError("need repair_min_s > 0 and repair_factor >= 1")


class EarlyClose:
    """Per-receiver Early Close state: decides rounds, learns from them."""

    def __init__(self, capacity_bps: float, config: EarlyCloseConfig | None = None):
        self.cfg = config or EarlyCloseConfig()
        self.capacity_bps = capacity_bps
        self.rate_hat = capacity_bps
        self.loss_hat = 0.0
        self.t_thr_history: deque[float] = deque(maxlen=self.cfg.history)
        # per-round state
        self.threshold = self.cfg.threshold_max
        self.deadline_s = self.cfg.min_deadline_s
        self.t_thr: float | None = None          # round: slowest time-to-threshold
        self._t_thr_w: np.ndarray | None = None  # per worker
        self._flows = _Progress()
        self.repair = 0.0                          # round: the fraction a flow may wait for
        self.repairs: deque[float] = deque(maxlen=16)  # stalls that a re-send ended, s

    def start_round(self, total_bytes: int) -> None:
        c = self.cfg
        # not under a loss budget: its holes are what the budget tolerates (at
        # 20 % loss the wait made 149 of 150 training rounds wait for their
        # last re-sends)
        self.repair = c.repair_frac if c.rule == "progress" and not c.budget else 0.0
        floor = 1 - c.budget ** 2 if c.budget > 0 else c.threshold_min
        self.threshold = min(c.threshold_max, max(floor, 1 - c.loss_gain * self.loss_hat))
        line = total_bytes * 8 / max(self.rate_hat, 1.0)
        hist = c.history_factor * statistics.median(self.t_thr_history) if self.t_thr_history else 0
        self.deadline_s = max(c.min_deadline_s, c.deadline_factor * line, hist)
        self.t_thr = None
        self._t_thr_w = None
        self._flows = _Progress()

    def repair_s(self) -> float:
        """How long a flow missing a few chunks may go without one before it
        is given up: `repair_factor` x the longest repair seen lately."""
        seen = max(self.repairs, default=0.0)
        return max(self.cfg.repair_min_s, self.cfg.repair_factor * seen)

    def observe(self, now: float, first: np.ndarray, fractions: np.ndarray,
                resent: np.ndarray | None = None) -> None:
        """Take one look at the flows without deciding (`decide` takes one
        too): the look at a round's completion learns the repair that ended it."""
        self.repairs.extend(self._flows.see(now, first, fractions, resent))

    def decide(self, now: float, first: np.ndarray, fractions: np.ndarray,
               critical_ok: bool, resent: np.ndarray | None = None) -> str | None:
        """Reason to close the round now, or None.

        now: seconds since the round opened; first: per worker, seconds since
        open of its first delivered chunk (nan until one arrives); fractions:
        per worker, delivered fraction of its chunks; resent: per worker, the
        chunks that arrived as re-sends so far (what repairs are learnt from)."""
        self.observe(now, first, fractions, resent)
        if (fractions >= 1.0).all():
            return COMPLETE
        if now >= self.cfg.hard_timeout_s:
            return TIMEOUT
        if not critical_ok:
            return None
        if self._t_thr_w is None:
            self._t_thr_w = np.full(fractions.shape, np.nan)
        seen = ~np.isnan(first)
        if not seen.any():
            return None
        since = np.where(seen, now - np.where(seen, first, 0.0), np.nan)
        reached = seen & (fractions >= self.threshold) & np.isnan(self._t_thr_w)
        self._t_thr_w[reached] = since[reached]
        t_thr = self._t_thr_w
        # a flow that never reached the threshold (so is not done) and is
        # within its deadline is none of done, early, late or absent below:
        # the round stays open (most decisions of a round end here)
        if (seen & np.isnan(t_thr) & (since < self.deadline_s)).any():
            return None
        at_thr = ~np.isnan(t_thr)
        done = fractions >= 1.0
        little = seen & ~done & (1.0 - fractions <= self.repair + 1e-12)
        given_up = little & ((now - self._flows.moved >= self.repair_s())
                             | (since >= self.cfg.stretch_max * self.deadline_s))
        early = at_thr & ~done & ~little & (
            (since >= self.deadline_s) | (since - t_thr >= self.cfg.grace_factor * t_thr))
        early |= given_up & at_thr
        late = seen & ~at_thr & ~little & (since >= self.deadline_s)
        if self.cfg.rule == "progress" and late.any():  # still delivering: not lost
            c = self.cfg
            late &= ((now - self._flows.moved >= np.maximum(c.stall_s, c.stall_frac * since))
                     | (since >= c.stretch_max * self.deadline_s))
        absent = ~seen & (now - np.nanmin(first) >= self.cfg.absent_factor * self.deadline_s)
        late |= given_up & ~at_thr & (since >= self.deadline_s)
        if not (done | early | late | absent).all():
            return None
        if at_thr.any():
            self.t_thr = float(np.nanmax(t_thr))
        return DEADLINE if (late | absent).any() else EARLY

    def end_round(self, *, total_bytes: int, delivered_bytes: int, active_s: float,
                  lost_fraction: float) -> None:
        """Learn from a closed round: delivery rate, loss, time to threshold."""
        a = self.cfg.ewma
        if self.cfg.rule == "progress":
            span = self._flows.span() if delivered_bytes < total_bytes else None
            active_s = min(active_s, span) if span else active_s
        if active_s > 0 and delivered_bytes > 0:
            rate = min(self.capacity_bps, delivered_bytes * 8 / active_s)
            if self.cfg.rule == "progress" and rate < self.rate_hat:
                self.rate_hat = rate  # what flows reached, not what the link could carry
            else:
                self.rate_hat = (1 - a) * self.rate_hat + a * rate
        self.loss_hat = (1 - a) * self.loss_hat + a * min(1.0, max(0.0, lost_fraction))
        if self.t_thr is not None:
            self.t_thr_history.append(self.t_thr)

    def state(self) -> dict:
        return {"threshold": self.threshold, "deadline_s": self.deadline_s,
                "rate_hat_bps": self.rate_hat, "loss_hat": self.loss_hat,
                "config": asdict(self.cfg)}


class _Progress:
    """When each flow of a round last delivered (seconds after open, as the
    decisions saw it), and the round's delivery span."""

    def __init__(self):
        self.frac: np.ndarray | None = None
        self.moved: np.ndarray | None = None
        self.resent: np.ndarray | None = None
        self.first = self.last = np.nan

    def see(self, now: float, first: np.ndarray, fractions: np.ndarray,
            resent: np.ndarray | None = None) -> list[float]:
        """Take one look; returns the repairs it saw: for each flow whose
        re-sent count grew, how long it had gone without a chunk before."""
        if self.frac is None:
            self.frac = np.zeros(fractions.shape)
            self.moved = np.full(fractions.shape, np.nan)
        repairs: list[float] = []
        if resent is not None:
            if self.resent is not None:
                grew = (resent > self.resent) & ~np.isnan(self.moved)
                repairs = (now - self.moved[grew]).tolist()
            self.resent = np.array(resent)
        went = fractions > self.frac
        if went.any():
            self.moved[went] = now
            self.last = now
            self.frac = np.array(fractions, dtype=float)
        if np.isnan(self.first) and (~np.isnan(first)).any():
            self.first = float(np.nanmin(first))
        return repairs

    def span(self) -> float | None:
        """First chunk to the last progress seen, or None if not measured."""
        d = self.last - self.first
        return float(d) if d > 0 else None
