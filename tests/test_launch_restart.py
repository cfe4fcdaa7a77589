# SPDX-License-Identifier: Apache-2.0
"""`ltp launch --max-restarts N`: a worker that dies is started again and
rejoins the running job; past N (or with N = 0) the launch fails with the
dead rank's code; bad counts are usage errors.

Real rig (one 2-worker native-mode rig named lr<pid>, built once, removed
also on failure), real ranks of tests/launch_restart_job.py (a small MLP),
a real SIGKILL: worker 1 kills itself once at step 3 (a marker file in
tmp_path makes only its first process die).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import requires_bpf

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
RIG = f"lr{os.getpid() % 100000}"
JOB = str(ROOT / "tests" / "launch_restart_job.py")


@pytest.fixture(scope="module")
def rig():
    from ltpx.control.training.onrig import rig_config
    from ltpx.dataplane.rig.star import Rig
    with Rig(rig_config(RIG, "ltp", workers=2, rate_bps=10**9, buffer_bytes=30_000,
                        loss=0.0)) as r:
        yield r


def launch(*flags: str, cmd: tuple, timeout: float = 300) -> tuple[int, dict, str]:
    """`ltp launch -j` on the test rig: (exit code, JSON summary, stderr)."""
    out = subprocess.run([str(BIN / "ltp"), "launch", "--rig", RIG, "--workers", "2",
                          "--timeout", "240", *flags, "-j", "--", *cmd],
                         capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert out.stdout.strip(), out.stderr[-3000:]
    return out.returncode, json.loads(out.stdout), out.stderr


def by_label(summary: dict) -> dict:
    return {r["label"]: r for r in summary["ranks"]}


# ------------------------------------------------------------------ usage errors

@pytest.mark.unit
@pytest.mark.parametrize("value,says", [("-1", "--max-restarts: a count, at least 0"),
                                        ("two", "invalid int value"),
                                        ("1.5", "invalid int value")])
def test_a_bad_restart_count_is_a_usage_error(value, says):
    out = subprocess.run([str(BIN / "ltp"), "launch", "--max-restarts", value, "--", "python",
                          "x.py"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2, out.stderr
    assert "--max-restarts" in out.stderr and says in out.stderr, out.stderr


@pytest.mark.unit
def test_the_help_shows_an_example():
    out = subprocess.run([str(BIN / "ltp"), "launch", "--help"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0
    assert "--max-restarts 2 -- python docs/examples/digits_cnn.py" in out.stdout


# ------------------------------------------------------------------ on the rig

@requires_bpf
@pytest.mark.rig
def test_a_killed_worker_is_restarted_and_rejoins(rig, tmp_path):
    marker = tmp_path / "died"
    rc, s, err = launch("--max-restarts", "1", cmd=("python", JOB, str(marker), "3", "12", "1"))
    assert rc == 0 and s["exit_code"] == 0, err[-3000:]
    assert marker.exists()                                   # its first process did die
    assert "[launch] worker 1 exited -9 (killed); restarting (1 of 1)" in err
    assert s["max_restarts"] == 1 and s["restarts"] == {"2": 1} and s["job_restarts"] == 0
    by = by_label(s)
    assert by["w1"]["restarts"] == 1 and by["w0"]["restarts"] == 0 == by["s0"]["restarts"]
    w0, w1 = by["w0"]["last_json"], by["w1"]["last_json"]
    # the restarted process came back into the running job and finished it
    assert w1["rejoined"] and w1["finished"] and not w0["rejoined"] and w0["finished"]
    assert w0["admitted"] == [1] == w1["admitted"]
    assert w0["steps"] == w1["steps"] >= 12
    assert w0["digest"] == w1["digest"]                      # one replica again
    assert all(r["exit_code"] == 0 and not r["killed"] for r in s["ranks"])


@requires_bpf
@pytest.mark.rig
def test_without_restarts_a_killed_worker_fails_the_launch(rig, tmp_path):
    marker = tmp_path / "died"
    rc, s, err = launch("--grace", "1", cmd=("python", JOB, str(marker), "3", "12", "0"))
    assert rc == 137 and s["exit_code"] == 137, err[-3000:]     # 128 + SIGKILL
    assert s["exit_from"] == ["w1"]
    assert s["max_restarts"] == 0 and s["restarts"] == {} and s["job_restarts"] == 0
    w1 = by_label(s)["w1"]
    assert w1["exit_code"] == 137 and not w1["killed"] and w1["restarts"] == 0
    assert "restarting" not in err                           # nothing restarted
    assert "[launch] worker 1 exited -9 (killed); the others are stopped in 1 s" in err


@requires_bpf
@pytest.mark.rig
def test_past_its_restarts_a_failing_worker_fails_the_launch(rig, tmp_path):
    # worker 1 exits 3 at step 3, and each restarted process before it rejoins;
    # worker 0 would go on for thousands of steps: the launch stops it
    rc, s, err = launch("--max-restarts", "2", "--grace", "1",
                        cmd=("python", JOB, "always", "3", "4000", "0"))
    assert rc == 3 and s["exit_code"] == 3 and s["exit_from"] == ["w1"], err[-3000:]
    assert s["restarts"] == {"2": 2} and s["job_restarts"] == 0
    assert "[launch] worker 1 exited 3; restarting (1 of 2)" in err
    assert "[launch] worker 1 exited 3; restarting (2 of 2)" in err
    assert "[launch] worker 1 exited 3; not restarting (all 2 restarts used)" in err
    by = by_label(s)
    assert by["w1"]["exit_code"] == 3 and by["w1"]["restarts"] == 2
    assert by["w0"]["killed"] and by["s0"]["killed"]              # stopped after --grace


@requires_bpf
@pytest.mark.rig
def test_a_dead_server_restarts_every_rank(rig, tmp_path):
    # the server rank SIGKILLs itself once, before lt.init(): the workers wait
    # for it; the launcher stops them and starts the whole job again
    marker = tmp_path / "died"
    rc, s, err = launch("--max-restarts", "1",
                        cmd=("python", JOB, str(marker), "3", "12", "0", "s0"))
    assert rc == 0 and s["exit_code"] == 0, err[-3000:]
    assert marker.exists()
    assert "[launch] server 0 exited -9 (killed); restarting every rank (1 of 1)" in err
    assert s["job_restarts"] == 1 and s["restarts"] == {}
    by = by_label(s)
    w0, w1 = by["w0"]["last_json"], by["w1"]["last_json"]     # the second job's ranks
    assert w0["finished"] and w1["finished"] and w0["steps"] == w1["steps"] == 12
    assert w0["digest"] == w1["digest"] and not (w0["rejoined"] or w1["rejoined"])


@pytest.fixture(scope="module")
def sharded_rig():
    from ltpx.control.training.onrig import rig_config
    from ltpx.dataplane.rig.star import Rig
    with Rig(rig_config(f"{RIG}s", "ltp", workers=2, rate_bps=10**9, buffer_bytes=30_000,
                        loss=0.0, servers=2)) as r:
        yield r


@requires_bpf
@pytest.mark.rig
def test_in_a_sharded_job_a_dead_worker_restarts_every_rank(sharded_rig, tmp_path):
    # a worker cannot rejoin a sharded job: the launcher starts every rank again
    marker = tmp_path / "died"
    out = subprocess.run([str(BIN / "ltp"), "launch", "--rig", sharded_rig.name, "--workers",
                          "2", "--servers", "2", "--timeout", "240", "--max-restarts", "1",
                          "-j", "--", "python", JOB, str(marker), "3", "12", "0"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    s, err = json.loads(out.stdout), out.stderr
    assert out.returncode == 0 and s["exit_code"] == 0, err[-3000:]
    assert "[launch] worker 1 exited -9 (killed); restarting every rank (1 of 1)" in err
    assert s["job_restarts"] == 1 and s["restarts"] == {}
    by = by_label(s)
    assert [r["label"] for r in s["ranks"]] == ["s0", "s1", "w0", "w1"]
    w0, w1 = by["w0"]["last_json"], by["w1"]["last_json"]
    assert w0["finished"] and w1["finished"] and w0["steps"] == w1["steps"] == 12
    assert w0["digest"] == w1["digest"]
