# SPDX-License-Identifier: Apache-2.0
"""`ltp doctor`'s optional checks (dataplane/doctor/checks.py): a missing
optional piece is a warning, not a reason to call the machine not ready."""
from __future__ import annotations

import subprocess

import pytest

from conftest import requires_bpf


@pytest.mark.root
@requires_bpf
def test_an_ack_clock_check_that_fails_warns_and_keeps_the_doctor_ready():
    import os
    from ltpx.dataplane.doctor.checks import clock_check
    chk = clock_check("bogus")          # fails before any namespace is made
    assert chk.ok and chk.warn
    assert "could not run" in chk.detail and "--sender socket" in chk.detail
    assert chk.to_dict()["warn"] is True
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"ltp-g{os.getpid()}" not in left


@pytest.mark.root
def test_the_ifb_check_passes_here_warns_when_it_cannot_and_leaves_no_namespace():
    import os
    from ltpx.dataplane.doctor.checks import ifb_check
    chk = ifb_check()                   # this kernel has IFB (CI's too)
    assert chk.ok and not chk.warn and "--nodes" in chk.detail
    bad = ifb_check("nosuchkind")       # as a kernel without the driver answers
    assert bad.ok and bad.warn and "CONFIG_IFB" in bad.detail
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"ltp-ifb{os.getpid()}" not in left


@pytest.mark.unit
def test_a_passing_check_carries_no_warning():
    from ltpx.dataplane.doctor.checks import Check
    assert Check("x", True, "fine").to_dict() == {"name": "x", "ok": True, "detail": "fine",
                                                  "fix": "", "warn": False}


@pytest.mark.unit
def test_the_summing_check_names_the_kernel_or_warns_with_the_way_to_it(monkeypatch, tmp_path):
    from ltpx.control.transport import sumkernel
    from ltpx.tools.cmd_doctor import summing_check
    monkeypatch.setenv("LTP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(sumkernel, "_state", {"fn": None, "tried": False, "why": "",
                                              "path": None, "isa": None})
    monkeypatch.setenv("LTP_SUM_KERNEL", "numpy")
    chk = summing_check()
    assert chk.ok and chk.warn and "LTP_SUM_KERNEL=numpy" in chk.detail and "unset" in chk.detail
    monkeypatch.delenv("LTP_SUM_KERNEL")
    if sumkernel.compiler() is None:
        pytest.skip("no C compiler on PATH")
    chk = summing_check()
    assert chk.ok and not chk.warn and chk.detail.startswith("C kernel (")
    assert str(tmp_path) in chk.detail                  # built into the cache folder
    fresh = {"fn": None, "tried": False, "why": "", "path": None, "isa": None}
    bad = tmp_path / "badcc"
    bad.write_text("#!/bin/sh\necho 'no such option' >&2\nexit 1\n")
    bad.chmod(0o755)
    monkeypatch.setenv("CC", str(bad))
    monkeypatch.setattr(sumkernel, "_state", dict(fresh))
    chk = summing_check()                               # a compiler that fails: its error
    assert chk.ok and chk.warn and "fix the compiler's error" in chk.detail
    assert "no such option" in chk.detail
    monkeypatch.setattr(sumkernel, "_state", dict(fresh))
    chk = summing_check()                               # the next rank: remembered
    assert chk.ok and chk.warn and "then remove " in chk.detail and ".failed" in chk.detail
    monkeypatch.setattr(sumkernel, "_state", dict(fresh))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    monkeypatch.delenv("CC")
    chk = summing_check()
    assert chk.ok and chk.warn and "install gcc or clang" in chk.detail


@pytest.mark.unit
def test_a_bad_summing_setting_is_a_usage_error_before_any_check():
    import os
    import sys
    p = subprocess.run([sys.executable, "-m", "ltpx.tools.cli", "doctor", "--no-load"],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "LTP_SUM_KERNEL": "fortran"})
    assert p.returncode == 2 and "LTP_SUM_KERNEL" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
