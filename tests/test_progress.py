# SPDX-License-Identifier: Apache-2.0
"""Progress off a terminal (issue 25, item 7): `lt.report_progress` and
`ltp launch`'s output print plain, throttled lines instead of a raw JSON
line per call; under `ltp launch` the rank still speaks JSON to it."""
from __future__ import annotations

import json

import pytest

from ltpx.control import progress
from ltpx.control.launcher.launch import Rank
from ltpx.tools.cmd_launch import Output

pytestmark = pytest.mark.unit


def test_throttle_lets_the_first_the_last_and_one_per_period_through():
    now = [0.0]
    t = progress.Throttle(2.0, clock=lambda: now[0])
    seen = []
    for step in range(1, 101):          # 100 steps, 0.1 s apart: 10 s in all
        if t.due(step, 100):
            seen.append(step)
        now[0] += 0.1
    assert seen[0] == 1 and seen[-1] == 100
    assert 5 <= len(seen) <= 7          # one per 2 s of 10 s, the first and the last


def test_report_prints_json_for_the_launcher_and_plain_lines_otherwise(monkeypatch, capsys):
    monkeypatch.setenv(progress.ENV, "json")
    for step in range(1, 4):
        progress.report(step, 3, {"loss": 0.5})
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(ln)["step"] for ln in lines] == [1, 2, 3]

    monkeypatch.delenv(progress.ENV)
    monkeypatch.setattr(progress, "_throttle", progress.Throttle())
    for step in range(1, 201):
        progress.report(step, 200, {"loss": 1.0 / step, "epoch": 2})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "step 1/200  loss 1  epoch 2"
    assert lines[-1] == "step 200/200  loss 0.005  epoch 2"
    assert len(lines) == 2 and not any(ln.startswith("{") for ln in lines)


def test_launch_output_turns_progress_events_into_plain_lines_off_a_terminal(capsys):
    out = Output(json_mode=False)           # pytest's stderr is no terminal: no bar
    w0 = Rank(rank=1, role="worker", index=0, host=None)   # a launcher's rank, no process
    for step in range(1, 51):
        out.line(w0, "stdout", json.dumps({"event": "progress", "step": step, "steps": 50,
                                           "loss": 0.25}))
    out.line(w0, "stdout", "epoch done")
    got = capsys.readouterr().out.splitlines()
    assert got == ["[w0] step 1/50  loss 0.25", "[w0] step 50/50  loss 0.25",
                   "[w0] epoch done"]


def test_launch_output_under_json_keeps_the_events(capsys):
    out = Output(json_mode=True)
    w0 = Rank(rank=1, role="worker", index=0, host=None)   # a launcher's rank, no process
    for step in (1, 2):
        out.line(w0, "stdout", json.dumps({"event": "progress", "step": step, "steps": 2}))
    err = capsys.readouterr().err.splitlines()
    assert [json.loads(ln.split(" ", 1)[1])["step"] for ln in err] == [1, 2]
