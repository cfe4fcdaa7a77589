# SPDX-License-Identifier: Apache-2.0
"""`ltp bench agg`: the server's summing of a step's round against the
host's memory floors, all in one run, in alternating blocks.

Arms, each timed at every size (GB/s: bytes of input read per second):
  memcpy_T   np.copyto of the whole input into another buffer
  add_T      np.add(a, b, out=a), a and b each half the input: the
             streaming-add floor of issue 40
  add3_T     np.add(a, b, out=c): the same add into a third buffer, as an
             answer is written apart from the rows it sums
  old        the server before issue 40: contain_nonfinite (a padded copy
             of the rows, np.isfinite over all of it) then the float64 mean
             (old_ functions below, kept for this A/B)
  new_T      the server's path now: aggregate.sum_step (float32, fixed
             order, spans across threads, NaN check in the same pass) on
             what sums by default: the C kernel where it builds
  numpy_T    the same on the numpy path (LTP_SUM_KERNEL=numpy): a block of
             scratch summed in cache, then written into the answer
T: 1 (one thread) or all (a thread per CPU this process may use).
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import numpy as np

from .. import settings_table
from ..transport import sumkernel
from ..transport.aggregate import contain_chunks, cpu_threads, over_spans, sum_step

# the MLPs of `ltp train`: the default, --hidden 2048,2048 and --hidden 5000,5000
SIZES = (234_122, 4_349_962, 25_380_010)
ARMS = ("memcpy_1", "memcpy_all", "add_1", "add_all", "add3_1", "add3_all", "old", "new_1",
        "new_all", "numpy_1", "numpy_all")
CHUNK_ELEMS = 358        # float32 per LTP chunk at MTU 1500: the masks the old check walked


def old_aggregate_into(out: np.ndarray, values: np.ndarray,
                       weights: list[int] | None = None) -> None:
    """server.aggregate_into before issue 40: the float64 mean, rounded once."""
    if weights is None or len(set(weights)) == 1:
        np.copyto(out, values.mean(axis=0, dtype=np.float64), casting="same_kind")
        return
    w = np.asarray(weights, dtype=np.float64)
    acc = np.zeros(values.shape[1], dtype=np.float64)
    for i in range(values.shape[0]):
        acc += w[i] * values[i]
    acc /= w.sum()
    np.copyto(out, acc, casting="same_kind")


def old_contain_nonfinite(g, strategy: str) -> np.ndarray:
    """server.contain_nonfinite before issue 40: the rows padded into a new
    array and np.isfinite over all of it, every round (what
    aggregate.contain_chunks still does where a value is non-finite)."""
    return contain_chunks(g, strategy)


@contextlib.contextmanager
def _numpy_path() -> Iterator[None]:
    """The server's summing on its numpy path for the call (this bench's
    arms run one at a time, so the variable is the only one setting it)."""
    var = settings_table.TABLE["sum_kernel"].env
    before = os.environ.get(var)
    os.environ[var] = "numpy"
    try:
        yield
    finally:
        if before is None:
            del os.environ[var]
        else:
            os.environ[var] = before


def _on_numpy(out, g, weights, t) -> None:
    with _numpy_path():
        sum_step(out, g, weights, "mean", threads=t)


def _arms(values: np.ndarray, weights: list[int]) -> dict[str, Callable[[], object]]:
    """Each arm as a call that does its work once."""
    k, n = values.shape
    flat = values.reshape(-1)
    half = flat.size // 2
    copy, third = np.empty_like(flat), np.empty(half, dtype=np.float32)
    copy[:] = flat
    out = np.empty(n, dtype=np.float32)
    g = SimpleNamespace(values=values, chunk_elems=CHUNK_ELEMS, workers=list(range(k)),
                        masks=np.ones((k, -(-n // CHUNK_ELEMS)), dtype=bool))
    a, b = copy[:half], copy[half:2 * half]
    everyone = cpu_threads()

    def spread(f: Callable[[int, int], object], size: int, threads: int) -> Callable[[], object]:
        return lambda: over_spans(size, f, threads)
    arms = {}
    for tag, t in (("1", 1), ("all", everyone)):
        arms[f"memcpy_{tag}"] = spread(lambda lo, hi: np.copyto(copy[lo:hi], flat[lo:hi]),
                                       flat.size, t)
        arms[f"add_{tag}"] = spread(lambda lo, hi: np.add(a[lo:hi], b[lo:hi], out=a[lo:hi]),
                                    half, t)
        arms[f"add3_{tag}"] = spread(
            lambda lo, hi: np.add(a[lo:hi], b[lo:hi], out=third[lo:hi]), half, t)
        arms[f"new_{tag}"] = (lambda t=t: sum_step(out, g, weights, "mean", threads=t))
        arms[f"numpy_{tag}"] = (lambda t=t: _on_numpy(out, g, weights, t))
    arms["old"] = lambda: (old_contain_nonfinite(g, "mean"),
                           old_aggregate_into(out, values, weights))
    return {name: arms[name] for name in ARMS}


def _time(f: Callable[[], object], reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        f()
    return time.perf_counter() - t0


def bench_size(params: int, weights: list[int], blocks: int, min_s: float,
               seed: int = 0) -> dict:
    """Every arm at one size: `blocks` blocks, the arms' order turning by one
    each block; each arm's block repeats it for at least min_s."""
    k = len(weights)
    values = np.random.default_rng(seed).standard_normal((k, params), dtype=np.float32)
    nbytes = values.nbytes
    arms = _arms(values, weights)
    reps = {}
    for name, f in arms.items():       # a first call each (page faults, pools), and the count
        reps[name] = max(1, math.ceil(min_s / max(_time(f, 1), 1e-9)))
    per = {name: [] for name in arms}
    names = list(arms)
    for b in range(blocks):
        for name in names[b % len(names):] + names[:b % len(names)]:
            per[name].append(nbytes * reps[name] / _time(arms[name], reps[name]) / 1e9)
    med = {name: float(np.median(x)) for name, x in per.items()}
    return {"params": params, "input_bytes": nbytes, "gbps": med,
            "block_gbps": {name: [round(x, 3) for x in v] for name, v in per.items()},
            "reps": reps,
            "new_over_add": med["new_all"] / med["add_all"],
            "new_over_add_1": med["new_1"] / med["add_1"],
            "new_over_add3": med["new_all"] / med["add3_all"],
            "numpy_over_add": med["numpy_all"] / med["add_all"],
            "numpy_over_add_1": med["numpy_1"] / med["add_1"],
            "new_over_old": med["new_all"] / med["old"]}


def run(params: list[int], weights: list[int], blocks: int, min_s: float,
        progress: Callable[[str], None] | None = None) -> dict:
    load0 = os.getloadavg()
    sizes = []
    for p in params:
        if progress:
            progress(f"{len(weights)} workers x {p:,} parameters")
        sizes.append(bench_size(p, weights, blocks, min_s))
    return {"config": {"workers": len(weights), "weights": weights, "params": params,
                       "blocks": blocks, "min_s": min_s, "threads_all": cpu_threads(),
                       "summing": sumkernel.status(),
                       "gbps": "bytes of input read per second / 1e9"},
            "machine": {"cpus": os.cpu_count(), "loadavg_start": list(load0),
                        "loadavg_end": list(os.getloadavg())},
            "sizes": sizes}


def table(res: dict) -> str:
    c = res["config"]
    lines = []
    for r in res["sizes"]:
        g = r["gbps"]
        lines += [f"{c['workers']} workers x {r['params']:,} parameters "
                  f"({r['input_bytes'] / 1e6:.2f} MB of input)",
                  f"GB/s of input read, the median of {c['blocks']} blocks",
                  f"{'':24}{'1 thread':>10}{str(c['threads_all']) + ' threads':>12}"]
        for label, arm in (("memcpy", "memcpy"), ("add a += b (floor)", "add"),
                           ("add c = a + b", "add3"), ("new (C kernel)", "new"),
                           ("new, numpy path", "numpy")):
            lines.append(f"{label:24}{g[arm + '_1']:10.2f}{g[arm + '_all']:12.2f}")
        lines += [f"{'old (float64 + copy)':24}{g['old']:10.2f}{'-':>12}",
                  f"{'new / add floor':24}{r['new_over_add_1']:10.2f}{r['new_over_add']:12.2f}",
                  f"{'numpy path / add floor':24}{r['numpy_over_add_1']:10.2f}"
                  f"{r['numpy_over_add']:12.2f}",
                  f"{'new / old':24}{'':10}{r['new_over_old']:11.1f}x", ""]
    load, summing = res["machine"], c["summing"]
    if summing["kernel"] != "c":
        lines.append(f"no C kernel here ({summing['why']}): new is the numpy path")
    lines.append(f"load average {load['loadavg_start'][0]:.2f} at the start, "
                 f"{load['loadavg_end'][0]:.2f} at the end ({load['cpus']} CPUs)")
    return "\n".join(lines)
