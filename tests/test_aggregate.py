# SPDX-License-Identifier: Apache-2.0
"""The server's summing (control/transport/aggregate.py): every bit of the
answer from one fixed float32 order, whatever the blocks and threads; the
accuracy contract against float64 on random rows, cancelling rows and a real
model's gradients; NaN and Inf found in the summing pass and contained as
before. Every test runs twice: on the C kernel (control/transport/sumkernel.c,
what sums where a compiler builds it) and on the numpy path."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ltpx.control.transport import aggregate as agg
from ltpx.control.transport import sumkernel
from ltpx.control.transport.aggregate import (aggregate_into, contain_nonfinite, rows_finite,
                                              sum_step)

EPS = float(np.finfo(np.float32).eps)        # 2**-23


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory):
    """The C kernel built for this module into a folder of its own, not the
    host's cache."""
    d = tmp_path_factory.mktemp("sumcache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LTP_CACHE_DIR", str(d))
        mp.setenv("XDG_CACHE_HOME", str(d))
        mp.setattr(sumkernel, "_state", {"fn": None, "tried": False, "why": "", "path": None,
                                         "isa": None})
        yield sumkernel.kernel()


@pytest.fixture(autouse=True, params=["c", "numpy"])
def summing(request, monkeypatch, kernel_cache):
    """Each test on the C kernel and on the numpy path."""
    if request.param == "numpy":
        monkeypatch.setenv("LTP_SUM_KERNEL", "numpy")
    else:
        monkeypatch.delenv("LTP_SUM_KERNEL", raising=False)
        if kernel_cache is None:
            pytest.skip(f"no C summing kernel here: {sumkernel.status()['why']}")
    return request.param


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit (a -0 against a 0, or two NaNs, told apart)."""
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def fixed_order(values: np.ndarray, weights=None, average=True) -> np.ndarray:
    """The contract's order written out plainly: rows of nonzero weight in row
    order, weights over their gcd, one float32 rounding per operation."""
    k = len(values)
    ws = [1] * k if weights is None or not any(weights) else list(weights)
    g = np.gcd.reduce(np.array(ws))
    rows = [(i, w // g) for i, w in enumerate(ws) if w]
    acc = None
    for i, w in rows:
        term = values[i] if w == 1 else values[i] * np.float32(w)
        acc = term.copy() if acc is None else acc + term
    if average:
        acc = acc / np.float32(sum(w for _, w in rows))
    return acc.astype(np.float32)


def contract_holds(values: np.ndarray, got: np.ndarray, weights=None) -> float:
    """Asserts |got - exact| <= k * EPS * sum(w|x|) / sum(w) per element
    (exact: float64, the weighted mean); returns the worst error over its bound."""
    k = len(values)
    w = np.ones(k) if weights is None else np.asarray(weights, dtype=np.float64)
    x = values.astype(np.float64)
    exact = (w[:, None] * x).sum(axis=0) / w.sum()
    scale = (w[:, None] * np.abs(x)).sum(axis=0) / w.sum()
    rows = int(np.count_nonzero(w))
    err = np.abs(got.astype(np.float64) - exact)
    bound = rows * EPS * scale
    assert (err <= bound).all(), (err - bound).max()
    return float((err / np.where(bound > 0, bound, 1)).max())


@pytest.mark.unit
@pytest.mark.parametrize("weights", [None, [1, 1, 1, 1], [3, 1, 2, 5], [2, 0, 4, 2], [0, 0, 0, 0],
                                     [0, 7, 0, 0]])
def test_every_bit_comes_from_the_fixed_order_whatever_the_threads(weights):
    n = 2 * agg.BLOCK * 3 + 12_345          # blocks, a ragged last one, several spans
    v = np.random.default_rng(5).standard_normal((4, n)).astype(np.float32)
    want = fixed_order(v, weights)
    for threads in (1, 2, 5):
        out = np.full(n, np.nan, dtype=np.float32)
        assert aggregate_into(out, v, weights, threads=threads, check=True)
        assert same_bits(out, want), threads
    total = np.empty(n, dtype=np.float32)
    aggregate_into(total, v, weights, average=False, threads=2)
    assert same_bits(total, fixed_order(v, weights, average=False))


@pytest.mark.unit
def test_one_row_and_three_rows_and_an_empty_round():
    v = np.random.default_rng(6).standard_normal((3, 1000)).astype(np.float32)
    out = np.empty(1000, dtype=np.float32)
    aggregate_into(out, v[:1])
    assert same_bits(out, v[0])
    aggregate_into(out, v)                        # 3: a real division, not a multiply
    assert same_bits(out, ((v[0] + v[1]) + v[2]) / np.float32(3))
    assert aggregate_into(np.empty(0, np.float32), np.empty((3, 0), np.float32), check=True)
    with pytest.raises(ValueError, match="float32"):
        aggregate_into(np.empty(1000), v)
    with pytest.raises(ValueError, match="weights"):
        aggregate_into(out, v, [1, 2])


@pytest.mark.unit
@pytest.mark.parametrize("weights", [None, [3, 1, 2, 2]])
def test_the_accuracy_contract_on_random_and_cancelling_rows(weights):
    rng = np.random.default_rng(7)
    n = 200_000
    cases = {
        "normal": rng.standard_normal((4, n)),
        "scales": rng.standard_normal((4, n)) * 10.0 ** rng.integers(-20, 20, (4, n)),
        # rows that nearly cancel: the mean is tiny against sum |x|
        "cancel": np.stack([(b := rng.standard_normal(n)), -b + 1e-6 * rng.standard_normal(n),
                            (c := rng.standard_normal(n)), -c]),
    }
    for name, x in cases.items():
        v = x.astype(np.float32)
        out = np.empty(n, dtype=np.float32)
        aggregate_into(out, v, weights, threads=2)
        worst = contract_holds(v, out, weights)
        assert worst <= 1.0, name


@pytest.mark.unit
def test_the_accuracy_contract_on_a_real_models_gradients():
    """Four workers' gradients of the built-in MLP (234k parameters) on their
    own batches of the digits, over a few SGD steps on CPU: the answer keeps
    the contract, and most values are the float64-accumulated mean's bit for
    bit (about 80 % when this was written; the worst error 0.3 of the bound,
    1.3 EPS of the mean |x|, where float64's rounding alone is 0.5)."""
    import torch  # noqa: PLC0415 (torch for this test alone)
    from ltpx.control.training.data import BatchStream, split  # noqa: PLC0415 (imports torch)
    from ltpx.control.training.model import build_mlp  # noqa: PLC0415 (imports torch)
    model = build_mlp(seed=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = split(0)
    streams = [BatchStream(data, w, 4, 32, 0) for w in range(4)]
    for _ in range(4):
        rows = []
        for s in streams:
            x, y = s.next()
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(torch.from_numpy(x)),
                                              torch.from_numpy(y)).backward()
            rows.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy())
        v = np.stack(rows).astype(np.float32)
        for weights in (None, [3, 1, 2, 2]):
            out = np.empty(v.shape[1], dtype=np.float32)
            aggregate_into(out, v, weights)
            assert contract_holds(v, out, weights) <= 1.0
            old = np.empty_like(out)
            agg.aggregate_wide(old, v, weights)           # the float64 mean, rounded once
            assert np.mean(out == old) > 0.5
        with torch.no_grad():                             # every replica steps on the answer
            off = 0
            for p in model.parameters():
                p.grad = torch.from_numpy(out[off:off + p.numel()].copy()).reshape(p.shape)
                off += p.numel()
        opt.step()


@pytest.mark.unit
def test_nan_and_inf_are_found_in_the_summing_pass():
    n = agg.BLOCK + 100
    v = np.ones((3, n), dtype=np.float32)
    out = np.empty(n, dtype=np.float32)
    assert aggregate_into(out, v, check=True)
    assert aggregate_into(out, v, check=False)     # unchecked says nothing
    for bad in (np.nan, np.inf, -np.inf):
        w = v.copy()
        w[1, n - 3] = bad
        assert not aggregate_into(out, w, check=True, threads=2)
        assert rows_finite(w).tolist() == [True, False, True]
    w = v.copy()
    w[0, 5], w[2, 5] = np.inf, -np.inf              # Inf - Inf: NaN
    assert not aggregate_into(out, w, check=True)
    w = v.copy()
    w[1, 7] = np.nan                                # a row of weight 0: still looked at
    assert not aggregate_into(out, w, [1, 0, 1], check=True)
    big = np.full((4, 10), 3e38, dtype=np.float32)  # finite rows, the float32 sum overflows
    assert not aggregate_into(out[:10], big, check=True) and rows_finite(big).all()


def _gathered(vals, masks=None, chunk_elems=0):
    return SimpleNamespace(values=vals, masks=masks, chunk_elems=chunk_elems,
                           workers=list(range(len(vals))))


@pytest.mark.unit
@pytest.mark.parametrize("strategy", ["mean", "zero"])
def test_sum_step_contains_as_before_and_never_answers_nan(strategy):
    """The step's path: one pass when every row is finite; a NaN found there
    is contained exactly as contain_nonfinite did before the sum (the row
    treated as lost, filled by the strategy), and the round summed again."""
    rng = np.random.default_rng(8)
    vals = rng.standard_normal((3, 40)).astype(np.float32)
    vals[1, 9] = np.nan
    masks = np.ones((3, 4), dtype=bool)
    before = vals.copy()
    ref = _gathered(before, masks.copy(), 10)
    assert contain_nonfinite(ref, strategy).tolist() == [False, True, False]
    want = fixed_order(ref.values)
    g = _gathered(vals, masks.copy(), 10)
    out = np.empty(40, dtype=np.float32)
    assert sum_step(out, g, [1, 1, 1], strategy).tolist() == [False, True, False]
    assert same_bits(out, want) and np.isfinite(out).all()
    assert np.array_equal(g.masks, ref.masks)
    clean = _gathered(rng.standard_normal((2, 40)).astype(np.float32))
    assert not sum_step(out, clean, [1, 1], strategy).any()
    big = _gathered(np.full((4, 10), 3e38, dtype=np.float32))   # overflow: float64's answer
    assert not sum_step(out[:10], big, None, strategy).any()
    assert np.array_equal(out[:10], np.full(10, 3e38, dtype=np.float32))
