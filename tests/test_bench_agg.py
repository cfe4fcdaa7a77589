# SPDX-License-Identifier: Apache-2.0
"""`ltp bench agg` end to end at a tiny size: its JSON's shape, positive
figures, the table, and bad flags as usage errors (speed is the benchmark's
to print, never a test's to assert)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

LTP = [sys.executable, "-m", "ltpx.tools.cli"]


@pytest.mark.unit
def test_bench_agg_prints_json_of_every_arm_and_size():
    p = subprocess.run(LTP + ["bench", "agg", "--params", "3000,70000", "--blocks", "2",
                              "--min-s", "0.001", "-j"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout)
    assert res["config"]["workers"] == 4 and res["config"]["params"] == [3000, 70000]
    assert [r["params"] for r in res["sizes"]] == [3000, 70000]
    for r in res["sizes"]:
        assert set(r["gbps"]) == {"memcpy_1", "memcpy_all", "add_1", "add_all", "add3_1",
                                  "add3_all", "old", "new_1", "new_all", "numpy_1",
                                  "numpy_all"}
        assert all(x > 0 for x in r["gbps"].values())
        assert all(len(b) == 2 and min(b) > 0 for b in r["block_gbps"].values())
        assert r["new_over_add"] > 0 and r["new_over_old"] > 0 and r["numpy_over_add"] > 0
    assert res["config"]["summing"]["kernel"] in ("c", "numpy")
    text = subprocess.run(LTP + ["bench", "agg", "--params", "3000", "--blocks", "1",
                                 "--min-s", "0.001"], capture_output=True, text=True, timeout=120)
    assert text.returncode == 0 and "new" in text.stdout and "old" in text.stdout
    for bad in (["--params", "x"], ["--workers", "0"], ["--blocks", "0"], ["--weights", "1,2"],
                ["--nope"]):
        p = subprocess.run(LTP + ["bench", "agg", *bad], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 2, (bad, p.stderr)
