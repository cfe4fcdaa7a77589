# SPDX-License-Identifier: Apache-2.0
"""Straggler attribution in a real `ltp train` run on the rig (issue 28): a
worker slowed a lot is named in nearly every step, one slowed a little in
every step after the steady rule's first window (issue 43); with none
slowed no worker is named in more than 40 % of the steps (nor is a last
arriver whose own time was the others'); the lead's
evaluations name no one; the run's --trace file is a well-formed
trace-event file whose summary names the same workers."""
from __future__ import annotations

import json

import pytest

from conftest import requires_bpf
from ltpx.control.training.config import TrainConfig

pytestmark = [pytest.mark.rig, requires_bpf]
WORKERS, STEPS = 4, 20


@pytest.fixture(scope="module")
def rig():
    from ltpx.control.training.onrig import rig_config
    from ltpx.dataplane.rig.star import Rig
    with Rig(rig_config("tsg", "ltp", workers=WORKERS, rate_bps=10**9, buffer_bytes=30_000,
                        loss=0.0)) as r:
        yield r


def _train(rig, **kw):
    from ltpx.control.training.onrig import train_on_rig
    kw.setdefault("iterations", STEPS)
    return train_on_rig(rig, TrainConfig(seed=3, **kw), timeout_s=300)


@pytest.fixture(scope="module")
def slowed(rig, tmp_path_factory):
    # x100 its compute (~1.5 ms a step here), before its gradients are ready:
    # it reaches every barrier late. (Worker 0 evaluates before step 1 and
    # after each epoch: those steps are set aside.)
    path = str(tmp_path_factory.mktemp("trace") / "job.json")
    return _train(rig, straggler={2: 100.0}, trace=path, iterations=30), path


def test_a_slowed_worker_is_named_straggler_in_nearly_every_step(slowed):
    r, _ = slowed
    named, n = r["straggler_rounds"], r["rounds_attributed"]
    assert n >= 25, r
    assert named.get("2", 0) >= 0.95 * n, r
    assert set(r["lateness_ms"]) == {"0", "1", "2", "3"}
    assert r["steps_aside"] >= 1 and "0" not in named, r     # its evaluations


def test_a_worker_a_little_slow_every_step_is_named_after_the_first_window(rig):
    # x3 its compute: ~3 ms a step, under the barrier's 5 ms margin, inside
    # one step's scheduling noise on this host
    r = _train(rig, straggler={2: 3.0}, iterations=60)
    after = r["after_window"]
    assert after["steps"] >= 25, r
    assert after["named"].get("2", 0) >= 0.9 * after["steps"], r
    assert r["named_by"]["steady"].get("2", 0) >= 0.8 * after["steps"], r
    assert 1.0 < r["steady_lag_ms"]["2"] < 20.0, r


def test_the_runs_trace_is_a_well_formed_trace_event_file_that_says_the_same(slowed, capsys):
    from ltpx.control.torchapi.trace import SERVER_PID, WORKER_PID, problems
    from ltpx.tools.cli import main
    r, path = slowed
    assert r["trace"] == path
    with open(path) as f:
        t = json.load(f)
    assert problems(t) == []      # keys, X durations, per-track order, B/E, flow pairs
    ev = t["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in ev if e["name"] == "process_name"}
    assert names == {(SERVER_PID, "server 0"), *((WORKER_PID + w, f"worker {w}")
                                                 for w in range(WORKERS))}
    rounds = [e for e in ev if e.get("cat") == "round"]
    assert len(rounds) == 31 and all(e["ph"] == "X" for e in rounds)   # 30 steps, 1 broadcast
    # first and last arrival instants on each worker's NIC track, and a flow
    # from every worker's push to its chunks there
    nic = {e["tid"] for e in ev if e["ph"] == "i" and e["pid"] == SERVER_PID}
    assert len(nic) == WORKERS
    assert {e["pid"] for e in ev if e["ph"] == "s"} == {WORKER_PID + w for w in range(WORKERS)}
    assert main(["trace", "summary", path, "-j"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["straggler_rounds"] == r["straggler_rounds"] and len(s["steps"]) == 30


def test_without_a_straggler_no_worker_is_named_in_most_steps(rig):
    # 40 steps: on 2 busy cores the NIC still names a worker late past the
    # margin in many steps, spread over the 4 by chance; 40 keeps one
    # worker's share of that chance well under 40 %
    r = _train(rig, iterations=2 * STEPS)
    named = r["straggler_rounds"]
    assert all(v <= 0.4 * 2 * STEPS for v in named.values()), r
    assert r["rounds_attributed"] == sum(named.values())
    assert sum(r["attributed_by"].values()) == r["rounds_attributed"]
