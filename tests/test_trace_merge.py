# SPDX-License-Identifier: Apache-2.0
"""Traces merged (issue 28, docs/slow-or-stuck.md): `ltp launch --trace FILE`
merges every rank's view into one well-formed trace-event file, and `ltp
trace merge` puts a torch.profiler trace beside an LTP trace on one clock
(the merged file passes `ltp trace check`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import requires_bpf

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent


def _ltp(*args, timeout=60):
    return subprocess.run([str(BIN / "ltp"), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def _profile(path: Path) -> tuple[int, int]:
    """A torch.profiler trace made here; CLOCK_MONOTONIC ns around it."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as p:
        t0 = time.perf_counter_ns()
        x = torch.randn(64, 64)
        for _ in range(5):
            x = torch.tanh(x @ x)
        t1 = time.perf_counter_ns()
    p.export_chrome_trace(str(path))
    return t0, t1


def _ltp_trace(path: Path) -> dict:
    from ltpx.control.torchapi.trace import chrome_trace, write
    now = time.perf_counter_ns()
    t = chrome_trace({0: [{"answer": 1, "t0_ns": now, "t1_ns": now + 1000}]},
                     {0: [{"op": 1, "kind": "step", "arrive_ns": now, "lift_ns": now + 500,
                           "last": True, "pushes": [[3, now + 600, now + 900]],
                           "pull": [now + 950, now + 1200]}]})
    write(str(path), t)
    return t


@pytest.mark.slow
def test_merge_puts_a_torch_profiler_trace_on_the_ltp_clock(tmp_path):
    a, b, out = tmp_path / "ltp.json", tmp_path / "torch.json", tmp_path / "both.json"
    _ltp_trace(a)
    t0, t1 = _profile(b)
    r = _ltp("trace", "merge", str(a), str(b), "-o", str(out), "-j")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["how"].startswith("wall clock")
    with open(out) as f:
        m = json.load(f)
    # torch's own ops, moved onto CLOCK_MONOTONIC: inside the span this process
    # measured around them (a 20 ms allowance for the two clocks' reading)
    with open(b) as f:
        names = {e["name"] for e in json.load(f)["traceEvents"] if e.get("ph") == "X"}
    mm = [e for e in m["traceEvents"] if e.get("ph") == "X" and e["name"] in names
          and e["name"].startswith("aten::tanh")]
    assert mm, names
    for e in mm:
        assert t0 / 1e3 - 20_000 <= e["ts"] <= t1 / 1e3 + 20_000, (e, t0, t1)
    # the LTP events are there, unmoved, and the file is well-formed
    assert {e["pid"] for e in m["traceEvents"]} >= {1, 1001}
    c = _ltp("trace", "check", str(out), "-j")
    assert c.returncode == 0 and json.loads(c.stdout)["ok"], c.stdout
    # an offset given is used as given; a bad one is a usage error
    r = _ltp("trace", "merge", str(a), str(b), "-o", str(out), "--offset-us", "12.5", "-j")
    assert json.loads(r.stdout)["offset_us"] == 12.5
    assert _ltp("trace", "merge", str(a), str(b), "-o", str(out), "--offset-us",
                "nan").returncode == 2
    assert _ltp("trace", "merge", str(a), str(tmp_path / "none.json"), "-o",
                str(out)).returncode == 2


@pytest.mark.rig
@requires_bpf
def test_launch_trace_merges_every_ranks_view(tmp_path):
    from ltpx.control.torchapi.trace import SERVER_PID, WORKER_PID, problems
    out = tmp_path / "job.json"
    r = subprocess.run([str(BIN / "ltp"), "launch", "--workers", "2", "--trace", str(out), "-j",
                        "--", "python", "docs/examples/digits_cnn.py", "--epochs", "1"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(r.stdout)
    assert s["trace"]["file"] == str(out) and s["trace"]["rank_files"] == 3, s["trace"]
    with open(out) as f:
        t = json.load(f)
    assert problems(t) == []
    ev = t["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in ev if e.get("name") == "process_name"}
    assert names == {(SERVER_PID, "server 0"), (WORKER_PID, "worker 0"),
                     (WORKER_PID + 1, "worker 1")}
    # the workers' pushes link to their chunks at the server's NIC
    assert sum(e["ph"] == "s" for e in ev) > 10
    assert sum(e.get("cat") == "round" for e in ev) > 10
    assert not [n for n in os.listdir(tmp_path) if n != "job.json"]


@pytest.mark.slow
def test_plot_draws_every_slice_and_instant_of_a_trace_on_its_track(tmp_path):
    # A trace as a job writes it (chrome_trace of recorded rounds and ops):
    # `ltp trace plot` draws a PNG with one row per track that has events,
    # every complete slice as a bar and every instant as a tick; a window
    # with nothing in it, a reversed or malformed window and a picture that
    # is not a PNG are usage errors that write nothing.
    src, png = tmp_path / "t.json", tmp_path / "t.png"
    t = _ltp_trace(src)
    shown = [e for e in t["traceEvents"] if e.get("ph") in ("X", "i")]
    r = _ltp("trace", "plot", str(src), "-o", str(png), "-j")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert rep["tracks"] == len({(e["pid"], e["tid"]) for e in shown}) >= 2
    assert rep["slices"] == sum(e["ph"] == "X" for e in shown) > 0
    assert rep["instants"] == sum(e["ph"] == "i" for e in shown)
    for args in (["--window", "5:"], ["--window", "2:1"], ["--window", "x"]):
        bad = tmp_path / "bad.png"
        r = _ltp("trace", "plot", str(src), "-o", str(bad), *args)
        assert r.returncode == 2 and "window" in r.stderr and not bad.exists(), (args, r.stderr)
    r = _ltp("trace", "plot", str(src), "-o", str(tmp_path / "t.txt"))
    assert r.returncode == 2 and "PNG" in r.stderr
