# SPDX-License-Identifier: Apache-2.0
"""The summing kernel (control/transport/sumkernel.py and .c): the numpy
path's bits at every length, offset and weighting; NaN and Inf found; built
once into a cache folder its owner alone may write, loaded from it after,
built again when the entry is bad, never loaded from a folder others may
write; the numpy path, with the reason, where no compiler builds it."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from ltpx.control.settings_table import BadVariable
from ltpx.dataplane.clib import libs
from ltpx.control.transport import sumkernel
from ltpx.control.transport.aggregate import aggregate_into

pytestmark = pytest.mark.unit


def fresh_state(monkeypatch) -> None:
    monkeypatch.setattr(sumkernel, "_state", {"fn": None, "tried": False, "why": "", "path": None,
                                              "isa": None})


def needs_kernel() -> None:
    if sumkernel.kernel() is None:
        pytest.skip(f"no C summing kernel here: {sumkernel.status()['why']}")


def both(values, weights=None, average=True, monkeypatch=None):
    """(the C kernel's answer and finite flag, the numpy path's)."""
    n = values.shape[1]
    c, p = np.full(n, np.nan, np.float32), np.full(n, np.nan, np.float32)
    ok_c = aggregate_into(c, values, weights, average=average, check=True, threads=1)
    monkeypatch.setenv("LTP_SUM_KERNEL", "numpy")
    ok_p = aggregate_into(p, values, weights, average=average, check=True, threads=1)
    monkeypatch.delenv("LTP_SUM_KERNEL")
    return (c, ok_c), (p, ok_p)


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A kernel not yet loaded in this process, with its cache in tmp_path."""
    monkeypatch.delenv("LTP_SUM_KERNEL", raising=False)
    monkeypatch.setenv("LTP_CACHE_DIR", str(tmp_path / "cache"))      # root's folder
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))       # anyone else's
    fresh_state(monkeypatch)
    return tmp_path


def folder_of(tmp: Path) -> Path:
    return tmp / "cache" if os.geteuid() == 0 else tmp / "xdg" / "ltpx"


@pytest.mark.parametrize("n", [1, 15, 16, 17, 1000, 70_001])
@pytest.mark.parametrize("weights,average", [(None, True), ([3, 1, 2], True),
                                             ([2, 0, 4], True), (None, False),
                                             ([5, 5, 0], True), ([0, 7, 0], True)])
def test_the_kernels_bits_are_the_numpy_paths(monkeypatch, n, weights, average):
    needs_kernel()
    rng = np.random.default_rng(n)
    big = rng.standard_normal((3, n + 5)).astype(np.float32) * 1e3
    values = big[:, 3:3 + n]                     # rows that start off any vector's alignment
    (c, ok_c), (p, ok_p) = both(values, weights, average, monkeypatch)
    assert ok_c and ok_p
    assert np.array_equal(c.view(np.uint32), p.view(np.uint32))


@pytest.mark.parametrize("where", ["vector", "tail"])
def test_nan_inf_and_overflow_are_found_where_they_are(monkeypatch, where):
    needs_kernel()
    n = 40
    i = 3 if where == "vector" else n - 1       # 40 = 2 vectors of 16 and a tail of 8
    v = np.ones((3, n), np.float32)
    v[1, i] = np.nan
    (c, ok_c), (p, ok_p) = both(v, monkeypatch=monkeypatch)
    assert not ok_c and not ok_p and np.isnan(c[i])
    v = np.ones((3, n), np.float32)
    v[2, i] = np.inf                             # in a row that does not count
    (c, ok_c), (_, ok_p) = both(v, [1, 1, 0], monkeypatch=monkeypatch)
    assert not ok_c and not ok_p and np.isfinite(c).all()
    v = np.full((3, n), 3e38, np.float32)        # finite rows whose sum overflows
    (c, ok_c), (_, ok_p) = both(v, average=False, monkeypatch=monkeypatch)
    assert not ok_c and not ok_p and np.isinf(c[i])
    assert aggregate_into(c, v, average=False, check=False)      # not asked: True


def test_rows_of_any_stride_still_sum_on_the_numpy_path():
    v = np.random.default_rng(1).standard_normal((4, 2000)).astype(np.float32)
    strided = v[:, ::2]
    assert not sumkernel.usable(np.empty(1000, np.float32), strided)
    out = np.empty(1000, np.float32)
    aggregate_into(out, strided)
    want = ((strided[0] + strided[1]) + strided[2]) + strided[3]
    assert np.array_equal(out, want * np.float32(0.25))


def test_built_once_into_its_folder_then_loaded_from_it(fresh, monkeypatch):
    if sumkernel.compiler() is None:
        pytest.skip("no C compiler on PATH")
    fn = sumkernel.kernel()
    st = sumkernel.status()
    assert fn is not None and st["kernel"] == "c" and st["isa"] in sumkernel.ISAS
    entry = Path(st["path"])
    assert entry.parent == folder_of(fresh) and entry.is_file()
    assert not entry.stat().st_mode & 0o022
    stamp = entry.stat().st_mtime_ns
    fresh_state(monkeypatch)
    monkeypatch.setattr(sumkernel, "_build", lambda *a: pytest.fail("built again"))
    assert sumkernel.kernel() is not None and sumkernel.status()["path"] == str(entry)
    assert entry.stat().st_mtime_ns == stamp


def test_a_bad_entry_is_built_again(fresh):
    cc = sumkernel.compiler()
    if cc is None:
        pytest.skip("no C compiler on PATH")
    d = folder_of(fresh)
    d.mkdir(parents=True)
    entry = d / f"sum-{sumkernel.key(cc)[:32]}.so"
    entry.write_bytes(b"not an object")          # as a crash mid-write could leave it
    assert sumkernel.kernel() is not None
    assert sumkernel.status()["path"] == str(entry)
    assert entry.read_bytes()[:4] == b"\x7fELF"


def test_never_built_into_a_folder_others_may_write(fresh):
    if sumkernel.compiler() is None:
        pytest.skip("no C compiler on PATH")
    d = folder_of(fresh)
    d.mkdir(parents=True)
    d.chmod(0o777)
    assert sumkernel.kernel() is not None
    assert sumkernel.status()["path"] == "built uncached"
    assert list(d.iterdir()) == []


def test_no_compiler_sums_with_numpy_and_says_why(fresh, monkeypatch):
    monkeypatch.setenv("PATH", str(fresh / "empty"))
    monkeypatch.delenv("CC", raising=False)
    assert sumkernel.kernel() is None
    st = sumkernel.status()
    assert st["kernel"] == "numpy" and "no C compiler" in st["why"]
    v = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = np.empty(4, np.float32)
    assert aggregate_into(out, v, check=True)
    assert np.array_equal(out, ((v[0] + v[1]) + v[2]) / np.float32(3))


def fake_cc(tmp: Path, body: str) -> Path:
    cc = tmp / "fakecc"
    cc.write_text("#!/bin/sh\n" + body)
    cc.chmod(0o755)
    return cc


def test_a_compiler_that_fails_is_named_and_remembered(fresh, monkeypatch):
    tries = fresh / "tries"
    monkeypatch.setenv("CC", str(fake_cc(fresh, f"echo x >> {tries}\n"
                                                "echo 'cannot do it' >&2\nexit 1\n")))
    assert sumkernel.kernel() is None
    assert "cannot do it" in sumkernel.status()["why"]
    assert not list(folder_of(fresh).glob("*.so"))
    built = len(tries.read_text().split())           # --version, then the build
    fresh_state(monkeypatch)                          # the next rank: not tried again
    assert sumkernel.kernel() is None and "remembered" in sumkernel.status()["why"]
    assert len(tries.read_text().split()) == built + 1      # its --version alone


def test_a_compiler_that_hangs_is_killed_with_its_children_and_not_remembered(fresh,
                                                                               monkeypatch):
    pid = fresh / "child.pid"
    monkeypatch.setenv("CC", str(fake_cc(fresh, f'[ "$1" = --version ] && exit 0\n'
                                                f"sleep 60 & echo $! > {pid}\nwait\n")))
    monkeypatch.setattr(sumkernel, "COMPILE_TIMEOUT_S", 1.0)
    assert sumkernel.kernel() is None
    assert "took over" in sumkernel.status()["why"]
    child = int(pid.read_text())
    for _ in range(50):
        if not Path(f"/proc/{child}").exists():
            break
        time.sleep(0.1)
    assert not Path(f"/proc/{child}").exists(), "the compiler's child outlived the timeout"
    assert not list(folder_of(fresh).glob("*.failed"))


def test_not_loaded_where_a_folder_above_can_be_changed_by_others(fresh):
    if sumkernel.compiler() is None:
        pytest.skip("no C compiler on PATH")
    d = folder_of(fresh)
    d.mkdir(parents=True)
    d.parent.chmod(0o777)                             # not sticky: d could be swapped
    assert sumkernel.kernel() is not None
    assert sumkernel.status()["path"] == "built uncached"
    assert list(d.iterdir()) == []


def test_an_answer_it_may_not_write_goes_to_numpy_which_refuses_it():
    v = np.ones((2, 64), np.float32)
    out = np.empty(64, np.float32)
    out.flags.writeable = False
    assert not sumkernel.usable(out, v)
    with pytest.raises(ValueError, match="read-only"):
        aggregate_into(out, v)
    odd = np.frombuffer(bytearray(4 * 65), np.float32, 64, offset=0)
    shifted = np.frombuffer(bytearray(4 * 65 + 1), np.uint8)[1:].view(np.float32)
    assert sumkernel.usable(odd, v) and not sumkernel.usable(shifted[:64], v)


def test_every_copy_the_cpu_has_gives_the_numpy_paths_bits(fresh, monkeypatch):
    if sumkernel.compiler() is None:
        pytest.skip("no C compiler on PATH")
    sumkernel.kernel()
    lib = libs.sumkernel(sumkernel.status()["path"])
    v = np.random.default_rng(3).standard_normal((5, 1000 + 7)).astype(np.float32)
    v[2, 500] = -0.0
    ran = []
    try:
        for want in (2, 1, 0):
            got = lib.ltp_sum_use(want)
            if got != want:
                continue                                  # this CPU lacks that copy
            ran.append(sumkernel.ISAS[got])
            (c, ok_c), (p, ok_p) = both(v, [3, 1, 0, 2, 5], monkeypatch=monkeypatch)
            assert ok_c and ok_p and np.array_equal(c.view(np.uint32), p.view(np.uint32)), want
            (c, _), (p, _) = both(v, None, average=False, monkeypatch=monkeypatch)
            assert np.array_equal(c.view(np.uint32), p.view(np.uint32)), want
    finally:
        lib.ltp_sum_use(2)
    assert "baseline" in ran


def test_the_setting_chooses_numpy_and_a_bad_one_is_named(monkeypatch):
    monkeypatch.setenv("LTP_SUM_KERNEL", "numpy")
    assert sumkernel.kernel() is None
    st = sumkernel.status()
    assert st["kernel"] == "numpy" and st["why"] == "LTP_SUM_KERNEL=numpy"
    monkeypatch.setenv("LTP_SUM_KERNEL", "fortran")
    with pytest.raises(BadVariable, match="LTP_SUM_KERNEL"):
        sumkernel.kernel()


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_gcc_and_clang_build_the_same_bits(fresh, monkeypatch, cc):
    if not shutil.which(cc):
        pytest.skip(f"no {cc} on PATH")
    monkeypatch.setenv("CC", cc)
    assert sumkernel.kernel() is not None, sumkernel.status()["why"]
    v = np.random.default_rng(7).standard_normal((5, 4099)).astype(np.float32)
    (c, ok_c), (p, ok_p) = both(v, [3, 1, 0, 2, 5], monkeypatch=monkeypatch)
    assert ok_c and ok_p and np.array_equal(c.view(np.uint32), p.view(np.uint32))
