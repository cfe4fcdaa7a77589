# SPDX-License-Identifier: Apache-2.0
"""The loss policy (control/torchapi/losspolicy.py, issue 42): what a step
does with the loss it meets, chosen per step by the server.

Here, from uplink losses fed in as the link measures them (on rounds opened
with no budget): fixed policies never change; auto on a lossless or lightly
lossy path keeps the paper's rule; on a lossy one it waits out its warm-up,
ramps, then budgets by the measured loss, probing without a budget every
PROBE-th step, with hysteresis; an explicit budget holds; the choice
travels in the step report. The policy on real rounds: tests/test_train.py.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from ltpx.control.torchapi import losspolicy as lp
from ltpx.control.torchapi.losspolicy import Choice, LossPolicy
from ltpx.control.torchapi.ops import StepReport, report_words
from ltpx.control.transport.defer import MAX_DEFERRED


def _run(pol: LossPolicy, steps: int, up: float) -> list[Choice]:
    """`steps` steps whose uplink rounds lose `up` of their chunks' first
    sends: measured, as the link does, only on rounds opened with no budget
    (those of the last choice)."""
    out = []
    for _ in range(steps):
        if not pol.choice.budget:
            pol.saw_uplink(up)
        out.append(pol.choose())
    return out


@pytest.mark.unit
@pytest.mark.parametrize("policy,cap", [("repair", 0.0), ("defer", MAX_DEFERRED)])
def test_a_fixed_policy_never_changes_its_mind(policy, cap):
    pol = LossPolicy(policy, budget=0.35)
    got = _run(pol, 5, 0.0) + _run(pol, 5, 0.3)
    assert {(c.cap, c.budget, c.why) for c in got} == {(cap, 0.35, "fixed")}
    assert pol.summary()["switches"] == []


@pytest.mark.unit
@pytest.mark.parametrize("loss", [0.0, 0.01])
def test_auto_on_a_lossless_or_lightly_lossy_path_keeps_the_papers_rule(loss):
    pol = LossPolicy("auto", warmup=3)
    got = _run(pol, 30, loss)
    assert {(c.mode, c.budget, c.why) for c in got} == {("repair", 0.0, "lossless")}
    assert pol.summary()["steps"] == {"repair": 30}


@pytest.mark.unit
def test_auto_budgets_heavy_loss_after_its_warmup_and_ramp_and_probes():
    """20 % loss: no budget for the warm-up's 10 steps, a growing one over the
    next 10, then a budget whose square is BUDGET_GAIN x the loss (at most
    BUDGET_MAX), but for every PROBE-th step, which runs without one to
    measure the loss again. Answers stay whole throughout."""
    pol = LossPolicy("auto", warmup=10)
    got = _run(pol, 60, 0.2)
    assert all(c.budget == 0 and c.why == "warmup" for c in got[:10])
    ramp = [c for c in got[10:19] if c.why != "probe"]
    assert {c.why for c in ramp} == {"ramp"} and len(ramp) >= 8
    assert all(0 < a.budget < b.budget for a, b in zip(ramp, ramp[1:]))
    full = got[20:]
    assert [i + 21 for i, c in enumerate(full) if c.why == "probe"] == \
        list(range(30, 61, lp.PROBE))
    assert all(c.budget == 0 for c in full if c.why == "probe")
    steady = {(c.why, c.budget) for c in full if c.why != "probe"}
    assert steady == {("lossy", min(lp.BUDGET_MAX, math.sqrt(lp.BUDGET_GAIN * 0.2)))}
    assert {c.mode for c in got} == {"repair"}
    s = pol.summary()
    assert s["uplink_loss"] == pytest.approx(0.2)
    assert s["steps"]["budget"] == 60 - 10 - 5          # probes at 20, 30, .., 60
    assert [w["step"] for w in s["switches"]] == [11]   # probes are no change of mind


@pytest.mark.unit
def test_by_default_auto_budgets_from_the_second_step_and_says_when():
    """loss_warmup 0 (the default): the first step measures, the next has
    the full budget, and that change of mind is listed at step 1."""
    pol = LossPolicy("auto")
    got = _run(pol, 4, 0.2)
    assert [c.why for c in got] == ["lossy"] * 4
    assert got[0].budget == min(lp.BUDGET_MAX, math.sqrt(lp.BUDGET_GAIN * 0.2))
    assert [(w["step"], w["from"]["why"], w["to"]["why"]) for w in pol.summary()["switches"]] \
        == [(1, "warmup", "lossy")]


@pytest.mark.unit
def test_the_budget_grows_with_the_loss_it_measures():
    budgets = [_run(LossPolicy("auto", warmup=0), 21, p)[-1].budget for p in (0.05, 0.1, 0.3)]
    assert 0 < budgets[0] < budgets[1] < budgets[2] == lp.BUDGET_MAX


@pytest.mark.unit
def test_auto_keeps_its_budget_inside_the_hysteresis_band_and_leaves_it_below():
    pol = LossPolicy("auto", warmup=0)
    assert _run(pol, 5, 0.2)[-1].budget > 0
    mid = (lp.BUDGET_ON + lp.BUDGET_OFF) / 2      # between the two: still budgeted
    assert all(c.budget > 0 for c in _run(pol, 40, mid)[20:] if c.why != "probe")
    assert _run(pol, 40, 0.0)[-1].budget == 0     # measured on the probes, it ends
    assert {c.budget for c in _run(pol, 20, mid)} == {0.0}   # and does not come back


@pytest.mark.unit
def test_an_explicit_budget_holds_under_auto():
    pol = LossPolicy("auto", budget=0.2, warmup=0)
    got = _run(pol, 10, 0.0) + _run(pol, 10, 0.4)
    assert {(c.budget, c.why) for c in got} == {(0.2, "fixed")}


@pytest.mark.unit
def test_a_bad_policy_is_refused():
    with pytest.raises(ValueError, match="loss_policy: one of auto, repair, defer"):
        LossPolicy("sometimes")


@pytest.mark.unit
def test_the_choice_travels_in_the_step_report():
    ids = [0, 1]
    rep = StepReport(step=7, reasons=["early"], delivered=dict.fromkeys(ids, 0.9),
                     filled_chunks=dict.fromkeys(ids, 1), wholly_filled=dict.fromkeys(ids, 0),
                     ks=[1, 1], gather_s=0.01, policy=Choice(cap=0.0, budget=0.36, why="ramp"))
    out = np.zeros(report_words(1, 2), dtype=np.float32)
    rep.encode(out)
    back = StepReport.decode(out)
    assert (back.policy.why, back.policy.mode) == ("ramp", "repair")
    assert back.policy.budget == pytest.approx(0.36)
    assert back.to_dict()["loss_policy"] == {"mode": "repair", "cap": 0.0, "budget": 0.36,
                                             "why": "ramp", "wire": "none"}
    deferring = StepReport.decode(_encoded(rep, Choice(cap=MAX_DEFERRED, why="fixed")))
    assert deferring.policy.mode == "defer"
    halved = StepReport.decode(_encoded(rep, Choice(budget=0.4, why="lossy", wire="bf16")))
    assert (halved.policy.wire, halved.policy.why) == ("bf16", "lossy")


@pytest.mark.unit
def test_auto_halves_the_wire_on_a_lossy_path_and_back_with_hysteresis():
    """With `half` (compress auto, error feedback): float32 while the path is
    clean or lightly lossy, bf16 from HALF_ON on, kept down to HALF_OFF
    (probe steps included), float32 again below it; the switches are logged."""
    pol = LossPolicy("auto", warmup=0, half=True)
    assert {c.wire for c in _run(pol, 20, 0.01)} == {"none"}
    lossy = _run(pol, 25, 0.2)
    assert lossy[-1].wire == "bf16"
    assert {c.wire for c in lossy[-20:]} == {"bf16"}     # probes too
    assert any(c.why == "probe" for c in lossy[-20:])
    mid = (lp.HALF_ON + lp.HALF_OFF) / 2
    pol.up = mid                        # between the marks: the wire stays
    assert pol.choose().wire == "bf16"
    assert {c.wire for c in _run(pol, 25, 0.0)[-10:]} == {"none"}
    assert pol.summary()["steps"]["bf16"] >= 20
    assert [(s["from"]["wire"], s["to"]["wire"]) for s in pol.switches
            if s["from"]["wire"] != s["to"]["wire"]] == [("none", "bf16"), ("bf16", "none")]
    fresh = LossPolicy("auto", warmup=0, half=True)
    fresh.up = mid                      # never on: below HALF_ON it does not start
    assert fresh.choose().wire == "none"
    fresh.up = 0.3                      # a wbsp step's workers take no wire: float32
    assert fresh.choose(half=False).wire == "none" and fresh.choose().wire == "bf16"
    # a user's floor (held: e.g. rounds that close only complete) asks for
    # exact answers: float32, whatever the loss
    assert fresh.choose(held=True) == Choice(why="held")


@pytest.mark.unit
@pytest.mark.parametrize("policy,half", [("auto", False), ("repair", True), ("defer", True)])
def test_the_wire_stays_float32_unless_auto_may_choose_it(policy, half):
    """No `half` (compress not auto, or no error feedback), or a fixed policy:
    float32 at any loss."""
    pol = LossPolicy(policy, warmup=0, half=half)
    assert {c.wire for c in _run(pol, 30, 0.3)} == {"none"}


def _encoded(rep: StepReport, policy: Choice) -> np.ndarray:
    rep.policy = policy
    out = np.zeros(report_words(len(rep.reasons), len(rep.delivered)), dtype=np.float32)
    rep.encode(out)
    return out


@pytest.mark.unit
def test_the_link_applies_the_budget_unless_the_ops_early_close_fields_fix_one():
    """The server's LTP link (no endpoint needed): a step's honest rounds'
    counts reach the policy once, at its choice; the budget chosen goes into
    every round kind's Early Close config; a `budget` in the op's Early Close
    fields rules instead, as early_config has it."""
    from ltpx.control.torchapi.link_ltp import LtpServerLink
    from ltpx.control.torchapi.settings import Settings
    link = LtpServerLink(Settings(dev="lo", ip="127.0.0.1", loss_warmup=0), 2, None)
    kinds = [link.policy(k) for k in (0, 1)]
    link.measured = [30, 100]                # 30 of 100 chunks in came only as re-sends
    c = link.choose()
    assert link.loss.up == pytest.approx(0.3) and link.measured == [0, 0]
    assert c.budget == lp.BUDGET_MAX and {p.cfg.budget for p in kinds} == {lp.BUDGET_MAX}
    link.configure("mean", '{"budget": 0.25}')
    fixed = link.policy(0)
    assert fixed.cfg.budget == 0.25
    link.measured = [30, 100]
    assert link.choose().budget == lp.BUDGET_MAX and fixed.cfg.budget == 0.25


@pytest.mark.unit
def test_early_close_fields_that_fix_the_floor_hold_autos_budget_off():
    """An op whose Early Close fields fix threshold_min (LTP_EARLY_CLOSE:
    rounds that close only complete, for bit-equality with gloo) gets no
    budget of auto's: its floor would close rounds early under the incast
    loss a lossless rig's queues still make. An explicit loss_budget holds."""
    from ltpx.control.torchapi.link_ltp import LtpServerLink
    from ltpx.control.torchapi.settings import Settings
    link = LtpServerLink(Settings(dev="lo", ip="127.0.0.1", loss_warmup=0), 2, None)
    link.configure("mean", '{"threshold_min": 1.0, "threshold_max": 1.0}')
    whole = link.policy(0)
    for _ in range(5):
        link.measured = [30, 100]
        c = link.choose()
        assert (c.budget, c.why) == (0.0, "held") and whole.cfg.budget == 0.0
        whole.start_round(1 << 20)
        assert whole.threshold == 1.0
    assert link.loss.up == pytest.approx(0.3)          # still measured
    # rounds opened for such an op after a budgeted step start without it too
    link.configure("mean", "{}")
    link.measured = [30, 100]
    assert link.choose().budget == lp.BUDGET_MAX
    link.configure("mean", '{"threshold_min": 1.0, "threshold_max": 1.0}')
    assert link.policy(0).cfg.budget == 0.0
    link.configure("mean", "{}")                       # the fields gone: auto budgets again
    link.measured = [30, 100]
    assert link.choose().budget == lp.BUDGET_MAX and link.policy(0).cfg.budget == lp.BUDGET_MAX
    pinned = LtpServerLink(Settings(dev="lo", ip="127.0.0.1", loss_budget=0.2), 2, None)
    pinned.configure("mean", '{"threshold_min": 1.0}')
    assert pinned.choose().budget == 0.2
