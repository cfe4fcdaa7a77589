# SPDX-License-Identifier: Apache-2.0
"""Early Close: when a parameter server stops waiting for a round.

The rule (docs/transport.md has the reasoning). Each worker's flow is judged
on its own clock, which starts at its first delivered chunk, so a worker that
starts late (compute skew) is not cut short by one that started early:

    done      all of the worker's chunks arrived
    early     its delivered fraction >= threshold, and either its deadline
              passed or a grace of `grace_factor` x (the time it took to reach
              the threshold) passed since it got there
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

    def __post_init__(self) -> None:
        if not 0 < self.threshold_min <= self.threshold_max <= 1:
            raise ValueError("need 0 < threshold_min <= threshold_max <= 1")
        if self.hard_timeout_s <= 0 or self.min_deadline_s <= 0:
            raise ValueError("timeouts must be positive")
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {', '.join(RULES)}, got {self.rule!r}")
        if self.stall_s <= 0 or self.stall_frac < 0 or self.stretch_max < 1:
            raise ValueError("need stall_s > 0, stall_frac >= 0 and stretch_max >= 1")


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

    def start_round(self, total_bytes: int) -> None:
        c = self.cfg
        self.threshold = min(c.threshold_max, max(c.threshold_min, 1 - c.loss_gain * self.loss_hat))
        line = total_bytes * 8 / max(self.rate_hat, 1.0)
        hist = c.history_factor * statistics.median(self.t_thr_history) if self.t_thr_history else 0
        self.deadline_s = max(c.min_deadline_s, c.deadline_factor * line, hist)
        self.t_thr = None
        self._t_thr_w = None
        self._flows = _Progress()

    def decide(self, now: float, first: np.ndarray, fractions: np.ndarray,
               critical_ok: bool) -> str | None:
        """Reason to close the round now, or None.

        now: seconds since the round opened; first: per worker, seconds since
        open of its first delivered chunk (nan until one arrives); fractions:
        per worker, delivered fraction of its chunks."""
        if (fractions >= 1.0).all():
            return COMPLETE
        if now >= self.cfg.hard_timeout_s:
            return TIMEOUT
        self._flows.see(now, first, fractions)
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
        at_thr = ~np.isnan(t_thr)
        done = fractions >= 1.0
        early = at_thr & ~done & ((since >= self.deadline_s) |
                                  (since - t_thr >= self.cfg.grace_factor * t_thr))
        late = seen & ~at_thr & (since >= self.deadline_s)
        if self.cfg.rule == "progress" and late.any():  # still delivering: not lost
            c = self.cfg
            late &= ((now - self._flows.moved >= np.maximum(c.stall_s, c.stall_frac * since))
                     | (since >= c.stretch_max * self.deadline_s))
        absent = ~seen & (now - np.nanmin(first) >= self.cfg.absent_factor * self.deadline_s)
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
        self.first = self.last = np.nan

    def see(self, now: float, first: np.ndarray, fractions: np.ndarray) -> None:
        if self.frac is None:
            self.frac = np.zeros(fractions.shape)
            self.moved = np.full(fractions.shape, np.nan)
        went = fractions > self.frac
        if went.any():
            self.moved[went] = now
            self.last = now
            self.frac = np.array(fractions, dtype=float)
        if np.isnan(self.first) and (~np.isnan(first)).any():
            self.first = float(np.nanmin(first))

    def span(self) -> float | None:
        """First chunk to the last progress seen, or None if not measured."""
        d = self.last - self.first
        return float(d) if d > 0 else None
