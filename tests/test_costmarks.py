# SPDX-License-Identifier: Apache-2.0
"""The cost markers are enforced: a test with none is a collection error
that names it (tests/costmarks.py); rig implies root."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

HERE = Path(__file__).resolve().parent


def _pytest(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_sample.py").write_text("import pytest\n\n" + body)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "costmarks",
                           "-p", "no:cacheprovider", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={"PYTHONPATH": str(HERE), "PATH": "/usr/bin:/bin"})


def test_a_test_without_a_cost_marker_is_a_collection_error(tmp_path):
    p = _pytest(tmp_path, "def test_bare():\n    pass\n\n\n"
                          "@pytest.mark.unit\ndef test_marked():\n    pass\n")
    assert p.returncode != 0
    out = p.stdout + p.stderr
    assert "tests without a cost marker" in out and "test_sample.py::test_bare" in out
    assert "test_marked" not in out.split("tests without a cost marker")[1]


def test_marked_tests_run_and_rig_counts_as_root(tmp_path):
    body = ("@pytest.mark.unit\ndef test_u():\n    pass\n\n\n"
            "@pytest.mark.rig\ndef test_r():\n    pass\n")
    p = _pytest(tmp_path, body, "-m", "root")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 passed, 1 deselected" in p.stdout
    p = _pytest(tmp_path, body, "-m", "unit")
    assert "1 passed, 1 deselected" in p.stdout, p.stdout + p.stderr
