# SPDX-License-Identifier: Apache-2.0
"""The server's summing: a round's rows into their (k-weighted) mean, in
float32, in one fixed order, in place, across threads, with the check for
NaN and Inf in the same pass.

The order, and so every bit of the result (`aggregate_into`): the rows of
nonzero weight, in row order, weights divided by their gcd (equal weights
are all 1):

    acc = w0*x0 + w1*x1;  acc = acc + w2*x2;  ...;  mean = acc / sum(w)

each operation a float32 operation rounded once (a product w*x only where
w != 1; a single row is its own sum). Every element is computed alone, so
how the range is cut into blocks and threads changes no bit: the answer is
deterministic, and as every worker applies the one answer the replicas stay
bit-identical.

The accuracy contract, against the exact weighted mean m (what float64
accumulation gives, to within its own 2**-53): with k rows of nonzero weight
and EPS = 2**-23 (float32's machine epsilon),

    |mean - m| <= k * EPS * sum(w_i * |x_i|) / sum(w_i)     per element

(k - 1 roundings of the sum, one per product, one of the division, each at
most EPS/2 relative to sum(w|x|); tests/test_aggregate.py checks it on random
rows, cancelling rows and a real model's gradients). Before issue 40 the mean
was accumulated in float64 and rounded once (at most EPS/2 * |m| off), at 8
bytes of temporary per parameter and one thread; bench/agg.py keeps that
version for the A/B.

Memory: the range is cut into blocks of BLOCK elements; a block of the
answer stays in cache while every row is added into it, so each row is read
once and the answer written once; the only scratch is one block per thread
(for weights other than 1). Blocks are shared among threads (numpy releases
the GIL in its loops) when the round is large enough to pay for them.
"""
from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np

from . import sumkernel
from .bubble import fill as fill_bubbles

# elements: 512 KiB of the answer, held in a core's L2 while rows stream in;
# each block is a few numpy calls, each a GIL hand-off between threads, and
# 2**16 summed a 4.35M round 1.34x slower on two threads (docs/benchmarks.md)
BLOCK = 1 << 17
PARALLEL_MIN = 1 << 19   # input elements below which one thread sums (a hand-off costs ~50 us)

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_local = threading.local()


def cpu_threads() -> int:
    """The threads summing uses by default: the CPUs this process may run on."""
    return len(os.sched_getaffinity(0))


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(1, cpu_threads() - 1),
                                       thread_name_prefix="ltp-sum")
        return _pool


def over_spans(n: int, span: Callable[[int, int], object], threads: int) -> list:
    """span(lo, hi) over [0, n) cut into up to `threads` contiguous spans of
    whole blocks, the first on the calling thread and the rest on the pool
    (at most cpu_threads() at once); the results in span order."""
    blocks = -(-n // BLOCK)
    parts = max(1, min(threads, blocks))
    step = -(-blocks // parts) * BLOCK
    edges = [(lo, min(n, lo + step)) for lo in range(0, n, step)] or [(0, 0)]
    if len(edges) == 1:
        return [span(*edges[0])]
    later = [_executor().submit(span, lo, hi) for lo, hi in edges[1:]]
    try:
        first = span(*edges[0])
    finally:               # every span ends before the caller may free what they touch
        wait(later)
    return [first, *(f.result() for f in later)]


def _scratch() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """This thread's blocks of scratch: the sum, a weighted row, a mask."""
    s = getattr(_local, "blocks", None)
    if s is None:
        s = _local.blocks = (np.empty(BLOCK, dtype=np.float32), np.empty(BLOCK, dtype=np.float32),
                             np.empty(BLOCK, dtype=bool))
    return s


def _threads_for(elems: int, threads: int | None) -> int:
    t = cpu_threads() if threads is None else threads
    return max(1, min(t, elems // PARALLEL_MIN or 1))


def _finite(block: np.ndarray, mask: np.ndarray) -> bool:
    """No NaN or Inf in `block` (mask: bool scratch of its size)."""
    np.isfinite(block, out=mask)
    return bool(mask.all())


def plan(weights: list[int] | None, k: int) -> tuple[list[tuple[int, int]], int]:
    """([(row, weight)] of the rows that count, in order; the divisor): the
    weights divided by their gcd, rows of weight 0 left out."""
    if weights is None:
        return [(i, 1) for i in range(k)], k
    if len(weights) != k:
        raise ValueError(f"aggregate: {len(weights)} weights for {k} rows")
    ws = [int(w) for w in weights]
    if any(w < 0 for w in ws):
        raise ValueError(f"aggregate: weights must be counts >= 0, got {ws}")
    g = math.gcd(*ws) or 1
    rows = [(i, w // g) for i, w in enumerate(ws) if w]
    return rows, sum(w for _, w in rows)


def aggregate_into(out: np.ndarray, values: np.ndarray, weights: list[int] | None = None, *,
                   average: bool = True, check: bool = False,
                   threads: int | None = None) -> bool:
    """out (float32 [n]) = the weighted mean (average=False: the weighted
    sum) of the rows of values (float32 [k, n]), in the fixed order of the
    module's docstring. Rows of weight 0 do not count; all weights 0: the
    plain mean (what the weights' mean is, weighting each row alike).

    check: also look for NaN and Inf, in the same pass; returns False when
    the result or a row of weight 0 holds one (without check, True). A
    non-finite row of nonzero weight always makes the result non-finite;
    a finite result can still be Inf by float32 overflow of the sum."""
    k, n = values.shape
    if out.shape != (n,) or out.dtype != np.float32 or values.dtype != np.float32:
        raise ValueError(f"aggregate: out float32 [{n}] and values float32 [k, {n}], got "
                         f"{out.dtype} {out.shape} and {values.dtype} {values.shape}")
    rows, div = plan(weights, k)
    if not rows:
        rows, div = plan(None, k)
    skipped = [i for i in range(k) if i not in {r for r, _ in rows}] if check else []
    if n == 0:
        return True
    div = div if average else 1
    fn = sumkernel.kernel() if sumkernel.usable(out, values) else None
    if fn is not None:       # the C kernel: one pass, one call a span
        span = sumkernel.spanner(fn, out, values, rows, skipped, div)
    else:
        span = _numpy_spanner(out, values, rows, skipped, div, check)
    return all(over_spans(n, span, _threads_for(k * n, threads))) or not check


def _numpy_spanner(out: np.ndarray, values: np.ndarray, rows: list[tuple[int, int]],
                   skipped: list[int], div: int, check: bool) -> Callable[[int, int], bool]:
    """span(lo, hi) -> finite: the numpy path, block by block (a block of
    scratch summed in cache, then written into the answer divided)."""
    finish = _finisher(div)

    def span(lo: int, hi: int) -> bool:
        ok, scratch = True, _scratch()
        with np.errstate(over="ignore", invalid="ignore"):   # looked for, not warned of
            for a in range(lo, hi, BLOCK):
                b = min(hi, a + BLOCK)
                acc, prod, mask = scratch if b - a == BLOCK else (x[:b - a] for x in scratch)
                _sum_block(acc, prod, values, rows, a, b)
                finish(acc, out[a:b])
                if check:
                    ok = ok and _finite(out[a:b], mask) and \
                        all(_finite(values[i, a:b], mask) for i in skipped)
        return ok
    return span


def _finisher(div: int) -> Callable[[np.ndarray, np.ndarray], None]:
    """How a block's sum becomes its part of the answer: divided by div (a
    power of two by a multiply with its inverse: the same bits, twice as
    fast), written once."""
    if div == 1:
        return lambda acc, out: np.copyto(out, acc)
    if div & (div - 1) == 0:
        inverse = np.float32(1.0 / div)
        return lambda acc, out: np.multiply(acc, inverse, out=out)
    d = np.float32(div)
    return lambda acc, out: np.divide(acc, d, out=out)


def _sum_block(acc: np.ndarray, prod: np.ndarray, values: np.ndarray,
               rows: list[tuple[int, int]], a: int, b: int) -> None:
    """acc = the weighted sum of rows' [a, b), in their order (acc: a
    thread's scratch block, kept in cache while each row streams through
    once; prod: another, for a row times its weight)."""
    def term(i: int, w: int, into: np.ndarray) -> np.ndarray:
        x = values[i, a:b]
        return x if w == 1 else np.multiply(x, np.float32(w), out=into)
    i0, w0 = rows[0]
    if len(rows) == 1:
        np.multiply(values[i0, a:b], np.float32(w0), out=acc)
        return
    i1, w1 = rows[1]
    np.add(term(i0, w0, acc), term(i1, w1, prod), out=acc)
    for i, w in rows[2:]:
        np.add(acc, term(i, w, prod), out=acc)


def aggregate_wide(out: np.ndarray, values: np.ndarray, weights: list[int] | None = None,
                   average: bool = True) -> None:
    """The same mean accumulated in float64 and rounded once: for rows whose
    float32 sum overflows (never on gradients; the aggregate of finite rows
    stays finite), at 8 bytes a parameter."""
    rows, div = plan(weights, values.shape[0])
    if not rows:
        rows, div = plan(None, values.shape[0])
    acc = np.zeros(values.shape[1], dtype=np.float64)
    for i, w in rows:
        acc += w * values[i].astype(np.float64)
    if average:
        acc /= div
    np.copyto(out, acc, casting="same_kind")


def rows_finite(values: np.ndarray, threads: int | None = None) -> np.ndarray:
    """bool [k]: whether each row of values holds no NaN or Inf (a summing
    pass per block, across threads; no copy)."""
    k, n = values.shape

    def span(lo: int, hi: int) -> np.ndarray:
        ok, mask = np.ones(k, dtype=bool), _scratch()[2]
        for a in range(lo, hi, BLOCK):
            b = min(hi, a + BLOCK)
            for i in range(k):
                ok[i] = ok[i] and _finite(values[i, a:b], mask[:b - a])
        return ok
    if n == 0:
        return np.ones(k, dtype=bool)
    return np.logical_and.reduce(over_spans(n, span, _threads_for(k * n, threads)))


def contain_nonfinite(g, strategy: str, threads: int | None = None) -> np.ndarray:
    """The rows of round `g` whose delivered values hold NaN or Inf (bool per
    row). Such a row is treated as lost for this round: its chunks are
    filled from the others by `strategy` ("stale" fills zeros here, and the
    row is not remembered), and the others' filled chunks are filled again
    without it, so one bad worker cannot make the aggregate non-finite.
    Finite rows (the rule) cost one pass that copies nothing."""
    if rows_finite(g.values, threads).all():
        return np.zeros(g.values.shape[0], dtype=bool)
    return contain_chunks(g, strategy)


def contain_chunks(g, strategy: str) -> np.ndarray:
    """contain_nonfinite's exact pass: the rows padded to whole chunks, each
    chunk checked, the bad rows' chunks filled (a copy of the round: only
    where a non-finite value is known to be, or, in bench/agg.py, as the
    summing before issue 40 did every round)."""
    k, n = g.values.shape
    ce = g.chunk_elems or n
    nch = -(-n // ce) if n else 0
    masks = g.masks if g.masks is not None else np.ones((k, nch), dtype=bool)
    padded = np.zeros((k, nch * ce), dtype=np.float32)
    padded[:, :n] = g.values
    chunks = padded.reshape(k, nch, ce)
    bad = (masks & ~np.isfinite(chunks).all(axis=2)).any(axis=1)
    if bad.any():
        keep = masks & ~bad[:, None]
        fill_bubbles(chunks, keep, "zero" if strategy == "stale" else strategy)
        g.values[:] = padded[:, :n]
        if g.masks is not None:
            g.masks = keep
    return bad


def sum_step(out: np.ndarray, g, weights: list[int] | None, strategy: str,
             bad: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    """A step's round `g` into `out` (the weighted mean), non-finite rows
    contained (contain_nonfinite, with Bubble Filling `strategy`); returns
    them (bool per row). bad: the rows already contained (a caller that
    had to contain first, as "stale" does before remembering the rows);
    None: look in the summing pass, and contain only when it finds NaN or
    Inf, then sum again."""
    if bad is None:
        if aggregate_into(out, g.values, weights, check=True, threads=threads):
            return np.zeros(g.values.shape[0], dtype=bool)
        bad = contain_nonfinite(g, strategy, threads)
    if not aggregate_into(out, g.values, weights, check=True, threads=threads):
        aggregate_wide(out, g.values, weights)    # finite rows whose float32 sum overflowed
    return bad
