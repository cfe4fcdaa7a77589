# SPDX-License-Identifier: Apache-2.0
"""Straggler attribution's rule (control/transport/straggler.py) on arrival
times as the receiver copies them (results.Arrivals); the rig tests of
`ltp train --straggler` are in test_straggler_rig.py."""
from __future__ import annotations

import numpy as np
import pytest

from ltpx.control.transport.results import Arrivals
from ltpx.control.transport.straggler import MARGIN_MIN_S, StepStragglers, attribute

pytestmark = pytest.mark.unit
MS = 1_000_000


def arrivals(first_ms, last_ms, close_ms=100.0) -> Arrivals:
    def ns(v):
        return np.array([int(x * MS) for x in v], dtype=np.int64)
    return Arrivals(open_ns=0, close_ns=int(close_ms * MS), first_ns=ns(first_ms),
                    last_ns=ns(last_ms), thresh_ns=ns(last_ms))


def test_the_last_worker_beyond_the_margin_is_named_with_its_lateness():
    a = arrivals([1, 1, 40, 1], [30, 31, 70, 30.5])
    att = attribute(a, [0, 1, 2, 3], np.array([10, 10, 10, 10]), "complete")
    assert (att.critical, att.cause) == (2, "last")
    # lateness: last arrival minus the median last (30.75 ms)
    assert att.lateness == pytest.approx({0: -0.00075, 1: 0.00025, 2: 0.03925, 3: -0.00025})
    assert att.to_dict()["critical"] == 2


def test_within_the_margin_no_one_is_named():
    # the last is 1.25 ms behind the median: noise under the 2 ms floor
    a = arrivals([1, 1, 1, 1], [15, 16, 17, 15.5])
    att = attribute(a, [0, 1, 2, 3], np.array([10] * 4), "early")
    assert att.critical is None and att.cause == "" and att.margin_s == MARGIN_MIN_S
    # a longer round widens the margin: 10 % of its span (here 80 ms -> 8 ms)
    a = arrivals([1, 1, 1, 1], [81, 81, 88, 81])
    assert attribute(a, [0, 1, 2, 3], np.array([10] * 4), "complete").critical is None
    a = arrivals([1, 1, 1, 1], [81, 81, 90, 81])
    assert attribute(a, [0, 1, 2, 3], np.array([10] * 4), "complete").critical == 2


def test_a_round_cut_by_its_deadline_names_whom_it_waited_for():
    # worker 7 sent nothing: it counts as arriving at the close, and is named
    a = arrivals([1, 1, 0], [30, 31, 0], close_ms=60)
    att = attribute(a, [5, 6, 7], np.array([10, 10, 0]), "deadline")
    assert (att.critical, att.cause) == (7, "waited")
    assert att.lateness[7] == pytest.approx(0.0295)
    # holes in two: the fewer delivered is named, even if its last came earlier
    a = arrivals([1, 1, 1], [30, 50, 40])
    assert attribute(a, [0, 1, 2], np.array([10, 9, 4]), "timeout").critical == 2
    # a deadline close with every chunk in falls back to the last-chunk rule
    a = arrivals([1, 1, 1], [30, 30, 31])
    assert attribute(a, [0, 1, 2], np.array([10, 10, 10]), "deadline").critical is None


def test_nothing_to_attribute_without_arrivals():
    assert attribute(None, [0, 1], np.array([1, 1]), "complete").critical is None
    a = arrivals([0, 0], [0, 0])
    assert attribute(a, [0, 1], np.array([0, 0]), "timeout").critical is None


def test_a_step_names_the_worker_named_in_most_of_its_rounds():
    st = StepStragglers(4)
    rounds = [([30, 30, 70, 30], "complete"), ([30, 30, 70, 30], "complete"),
              ([30, 50, 30, 30], "complete"), ([30, 30, 30.5, 30], "complete")]
    for last, reason in rounds:
        st.add(attribute(arrivals([1] * 4, last), [0, 1, 2, 3], np.array([9] * 4), reason))
    st.add(None)    # a round without arrival times (TCP) adds nothing
    assert st.straggler() == 2
    assert st.lateness()[2] == pytest.approx((0.04 + 0.04 + 0 + 0.0005) / 4)
    assert StepStragglers(3).straggler() is None and StepStragglers(3).lateness() == {}


def test_the_run_names_the_barriers_last_arriver_beyond_the_margin():
    from ltpx.control.training.straggler_report import attribute_steps
    # worker 2 arrived last at steps 1-3 and the others waited 40 ms for it at
    # 1 and 2, 3 ms (under the 5 ms margin) at 3; the server's NIC named 1 at 3
    # and 4; step 5 nobody
    notes = {0: {"last": [4], "waited_ms": {"1": 40, "2": 41}},
             1: {"last": [5], "waited_ms": {"1": 39, "2": 40}},
             2: {"last": [1, 2, 3], "waited_ms": {}},
             3: {"last": [], "waited_ms": {"1": 40, "2": 42}}}
    out = attribute_steps(notes, {3: 1, 4: 1}, steps=5, step_s=0.02)
    assert out["straggler_rounds"] == {"1": 2, "2": 2}
    assert out["rounds_attributed"] == 4 and out["attributed_by"] == {"barrier": 2, "nic": 2}
    # a long step widens the margin: 10 % of 0.5 s is 50 ms, more than the waits
    assert attribute_steps(notes, {}, steps=5, step_s=0.5)["rounds_attributed"] == 0


def test_the_trace_checker_finds_what_perfetto_would_refuse():
    from ltpx.control.torchapi.trace import chrome_trace, problems
    good = chrome_trace({}, {0: [{"op": 1, "kind": "step", "arrive_ns": 1000, "lift_ns": 5000,
                                  "last": False, "pushes": [[1, 5000, 9000]],
                                  "pull": [9000, 20000]}]})
    assert problems(good) == []
    bad = {"traceEvents": [
        {"ph": "X", "ts": 5, "pid": 1, "tid": 0, "name": "a", "dur": 1},
        {"ph": "X", "ts": 4, "pid": 1, "tid": 0, "name": "b", "dur": 1},   # back in time
        {"ph": "X", "ts": 6, "pid": 1, "tid": 1, "name": "c"},             # no duration
        {"ph": "B", "ts": 7, "pid": 1, "tid": 2, "name": "d"},             # never ended
        {"ph": "i", "ts": 8, "pid": 1, "name": "e"},                       # no tid
        {"ph": "s", "ts": 9, "pid": 1, "tid": 3, "name": "f", "id": 1}]}   # no finish
    found = problems(bad)
    assert len(found) == 5 and "back in time" in found[0] and "without a duration" in found[1]
    assert problems({}) == ["no traceEvents list"]
