"""`ltp bench incast` end to end on a small configuration (numbers are not
asserted against goals: speed belongs to the benchmark, not the tests)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import requires_bpf

LTP = [sys.executable, "-m", "ltpx.tools.cli"]


@requires_bpf
def test_small_incast_bench_gives_documented_json_and_a_plot(tmp_path):
    png = tmp_path / "incast.png"
    out = subprocess.run(LTP + ["bench", "incast", "--workers", "2", "--rounds", "3",
                                "--size", "64KiB", "-j", "--plot", str(png)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout)
    assert set(res) >= {"config", "limit_s", "results", "speedup"}
    assert res["limit_s"] == pytest.approx(2 * 65536 * 8 / 1e9)
    assert set(res["results"]) == {"ltp", "tcp-cubic", "tcp-bbr"}
    for name, r in res["results"].items():
        assert {"median_s", "p99_s", "max_s", "median_over_limit", "p99_over_limit",
                "delivered"} <= set(r)
        assert 0.0 <= r["delivered"] <= 1.0
        assert 0 < r["median_s"] <= r["p99_s"] <= r["max_s"]
        assert r["median_over_limit"] == pytest.approx(r["median_s"] / res["limit_s"])
    assert set(res["speedup"]) == {"tcp-cubic", "tcp-bbr"}
    import matplotlib.image as mpimg
    img = mpimg.imread(png)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def test_bad_flags_are_usage_errors():
    for argv, word in ((["--transports", "ltp,quic"], "--transports"),
                       (["--size", "10"], "--size"), (["--loss", "1.5"], "--loss"),
                       (["--sweep-workers", "4,x"], "--sweep-workers"),
                       (["--rate", "fast"], "--rate")):
        out = subprocess.run(LTP + ["bench", "incast", *argv], capture_output=True, text=True)
        assert out.returncode == 2, (argv, out.stderr)
        assert word in out.stderr
