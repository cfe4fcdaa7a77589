# SPDX-License-Identifier: Apache-2.0
"""The summing kernel: sumkernel.c built once per machine with the C
compiler, loaded through ctypes, and called by aggregate.py for each span
of a round (one call a span, the GIL let go, no numpy call per block).

It sums in aggregate.py's fixed order, each element alone, so its answer has
the numpy path's bits (tests/test_aggregate.py runs every test on both). It
reads each row once and writes the answer once, where the numpy path writes
a block of scratch and then the answer: docs/benchmarks.md ("The summing in
one pass") has the two against the host's floor.

Where it comes from: a shared object named by the sha256 of the source, the
compiler's version and the flags (opened by dataplane/clib/libs.py, which
holds its signature), in a cache folder that only its owner may
write (loading it runs its code): root's is the BPF cache's (LTP_CACHE_DIR,
else /var/cache/ltpx), anyone else's $XDG_CACHE_HOME/ltpx (else
~/.cache/ltpx). A new entry is written to a temporary name and renamed, so
ranks that build it at once each load a whole one. With no usable folder it
is built in a private temporary folder, removed once loaded. An entry is
loaded only where neither it nor a folder above it can be changed by anyone
but its owner and root (a sticky folder's entries aside). With no compiler,
or one that fails (remembered beside the entries, so the next rank does not
try again), the numpy path sums; `status()` says why (`ltp doctor` and
`ltp bench agg` show it); LTP_SUM_KERNEL=numpy chooses it (an A/B knob). A server builds
it as it starts (`warm`), not in its first round.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ...dataplane.clib import libs
from ...dataplane.xdp.bpfcache import (Cache, Unusable, cache_dir,   # the folder's rules
                                       safe_owner)
from .. import settings_table

SOURCE = Path(__file__).with_name("sumkernel.c")
FLAGS = ("-O3", "-ffp-contract=off", "-fno-math-errno", "-Wno-psabi", "-fPIC", "-shared")
FORMAT = 2
COMPILE_TIMEOUT_S = 120.0
SCALE_NONE, SCALE_MUL, SCALE_DIV = 0, 1, 2
ISAS = ("baseline", "avx2", "avx512f")     # ltp_sum_isa()'s answers, in order
STALE_TMP_S = 3600.0

log = logging.getLogger("ltpx.sumkernel")
_lock = threading.Lock()
_state: dict = {"fn": None, "tried": False, "why": "", "path": None, "isa": None}


def _fresh_lock() -> None:
    global _lock
    _lock = threading.Lock()      # a fork mid-build leaves the parent's held


os.register_at_fork(after_in_child=_fresh_lock)


class BuildFailed(Exception):
    """The kernel could not be built or loaded; the message says why.
    lasting: the compiler refused the source or its object does not load,
    which the next try would repeat (not a timeout or a full disk)."""

    def __init__(self, why: str, lasting: bool = False, cause: str = "failed",
                 file: str | None = None):
        super().__init__(why)
        self.lasting = lasting
        self.cause, self.file = cause, file    # status()'s: what to do about it


def compiler() -> list[str] | None:
    """The C compiler's command: $CC (words, as `ccache gcc`), else cc, gcc
    or clang (None: none on PATH)."""
    for cmd in (shlex.split(os.environ.get("CC", "")), ["cc"], ["gcc"], ["clang"]):
        if cmd and shutil.which(cmd[0]):
            return cmd
    return None


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """cmd in a session of its own, the whole session killed at the timeout
    (a compiler driver's children too)."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          start_new_session=True) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise BuildFailed(f"{shlex.join(cmd[:1])} took over {timeout:.0f} s",
                              cause="timeout") from None
    return subprocess.CompletedProcess(cmd, p.returncode, out.decode(errors="replace"),
                                       err.decode(errors="replace"))


def key(cc: list[str]) -> str:
    """The entry's name's hash: the source, the compiler's version, the flags."""
    try:
        version = _run([*cc, "--version"], 30.0).stdout
    except (OSError, BuildFailed):
        version = ""
    h = hashlib.sha256(SOURCE.read_bytes())
    for part in (version, " ".join(FLAGS), str(FORMAT)):
        h.update(b"\0" + part.encode())
    return h.hexdigest()


def folder() -> Path:
    """The cache folder for this user (Unusable if it is not safe to load from)."""
    if os.geteuid() == 0:
        d = Cache(cache_dir()).dir
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        d = Cache(Path(base) / "ltpx").dir
    for p in [d.resolve(), *d.resolve().parents]:      # no one else can swap what is below
        st = os.stat(p)
        sticky = st.st_mode & stat.S_ISVTX
        if st.st_uid not in (0, os.geteuid()) or (st.st_mode & 0o022 and not sticky):
            raise Unusable(f"{p}, above {d}, can be changed by others")
    return d


def _build(cc: list[str], dest: Path) -> None:
    """Compile SOURCE into dest through a temporary file beside it, renamed
    (never written in place: a process that has the old one loaded keeps
    its pages, where a file cut short under it would fault)."""
    for old in dest.parent.glob(".tmp-sum-*"):              # left by a killed build
        with contextlib.suppress(OSError):
            if time.time() - os.lstat(old).st_mtime > STALE_TMP_S:
                os.unlink(old)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-sum-", suffix=".so")
    os.close(fd)
    try:
        r = _run([*cc, *FLAGS, "-o", tmp, str(SOURCE)], COMPILE_TIMEOUT_S)
        if r.returncode != 0:
            raise BuildFailed(f"{shlex.join(cc)} failed: {(r.stderr or r.stdout).strip()[-300:]}",
                              lasting=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _trusted(p: Path) -> bool:
    """A regular file (not a link) only its owner or root may write."""
    st = os.lstat(p)
    return stat.S_ISREG(st.st_mode) and safe_owner(st)


def _load_from(path: Path) -> Callable:
    try:
        lib = libs.sumkernel(str(path))
        _state["isa"] = ISAS[lib.ltp_sum_isa()]
        return lib.ltp_sum_rows
    except (OSError, AttributeError, IndexError) as e:
        raise BuildFailed(f"{path.name} does not load: {e}", lasting=True) from None


def _obtain(cc: list[str]) -> tuple[Callable, str]:
    """(the loaded function, where it came from); BuildFailed if it cannot be had."""
    name = f"sum-{key(cc)[:32]}"
    try:
        d = folder()
    except Unusable as e:
        log.info("summing kernel not cached (%s): built in a temporary folder", e)
        with tempfile.TemporaryDirectory(prefix="ltp-sum-") as t:
            _build(cc, Path(t) / f"{name}.so")
            return _load_from(Path(t) / f"{name}.so"), "built uncached"
    entry, failed = d / f"{name}.so", d / f"{name}.failed"
    if failed.exists() and _trusted(failed):
        raise BuildFailed(failed.read_text(errors="replace").strip() + f" (remembered in {failed})",
                          cause="remembered", file=str(failed))
    if entry.exists() and _trusted(entry):
        try:
            return _load_from(entry), str(entry)
        except BuildFailed as e:                  # corrupt: built again below
            log.warning("summing kernel %s: building it again", e)
    try:
        _build(cc, entry)
        return _load_from(entry), str(entry)
    except BuildFailed as e:
        if e.lasting:
            with contextlib.suppress(OSError):
                failed.write_text(f"{e}\n")
        raise


def kernel() -> Callable | None:
    """The loaded C function, or None where the numpy path sums (the
    setting says numpy, or the kernel could not be built: status() says why)."""
    if settings_table.env("sum_kernel") == "numpy":
        return None
    if _state["tried"]:
        return _state["fn"]
    with _lock:
        if not _state["tried"]:
            try:
                cc = compiler()
                if cc is None:
                    raise BuildFailed("no C compiler (cc, gcc, clang or $CC) on PATH",
                                      cause="no-compiler")
                _state["fn"], _state["path"] = _obtain(cc)
            except Exception as e:           # noqa: BLE001 - any failure: the numpy path sums
                _state["why"] = str(e) or type(e).__name__
                _state["cause"] = getattr(e, "cause", "failed")
                _state["file"] = getattr(e, "file", None)
                log.warning("summing with numpy, not the C kernel: %s", _state["why"])
            _state["tried"] = True
    return _state["fn"]


def warm() -> None:
    """Build or load the kernel now (a server as it starts), so no round waits on it."""
    kernel()


def status() -> dict:
    """What sums: {"kernel": "c" or "numpy", "isa" (the kernel's copy: avx512f,
    avx2 or baseline), "path", "why", and for numpy "cause" (setting,
    no-compiler, failed, timeout or remembered) and "file" (a remembered
    failure's)}."""
    fn = kernel()
    if fn is not None:
        return {"kernel": "c", "isa": _state["isa"], "path": _state["path"], "why": "",
                "cause": "", "file": None}
    if settings_table.env("sum_kernel") == "numpy":
        why, cause, file = f"{settings_table.TABLE['sum_kernel'].env}=numpy", "setting", None
    else:
        why, cause, file = _state["why"], _state.get("cause", "failed"), _state.get("file")
    return {"kernel": "numpy", "isa": _state["isa"], "path": _state["path"], "why": why,
            "cause": cause, "file": file}


def usable(out: np.ndarray, values: np.ndarray) -> bool:
    """Whether the kernel can take these arrays as they are: rows of unit
    stride, a contiguous answer it may write, both of aligned floats (else
    the numpy path sums, and says what is wrong with them)."""
    return values.strides[1] == 4 and out.strides == (4,) and out.flags.writeable \
        and out.flags.aligned and values.flags.aligned


def spanner(fn: Callable, out: np.ndarray, values: np.ndarray, rows: list[tuple[int, int]],
            skipped: list[int], div: int) -> Callable[[int, int], bool]:
    """span(lo, hi) -> finite: the kernel over [lo, hi) of the answer, for
    aggregate.over_spans (rows: [(row, weight)] in order; div: what the sum
    is divided by, 1 for none). The span holds the arrays it points into."""
    base, stride = values.ctypes.data, values.strides[0]
    w = None if all(wt == 1 for _, wt in rows) else np.array([wt for _, wt in rows], np.float32)
    wp = None if w is None else w.ctypes.data
    if div == 1:
        mode, by = SCALE_NONE, 1.0
    elif div & (div - 1) == 0:
        mode, by = SCALE_MUL, 1.0 / div        # a power of two: the same bits as dividing
    else:
        mode, by = SCALE_DIV, float(div)
    o = out.ctypes.data

    def span(lo: int, hi: int) -> bool:
        ptrs = (ctypes.c_void_p * len(rows))(*(base + i * stride + lo * 4 for i, _ in rows))
        skip = (ctypes.c_void_p * max(1, len(skipped)))(
            *(base + i * stride + lo * 4 for i in skipped))
        return bool(fn(ptrs, wp, len(rows), skip, len(skipped), o + lo * 4, hi - lo, by, mode))
    span.held = (values, out, w)       # what its addresses point into lives as long as it
    return span
