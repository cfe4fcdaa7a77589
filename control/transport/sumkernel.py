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
is built in a private temporary folder, removed once loaded. With no
compiler, or one that fails, the numpy path sums (`status()` says why, as
`ltp doctor` shows); LTP_SUM_KERNEL=numpy chooses it (an A/B knob).
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ...dataplane.clib import libs
from ...dataplane.xdp.bpfcache import Cache, Unusable, cache_dir   # the folder's rules
from .. import settings_table

SOURCE = Path(__file__).with_name("sumkernel.c")
FLAGS = ("-O3", "-ffp-contract=off", "-fno-math-errno", "-Wno-psabi", "-fPIC", "-shared")
FORMAT = 1
COMPILE_TIMEOUT_S = 120.0
SCALE_NONE, SCALE_MUL, SCALE_DIV = 0, 1, 2

log = logging.getLogger("ltpx.sumkernel")
_lock = threading.Lock()
_state: dict = {"fn": None, "tried": False, "why": "", "path": None, "isa": None}


def compiler() -> str | None:
    """The C compiler: $CC, else cc, gcc or clang (None: none on PATH)."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def key(cc: str) -> str:
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    h = hashlib.sha256(SOURCE.read_bytes())
    for part in (version, " ".join(FLAGS), str(FORMAT)):
        h.update(b"\0" + part.encode())
    return h.hexdigest()


def folder() -> Path:
    """The cache folder for this user (Unusable if it is not safe to load from)."""
    if os.geteuid() == 0:
        return Cache(cache_dir()).dir
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Cache(Path(base) / "ltpx").dir


def _build(cc: str, dest: Path) -> None:
    """Compile SOURCE into dest through a temporary file beside it, renamed
    (never written in place: a process that has the old one loaded keeps
    its pages, where a file cut short under it would fault)."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-sum-", suffix=".so")
    os.close(fd)
    try:
        r = subprocess.run([cc, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True,
                           text=True, timeout=COMPILE_TIMEOUT_S)
        if r.returncode != 0:
            raise OSError(f"{cc} failed: {(r.stderr or r.stdout).strip()[-300:]}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _trusted(p: Path) -> bool:
    st = p.stat()
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022


ISAS = ("baseline", "avx2", "avx512f")


def _load_from(path: Path):
    lib = libs.sumkernel(str(path))
    _state["isa"] = ISAS[lib.ltp_sum_isa()]
    return lib.ltp_sum_rows


def _obtain(cc: str) -> tuple[Callable, str]:
    """(the loaded function, where it came from); OSError if it cannot be had."""
    name = f"sum-{key(cc)[:32]}.so"
    try:
        entry = folder() / name
    except Unusable as e:
        log.info("summing kernel not cached (%s): built in a temporary folder", e)
        with tempfile.TemporaryDirectory(prefix="ltp-sum-") as d:
            _build(cc, Path(d) / name)
            return _load_from(Path(d) / name), "built uncached"
    if entry.exists() and _trusted(entry):
        try:
            return _load_from(entry), str(entry)
        except OSError as e:                  # corrupt: built again below
            log.warning("summing kernel %s does not load (%s): building it again", entry, e)
    _build(cc, entry)
    return _load_from(entry), str(entry)


def kernel() -> Callable | None:
    """The loaded C function, or None where the numpy path sums (the
    setting says numpy, or the kernel could not be built: status() says why)."""
    if settings_table.env("sum_kernel") == "numpy":
        return None
    if _state["tried"]:
        return _state["fn"]
    with _lock:
        if not _state["tried"]:
            cc = compiler()
            try:
                if cc is None:
                    raise OSError("no C compiler (cc, gcc or $CC) on PATH")
                _state["fn"], _state["path"] = _obtain(cc)
            except (OSError, subprocess.SubprocessError) as e:
                _state["why"] = str(e)
                log.warning("summing with numpy, not the C kernel: %s", e)
            _state["tried"] = True
    return _state["fn"]


def status() -> dict:
    """What sums: {"kernel": "c" or "numpy", "isa" (the kernel's copy: avx512f,
    avx2 or baseline), "path", "why"}."""
    fn = kernel()
    why = "LTP_SUM_KERNEL=numpy" if settings_table.env("sum_kernel") == "numpy" \
        else _state["why"]
    return {"kernel": "c" if fn is not None else "numpy", "isa": _state["isa"],
            "path": _state["path"], "why": "" if fn is not None else why}


def usable(out: np.ndarray, values: np.ndarray) -> bool:
    """Whether the kernel can take these arrays as they are (rows of unit
    stride, a contiguous answer)."""
    return values.strides[1] == 4 and out.strides == (4,)


def spanner(fn: Callable, out: np.ndarray, values: np.ndarray, rows: list[tuple[int, int]],
            skipped: list[int], div: int) -> Callable[[int, int], bool]:
    """span(lo, hi) -> finite: the kernel over [lo, hi) of the answer, for
    aggregate.over_spans (rows: [(row, weight)] in order; div: what the sum
    is divided by, 1 for none)."""
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
        _ = w                                  # the weights live as long as the span
        return bool(fn(ptrs, wp, len(rows), skip, len(skipped), o + lo * 4, hi - lo, by, mode))
    return span
