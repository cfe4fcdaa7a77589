# SPDX-License-Identifier: Apache-2.0
"""`ltp train --tensorboard DIR --plot FILE`: the curves of real runs, read back.

The TensorBoard event files are read with tensorboard's own EventAccumulator,
and the plot is checked as a PNG matplotlib wrote (its size and header)."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import WHY_NOT_BPF

LTP = str(Path(sys.executable).parent / "ltp")


def _scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(logdir)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _png_size(path: str) -> tuple[int, int]:
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", head[:8]
    return struct.unpack(">II", head[16:24])


@pytest.mark.unit
@pytest.mark.parametrize("argv,needle", [
    (["--plot", "curves.txt"], "--plot"),
    (["--plot", "/no/such/dir/curves.png"], "--plot"),
    (["--tensorboard", "/no/such/dir/runs"], "--tensorboard"),
])
def test_bad_outputs_are_usage_errors_before_anything_runs(argv, needle, tmp_path):
    p = subprocess.run([LTP, "train", *argv, "-j"], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert needle in p.stdout + p.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.unit
def test_tensorboard_dir_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "runs"
    f.write_text("not a directory")
    p = subprocess.run([LTP, "train", "--tensorboard", str(f)], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "not a directory" in p.stderr
    assert f.read_text() == "not a directory"


@pytest.mark.rig
@pytest.mark.skipif(WHY_NOT_BPF is not None, reason=str(WHY_NOT_BPF))
def test_train_compare_writes_one_curve_per_run(tmp_path):
    plot, tb = tmp_path / "curves.png", tmp_path / "runs"
    p = subprocess.run([LTP, "train", "--workers", "2", "--iterations", "12", "--eval-every",
                        "4", "--hidden", "32", "--compare", "tcp", "--plot", str(plot),
                        "--tensorboard", str(tb), "-j"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["plot"] == str(plot) and out["tensorboard"] == str(tb)
    assert sorted(os.listdir(tb)) == ["ltp", "tcp-cubic"]
    for run in ("ltp", "tcp-cubic"):
        s = _scalars(str(tb / run))
        # an evaluation before training, then at iterations 4, 8 and 12 (every 4)
        assert [step for step, _ in s["test/accuracy"]] == [0, 4, 8, 12]
        assert all(0.0 <= v <= 1.0 for _, v in s["test/accuracy"])
        assert [step for step, _ in s["round/seconds"]] == list(range(1, 13))
        assert all(v > 0 for _, v in s["train/loss"])
    final = _scalars(str(tb / "ltp"))["test/accuracy"][-1][1]
    assert final == pytest.approx(out["final_accuracy"], abs=1e-6)
    w, h = _png_size(str(plot))
    assert w > 500 and h > 200
