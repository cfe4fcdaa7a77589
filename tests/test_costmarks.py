# SPDX-License-Identifier: Apache-2.0
"""The cost markers are enforced: a test with none is a collection error
that names it (tests/costmarks.py); rig implies root; as another user than
root, root tests skip saying so."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
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
    ran = "1 passed" if os.geteuid() == 0 else "1 skipped"      # root tests skip for others
    assert f"{ran}, 1 deselected" in p.stdout
    p = _pytest(tmp_path, body, "-m", "unit")
    assert "1 passed, 1 deselected" in p.stdout, p.stdout + p.stderr


def test_as_another_user_root_tests_skip_saying_so():
    """Run as nobody (or as this user when it is not root): the unit test
    passes, the root and rig tests skip with the reason."""
    body = ("import pytest\n\n\n@pytest.mark.unit\ndef test_u():\n    pass\n\n\n"
            "@pytest.mark.root\ndef test_r():\n    pass\n\n\n"
            "@pytest.mark.rig\ndef test_g():\n    pass\n")
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)
        Path(d, "test_sample.py").write_text(body)
        os.chmod(Path(d, "test_sample.py"), 0o644)
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "costmarks",
                            "-p", "no:cacheprovider", d], capture_output=True, text=True,
                           timeout=120, cwd=d, user="nobody" if os.geteuid() == 0 else None,
                           env={"PYTHONPATH": str(HERE), "PATH": "/usr/bin:/bin",
                                "PYTHONDONTWRITEBYTECODE": "1"})
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 passed, 2 skipped" in p.stdout
    assert p.stdout.count("needs root (marked root or rig)") == 2
