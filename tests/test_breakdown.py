# SPDX-License-Identifier: Apache-2.0
"""Where a training step's time goes (control/torchapi/breakdown.py), the host's
floors beside it (control/bench/floors.py), and `ltp train`'s breakdown on a rig."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from conftest import requires_bpf
from ltpx.control.bench import floors
from ltpx.control.torchapi import breakdown
from ltpx.control.torchapi.breakdown import SERVER, WORKER_COMM, WORKER_STEP, Phases
from ltpx.tools import train_text


# --------------------------------------------------------------------------- units

@pytest.mark.unit
def test_a_steps_other_is_its_wall_time_less_its_parts_and_overlap_is_apart():
    p = Phases(("a", "b"), ("side",))
    p.add("a", 0.25)
    p.add("b", 0.5)
    p.add("side", 5.0)          # overlapped: never taken from the wall time
    row = p.end_step(wall=1.0)
    assert row == {"a": 0.25, "b": 0.5, "side": 5.0, "wall": 1.0, "other": 0.25}
    p.add("a", 2.0)             # parts over the wall (clocks disagree): other is 0, not < 0
    assert p.end_step(wall=1.0)["other"] == 0.0
    s = p.summary()
    assert s["steps"] == 2 and s["total"] == {"a": 2.25, "b": 0.5, "other": 0.25, "wall": 2.0,
                                              "side": 5.0}
    assert s["median"]["a"] == pytest.approx(1.125) and s["median"]["side"] == 2.5


@pytest.mark.unit
def test_medians_come_from_the_latest_steps_and_totals_from_all():
    p = Phases(("a",), ring=4)
    for v in (100.0, 1.0, 2.0, 3.0, 4.0):     # the first step has left the ring
        p.add("a", v)
        p.end_step(wall=v)
    s = p.summary()
    assert s["steps"] == 5 and s["median"]["a"] == 2.5 and s["total"]["a"] == 110.0


@pytest.mark.unit
def test_a_steps_wall_time_runs_from_its_start_or_the_last_end():
    p = Phases(("a",))
    p.end_step()
    p.start_step()
    time.sleep(0.02)
    p.start_step()              # a second start (wbsp's local steps) does not move it
    time.sleep(0.02)
    assert p.end_step()["wall"] >= 0.04
    time.sleep(0.02)            # no start_step: from the last end_step
    assert p.end_step()["wall"] >= 0.02
    p.add("a", 9.0)
    p.discard()                 # an op that is no step leaves nothing behind
    assert p.end_step()["a"] == 0.0 and p.steps == 4


@pytest.mark.unit
def test_a_ddp_wait_is_split_into_answer_copy_back_and_the_pushes_rest():
    assert breakdown.ddp_wait(0.1, 0.03, 0.02) == pytest.approx(
        {"pull": 0.03, "copy_back": 0.02, "push": 0.05})
    # the communication thread's pulls of earlier ops (a step op per bucket)
    # exceed the wait: the split never exceeds it, nor goes below 0
    assert breakdown.ddp_wait(0.1, 0.5, 0.2) == {"pull": 0.1, "copy_back": 0.0, "push": 0.0}
    assert breakdown.ddp_wait(-1.0, 0.1, 0.1) == {"pull": 0.0, "copy_back": 0.0, "push": 0.0}


def _worker(scale: float) -> dict:
    p = Phases(WORKER_STEP, tuple(f"comm_{n}" for n in WORKER_COMM))
    for n in WORKER_STEP:
        p.add(n, 0.01 * scale)
    p.add("comm_push", 0.2 * scale)
    p.end_step(wall=0.1 * scale)
    breakdown._worker, saved = p, breakdown._worker
    try:
        return breakdown.worker_summary()
    finally:
        breakdown._worker = saved


@pytest.mark.unit
def test_a_runs_breakdown_is_the_median_worker_and_the_slowest_server():
    ws = {0: _worker(1.0), 1: _worker(2.0), 2: _worker(3.0), 3: None}
    assert set(ws[0]) == {"steps", "median", "total", "comm"}
    assert set(ws[0]["comm"]["median"]) == set(WORKER_COMM)
    srv = []
    for v in (0.1, 0.3):
        p = Phases(SERVER, ("sign",))
        p.add("gather", v)
        p.end_step(wall=1.0)
        srv.append(p.summary())
    b = breakdown.combine(ws, srv + [None], step_s=0.2)
    assert b["step_s"] == 0.2 and b["worker"]["median"]["compute"] == pytest.approx(0.02)
    assert b["comm"]["median"]["push"] == pytest.approx(0.4)
    assert b["server"]["median"]["gather"] == 0.3 and len(b["per_server"]) == 2
    assert sorted(b["per_worker"]) == ["0", "1", "2"]
    assert breakdown.combine({0: None}, [None], 1.0) is None


@pytest.mark.unit
def test_floors_per_step_and_a_breakdown_against_them():
    fl = {"memcpy_1": 4.0, "memcpy_all": 8.0, "add_1": 10.0, "add_all": 20.0,
          "tcp_loopback_gbps": 2.0, "line_bps": 1e9}
    step = floors.per_step(fl, params=1_000_000, workers=4)
    assert step["wire_s"] == pytest.approx(16e6 * 8 / 1e9)      # 4 gradients of 4 MB in
    assert step["aggregate_s"] == pytest.approx(16e6 / 20e9)
    assert step["copy_s"] == pytest.approx(4e6 / 4e9)
    assert step["loopback_s"] == pytest.approx(16e6 / 2e9)
    assert floors.per_step(fl, 1_000_000, 4, servers=2)["wire_s"] == pytest.approx(
        step["wire_s"] / 2)
    bd = {"step_s": 0.256, "worker": {"median": {"staging": 0.002, "copy_back": 0.0,
                                                 "wall": 0.128}},
          "server": {"median": {"aggregate": 0.0016}}}
    v = floors.against(bd, step)
    assert v["step_over_wire"] == 2.0 and v["wall_over_wire"] == 1.0
    assert v["aggregate_over_floor"] == 2.0
    assert v["staging_over_copy"] == 2.0 and v["copy_back_over_copy"] == 0.0


@pytest.mark.unit
def test_the_loopback_floor_moves_bytes():
    r = floors.tcp_loopback(0.2)
    assert r["tcp_bytes"] > 0 and r["tcp_loopback_gbps"] > 0


@pytest.mark.unit
def test_the_breakdown_block_names_every_phase_in_80_columns():
    b = breakdown.combine({0: _worker(1.0)}, [], step_s=0.1)
    runs = [{"breakdown": b, "wall_s": 3.0, "iterations": 30},
            {"breakdown": None, "wall_s": 1.0, "iterations": 30}]
    lines = train_text.breakdown_lines(["ddp-ltp x2 socket-sender", "gloo"], runs)
    assert max(map(len, lines)) <= 80
    text = "\n".join(lines)
    for name in ("compute", "staging", "push", "pull", "copy back", "optimizer", "gather",
                 "aggregate", "send", "idle"):
        assert name in text
    assert train_text.breakdown_lines(["gloo"], runs[1:]) == []


# --------------------------------------------------------------------------- on the rig

@pytest.fixture(scope="module")
def rig():
    """A 2-worker native-mode rig of this module's own (name tbk), for its scope."""
    from ltpx.control.training.onrig import rig_config
    from ltpx.dataplane.rig.star import Rig
    with Rig(rig_config("tbk", "ltp", workers=2, rate_bps=10**9, buffer_bytes=30_000,
                        loss=0.0)) as r:
        yield r


def _phases_fit(b: dict, steps: int) -> None:
    """Every phase present and >= 0; a worker's step-thread phases add up to
    no more than its wall time (other: the rest)."""
    assert b["unit"] == "seconds per step" and b["step_s"] > 0
    for w, pw in b["per_worker"].items():
        assert pw["steps"] == steps, (w, pw["steps"])
        for kind in ("median", "total"):
            m = pw[kind]
            assert set(m) == {*WORKER_STEP, "other", "wall"}
            assert set(pw["comm"][kind]) == set(WORKER_COMM)
            assert min(m.values()) >= 0 and min(pw["comm"][kind].values()) >= 0
        t = pw["total"]
        assert sum(t[p] for p in WORKER_STEP) <= 1.05 * t["wall"] + 1e-3, (w, t)
        assert sum(t[p] for p in (*WORKER_STEP, "other")) == pytest.approx(t["wall"], rel=0.05)
    for s in b["per_server"]:
        assert set(s["median"]) == {*SERVER, "other", "wall", "sign"}
        assert min(s["total"].values()) >= 0
        assert sum(s["total"][p] for p in SERVER) <= 1.05 * s["total"]["wall"] + 1e-3


@pytest.mark.rig
@requires_bpf
def test_ltp_train_reports_where_a_step_goes_and_the_floors(rig):
    """`ltp train -j --floors` over ltpx.torch and over DDP on the `ltp`
    backend: a breakdown per run, its shape (not its speed), and the floors."""
    steps = 4
    p = subprocess.run([sys.executable, "-m", "ltpx.tools.cli", "train", "--workers", "2",
                        "--iterations", str(steps), "--hidden", "64,32", "--name", rig.name,
                        "--compare", "ddp-ltp", "--floors", "-j"],
                       capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    runs = [out, *out["compare"]]
    assert [r["transport"] for r in runs] == ["ltp", "ddp-ltp"]
    for r in runs:
        _phases_fit(r["breakdown"], steps)
        assert r["replicas_identical"]
        f = r["floors"]
        assert f["add_all"] > 0 and f["memcpy_1"] > 0 and f["tcp_loopback_gbps"] > 0
        assert f["line_bps"] == 1e9
        v = r["breakdown"]["vs_floors"]
        assert v["floors_s"]["wire_s"] > 0 and v["step_over_wire"] > 0
    args = SimpleNamespace(seed=0, target_accuracy=None, sync="bsp", plot=None, tensorboard=None)
    text = train_text.text(runs, args, 0.0, 10**9, 30_000)
    assert "where a step goes" in text and "floors: memcpy" in text
    assert max(len(line) for line in text.splitlines()) <= 80
