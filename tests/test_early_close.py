# SPDX-License-Identifier: Apache-2.0
"""Early Close's deadline rules on simulated rounds (no kernel: the receiver
calls `decide` about once a millisecond with each flow's delivered fraction,
as here). Rule "progress" (the default) must not cut a flow that is still
delivering at its deadline, and learns the rate flows reach; rule
"capacity" (a deadline from the link's capacity alone) is kept for A/B runs."""
from __future__ import annotations

import numpy as np
import pytest

from ltpx.control.transport.early_close import EarlyClose, EarlyCloseConfig

MB = 1_000_000
nan = np.nan


def run_round(ec: EarlyClose, fractions, workers: int = 1, total: int = MB,
              step: float = 0.001, until: float = 5.0) -> tuple[str, float]:
    """Drive one round: fractions(t) gives every flow's delivered fraction at
    t seconds after open; a flow's first chunk is the first tick it is > 0.
    Returns (reason, close time) and lets `ec` learn from it."""
    ec.start_round(total)
    first = np.full(workers, nan)
    t = 0.0
    while t < until:
        t = round(t + step, 9)
        f = np.asarray(fractions(t), dtype=float)
        first[np.isnan(first) & (f > 0)] = t
        reason = ec.decide(t, first, f, True)
        if reason is not None:
            break
    f = np.asarray(fractions(t), dtype=float)
    delivered = int(f.mean() * total)
    active = t - float(np.nanmin(first))
    ec.end_round(total_bytes=total, delivered_bytes=delivered, active_s=active,
                 lost_fraction=1 - f.mean())
    return reason, t


def steady(rate_bps: float, total: int = MB, start: float = 0.0):
    """One flow delivering `total` bytes at `rate_bps` from `start`."""
    return lambda t: [min(1.0, max(0.0, (t - start) * rate_bps / 8 / total))]


@pytest.mark.unit
def test_a_flow_slower_than_the_capacity_is_not_cut_while_it_delivers():
    # 1 MB at a 10 Gbit/s "capacity": deadline max(20 ms, 2 x 0.8 ms) = 20 ms
    # from the first chunk (1 ms); the sender reaches 0.05 Gbit/s: 160 ms per round
    ec = EarlyClose(10e9)
    assert ec.cfg.rule == "progress"
    reason, t = run_round(ec, steady(0.05e9))
    assert reason == "deadline" and t == pytest.approx(0.001 + 4 * 0.020)  # stretch_max
    # it learnt the rate the flow reached: the next rounds' deadline covers them
    assert ec.rate_hat == pytest.approx(0.05e9, rel=0.05)
    for _ in range(3):
        reason, t = run_round(ec, steady(0.05e9))
        assert reason == "complete" and t == pytest.approx(0.160, abs=0.0015)
        assert ec.deadline_s >= 0.300


@pytest.mark.unit
def test_the_capacity_rule_cuts_the_same_flow_round_after_round():
    ec = EarlyClose(10e9, EarlyCloseConfig(rule="capacity"))
    cut = []
    for _ in range(4):
        reason, t = run_round(ec, steady(0.05e9))
        cut.append((reason, round(t, 3)))
    assert cut == [("deadline", 0.021)] * 4  # the EWMA from 10 Gbit/s learns too slowly


@pytest.mark.unit
def test_a_stalled_flow_is_cut_at_its_deadline():
    ec = EarlyClose(1e9)  # 1 MB: deadline 20 ms from the first chunk (1 ms)
    reason, t = run_round(ec, lambda t: [min(0.5, t * 50)])  # half by 10 ms, then nothing
    assert (reason, t) == ("deadline", pytest.approx(0.021))


@pytest.mark.unit
def test_a_flow_that_stalls_after_its_deadline_is_cut_once_stalled():
    ec = EarlyClose(1e9)
    # delivering until 24 ms (then silent): stalled once 25 % of its time
    # since its first chunk (at least 5 ms) passed without a chunk, at ~32 ms,
    # long before 4 x 20 ms
    reason, t = run_round(ec, lambda t: [min(0.9, t * 0.9 / 0.024)])
    assert reason == "deadline"
    assert 0.030 <= t <= 0.034


@pytest.mark.unit
def test_learning_ignores_the_wait_for_a_silent_worker():
    """Worker 1 sends nothing: the round waits absent_factor x deadline; the
    rate learnt is over worker 0's delivery (8 ms for 0.5 MB: 0.5 Gbit/s),
    so the wait does not stretch the next deadlines (rule capacity counts
    the whole wait: 0.5 MB over 40 ms)."""
    both = {}
    for rule in ("progress", "capacity"):
        ec = EarlyClose(1e9, EarlyCloseConfig(rule=rule, ewma=1.0))
        reason, t = run_round(ec, lambda t: [min(1.0, t / 0.008), 0.0], workers=2)
        assert reason == "deadline" and t == pytest.approx(0.041, abs=0.0015)
        both[rule] = ec.rate_hat
    assert both["progress"] == pytest.approx(0.5e9, rel=0.15)
    assert both["capacity"] == pytest.approx(0.5 * MB * 8 / 0.040, rel=0.1)


@pytest.mark.unit
def test_rate_falls_at_once_and_rises_by_ewma():
    ec = EarlyClose(1e9)
    ec.end_round(total_bytes=MB, delivered_bytes=MB, active_s=0.016, lost_fraction=0)
    assert ec.rate_hat == pytest.approx(0.5e9)  # lower: adopted at once
    ec.end_round(total_bytes=MB, delivered_bytes=MB, active_s=0.008, lost_fraction=0)
    assert ec.rate_hat == pytest.approx(0.7 * 0.5e9 + 0.3 * 1e9)  # higher: EWMA
    ec.end_round(total_bytes=MB, delivered_bytes=MB, active_s=0.0001, lost_fraction=0)
    assert ec.rate_hat <= 1e9  # never above the capacity


@pytest.mark.unit
def test_incast_rounds_close_alike_under_both_rules():
    """16 flows sharing 1 Gbit/s (a round of 33.6 ms at line rate), all
    reaching the threshold before the deadline: the progress rule decides
    exactly as the capacity rule did, complete or early after the grace
    (the repair wait off: flow 3's 0.5 % would be waited for, tested below)."""
    total = 16 * 256 * 1024
    def flows(t):  # flow i delivers 1/16 of the link, the last 0.5 % of flow 3 lost
        f = np.minimum(1.0, t * 1e9 / 8 / (total / 16) / 16 * np.ones(16))
        f[3] = min(f[3], 0.995)
        return f
    out = {}
    for rule in ("progress", "capacity"):
        ec = EarlyClose(1e9, EarlyCloseConfig(rule=rule, threshold_max=0.99, repair_frac=0.0))
        out[rule] = [run_round(ec, flows, workers=16, total=total) for _ in range(3)]
    assert out["progress"] == out["capacity"]
    assert {r for r, _ in out["progress"]} == {"early"}


@pytest.mark.unit
def test_bad_rule_and_stall_settings_are_refused():
    with pytest.raises(ValueError, match="rule"):
        EarlyCloseConfig(rule="fast")
    with pytest.raises(ValueError, match="stretch_max"):
        EarlyCloseConfig(stretch_max=0.5)
    with pytest.raises(ValueError, match="stall_s"):
        EarlyCloseConfig(stall_s=0)


def tail(missing: int, n: int = 737, t_thr: float = 0.005):
    """One flow that reaches all but `missing` of its n chunks at t_thr and
    then stops (those chunks lost, their re-sends not yet in)."""
    return lambda t: [min(t / t_thr, 1.0) * (n - missing) / n]


@pytest.mark.unit
def test_a_flow_missing_a_chunk_or_two_is_waited_for_while_a_repair_may_come():
    # a few dropped chunks before pulled the threshold under 736/737; the grace
    # (10 % of the time to the threshold) then cut the round with one chunk
    # still to be re-sent. Now it is given up only after repair_min_s (20 ms)
    # without a chunk
    for missing in (1, 3, 7):
        ec = EarlyClose(1e9, EarlyCloseConfig(threshold_max=0.99))
        reason, t = run_round(ec, tail(missing))
        assert reason == "early" and t == pytest.approx(0.005 + 0.020, abs=0.0015), (missing, t)
    # more than 1 % missing is what loss tolerance is for: cut after the grace
    ec = EarlyClose(1e9, EarlyCloseConfig(threshold_max=0.98))
    reason, t = run_round(ec, tail(10))
    assert reason == "early" and t < 0.5 * ec.deadline_s


@pytest.mark.unit
def test_the_repair_wait_learns_how_long_repairs_take():
    """A flow that missed one chunk had it re-sent 19 ms after its last chunk
    (inside the 20 ms wait): the next rounds wait 1.5 x that."""
    ec = EarlyClose(1e9, EarlyCloseConfig(threshold_max=0.99))
    ec.start_round(MB)
    first, n, lands = np.array([0.001]), 737, 0.020
    for ms in range(1, 60):
        t = ms / 1000
        reason = ec.decide(t, first, np.array([(n - (t < lands)) / n]), True,
                           np.array([int(t >= lands)]))
        if reason:
            break
    assert reason == "complete" and max(ec.repairs) == pytest.approx(0.019)
    assert ec.repair_s() == pytest.approx(1.5 * 0.019)
    reason, t = run_round(ec, tail(1))
    assert reason == "early" and t == pytest.approx(0.005 + 0.0285, abs=0.0015)


@pytest.mark.unit
def test_the_repair_wait_is_off_under_the_capacity_rule_or_at_0():
    for cfg in (EarlyCloseConfig(threshold_max=0.99, rule="capacity"),
                EarlyCloseConfig(threshold_max=0.99, repair_frac=0.0)):
        ec = EarlyClose(1e9, cfg)
        reason, t = run_round(ec, tail(1))
        assert reason == "early" and t == pytest.approx(0.006), cfg   # the grace, as before
    with pytest.raises(ValueError, match="repair_frac"):
        EarlyCloseConfig(repair_frac=1.0)


@pytest.mark.unit
def test_a_loss_budget_lowers_the_floor_to_what_it_tolerates():
    """Loss measured at 20 %: the paper's rule stops at the 0.95 floor (and
    waits for re-sends to get there); a budget of 0.35 of the aggregate's
    noise takes a 12 % hole, so a flow whose first pass delivered 88 % closes
    after the grace."""
    plain, budget = (EarlyClose(1e9, EarlyCloseConfig(budget=b)) for b in (0.0, 0.35))
    for ec in (plain, budget):
        for _ in range(10):
            ec.end_round(total_bytes=MB, delivered_bytes=MB, active_s=0.008, lost_fraction=0.2)
    first_pass = lambda t: [min(t / 0.008, 1.0) * 0.88]   # noqa: E731
    reason, t = run_round(plain, first_pass, until=0.3)
    assert plain.threshold == 0.95 and reason == "deadline"
    reason, t = run_round(budget, first_pass, until=0.3)
    assert budget.threshold == pytest.approx(1 - 0.35 ** 2) and reason == "early"
    assert t < 0.012
    with pytest.raises(ValueError, match="budget"):
        EarlyCloseConfig(budget=1.0)


@pytest.mark.unit
def test_a_loss_budget_tolerates_what_the_repair_wait_would_wait_for():
    """Under a loss budget a flow missing a chunk is cut after the grace:
    the budget's holes are what waiting for re-sends would cost."""
    ec = EarlyClose(1e9, EarlyCloseConfig(threshold_max=0.99, budget=0.35))
    reason, t = run_round(ec, tail(1))
    assert ec.repair == 0.0 and reason == "early" and t < 0.01
