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
    assert out["rounds_attributed"] == 4
    assert out["attributed_by"] == {"steady": 0, "barrier": 2, "nic": 2}
    assert out["named_by"]["barrier"] == {"2": 2} and out["named_by"]["nic"] == {"1": 2}
    # where the NIC's named worker's lateness is known, it too must pass the
    # margin: 1 ms at step 3 does not, 20 ms at step 4 does
    out = attribute_steps(notes, {3: 1, 4: 1}, steps=5, step_s=0.02, nic_late={3: 0.001, 4: 0.02})
    assert out["named_by"]["nic"] == {"1": 1} and out["rounds_attributed"] == 3
    # a long step widens the margin: 10 % of 0.5 s is 50 ms, more than the waits
    assert attribute_steps(notes, {}, steps=5, step_s=0.5)["rounds_attributed"] == 0


def test_a_last_arriver_whose_own_time_was_the_others_is_not_named_by_the_barrier():
    from ltpx.control.training.straggler_report import attribute_steps
    # the others waited 30 ms for worker 1 at step 5 and for worker 2 at
    # step 6; worker 1's own time was the others' (its answer came late),
    # worker 2's 25 ms above theirs (its compute held them)
    notes = _own_notes(10, {})
    notes[1]["last"], notes[2]["last"] = [5], [6]
    for w in (0, 3):
        notes[w]["waited_ms"] = {"5": 30.0, "6": 30.0}
    notes[2]["own_ms"]["6"] += 25.0
    out = attribute_steps(notes, {}, steps=10, step_s=0.05)
    assert out["named_by"]["barrier"] == {"2": 1} and out["rounds_attributed"] == 1
    # 10 ms above theirs explains under half of a 30 ms wait: named by nothing
    notes[2]["own_ms"]["6"] -= 15.0
    assert attribute_steps(notes, {}, steps=10, step_s=0.05)["rounds_attributed"] == 0


def _own_notes(steps: int, lag_ms: dict[int, float], workers: int = 4, seed: int = 0,
               aside=()) -> dict[int, dict]:
    """Barrier notes with own times: 3 ms and up to 3 ms of noise a step
    (exponential, as a busy host's), plus each worker's steady lag."""
    rng = np.random.default_rng(seed)
    return {w: {"last": [], "waited_ms": {},
                "own_ms": {str(s): 3.0 + float(rng.exponential(0.6)) + lag_ms.get(w, 0.0)
                           for s in range(1, steps + 1)},
                "aside": list(aside) if w == 0 else []}
            for w in range(workers)}


def test_a_worker_a_little_slow_every_step_is_named_from_its_first_whole_window():
    from ltpx.control.training.straggler_report import STEADY_WINDOW, attribute_steps
    # 2.5 ms a step, under the barrier's 5 ms margin and inside one step's noise
    out = attribute_steps(_own_notes(60, {2: 2.5}), {}, steps=60, step_s=0.1)
    assert out["after_window"] == {"steps": 60 - STEADY_WINDOW + 1,
                                   "named": {"2": 60 - STEADY_WINDOW + 1}}
    assert out["named_by"]["steady"] == {"2": 41} and out["attributed_by"]["barrier"] == 0
    assert out["steady_lag_ms"]["2"] == pytest.approx(2.5, abs=0.5)
    # the steady rule goes before the barrier's: a step whose last arriver
    # was another (scheduling noise past the margin) still names worker 2
    notes = _own_notes(60, {2: 2.5})
    notes[1]["last"] = [50]
    notes[0]["waited_ms"]["50"] = notes[3]["waited_ms"]["50"] = 30.0
    assert attribute_steps(notes, {}, steps=60, step_s=0.1)["named_by"]["barrier"] == {}


def test_noise_alone_or_a_lag_under_the_floor_names_no_one():
    from ltpx.control.training.straggler_report import attribute_steps
    for seed in range(5):
        out = attribute_steps(_own_notes(100, {}, workers=8, seed=seed), {}, 100, 0.1)
        assert out["attributed_by"]["steady"] == 0, (seed, out)
    # 0.8 ms steady is under 1 % of a 100 ms step: no straggler's; of a 50 ms one it is
    notes = _own_notes(60, {1: 0.8}, seed=1)
    assert attribute_steps(notes, {}, 60, 0.1)["attributed_by"]["steady"] == 0
    named = attribute_steps(notes, {}, 60, 0.05)["named_by"]["steady"]
    assert set(named) == {"1"} and named["1"] >= 36      # of 41 windows: noise may hide it


def test_a_step_after_the_leads_evaluation_names_no_one():
    from ltpx.control.training.straggler_report import attribute_steps
    # the lead evaluated before steps 1 and 30: it was last at both barriers,
    # the others waited 40 ms for it there
    notes = _own_notes(40, {}, aside=[1, 30])
    notes[0]["last"] = [1, 30]
    notes[0]["own_ms"].update({"1": 43.0, "30": 43.0})   # its evaluation's time
    for w in (1, 2, 3):
        notes[w]["waited_ms"] = {"1": 40.0, "30": 40.0}
    out = attribute_steps(notes, {30: 0}, steps=40, step_s=0.1)
    assert out["rounds_attributed"] == 0 and out["steps_aside"] == 2
    del notes[0]["aside"]       # without the mark both name the lead
    assert attribute_steps(notes, {30: 0}, steps=40, step_s=0.1)["straggler_rounds"] == {"0": 2}


def test_a_straggler_sleeps_before_its_gradients_are_ready():
    import time

    import torch

    from ltpx.control.training.data import BatchStream, split
    from ltpx.control.training.local import Stepper
    from ltpx.control.training.model import build_mlp
    data = split(0)
    module = build_mlp((64,), 0)
    stream = BatchStream(data, 0, 1, 32, 0)
    seen = []
    for p in module.parameters():
        p.register_post_accumulate_grad_hook(lambda _p: seen.append(time.monotonic()))
    st = Stepper(module, factor=40.0)
    for _ in range(3):
        seen.clear()
        t0, before = time.monotonic(), st.straggle_s
        st.step(stream)
        slept = st.straggle_s - before
        assert slept > 0 and min(seen) - t0 >= slept   # every gradient after the sleep
    module.zero_grad()
    assert torch.is_grad_enabled()


def test_the_run_queue_counts_a_threads_waits_for_a_busy_core():
    import os
    import subprocess
    import sys
    import time

    from ltpx.control.torchapi.runqueue import RunQueue
    cpu = min(os.sched_getaffinity(0))
    keep = os.sched_getaffinity(0)
    spin = "import os,time; os.sched_setaffinity(0,{%d}); t=time.time()\nwhile time.time()-t<3: pass" % cpu
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    try:
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.3)             # the hogs are spinning on the core
        rq = RunQueue()
        w0, t0 = rq.waited_ns(), time.monotonic()
        while time.monotonic() - t0 < 0.6:
            pass
        waited = (rq.waited_ns() - w0) / 1e9
    finally:
        os.sched_setaffinity(0, keep)
        for h in hogs:
            h.kill()
            h.wait()
    # three runnable threads on one core: this one waits about 2/3 of the time
    assert waited > 0.2, waited
    assert RunQueue().waited_ns() >= 0


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
