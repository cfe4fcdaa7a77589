# SPDX-License-Identifier: Apache-2.0
"""compress="bf16" | "fp16": gradients as 2-byte floats on the wire (codec.Half).

The codec against torch's own conversions (no privileges), and the server's
and a worker's codecs over a round that lost a chunk; `ltp train --compress
bf16` on a rig is test_compress.py's, beside uint8."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from ltpx.control.torchapi.codec import Half, ServerCodec, WorkerCodec, make_codec

CB = 1432                 # the LTP chunk at a 1500-byte MTU
Q = CB // 2               # elements per chunk
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def rounded(x: np.ndarray, kind: str) -> np.ndarray:
    """x as torch rounds it to the 16-bit dtype, back in float32."""
    return torch.from_numpy(x).to(DTYPES[kind]).float().numpy()


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["bf16", "fp16"])
@pytest.mark.parametrize("n", [1, 2, Q, Q + 1, 10_001])
def test_the_wire_holds_what_torch_rounds_to_and_the_residual_the_rest(kind, n):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 50
    if n > 8:
        x[:4] = [np.nan, np.inf, -0.0, 1e6]     # 1e6: past fp16's range, an infinity there
    c = make_codec(kind, CB)
    assert isinstance(c, Half) and c.per_chunk == Q and c.words(n) == -(-n // 2)
    words = np.full(c.words(n), 7.0, dtype=np.float32)
    res = np.zeros_like(x)
    c.encode(x, words, residual=res)
    if n % 2:                                     # the odd last half-word is zero
        assert words.view(np.uint16)[n] == 0
    out = np.zeros((1, n), dtype=np.float32)
    c.decode(words[None], n, out)
    want = rounded(x, kind)
    assert np.array_equal(out[0], want, equal_nan=True)
    fin = np.isfinite(want)
    assert np.array_equal(res[fin], x[fin] - want[fin]) and np.all(res[~fin] == 0)
    if n > 8:
        assert np.isnan(out[0, 0]) and out[0, 1] == np.inf and np.signbit(out[0, 2])
        assert out[0, 3] == (np.inf if kind == "fp16" else 999424.0)


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["bf16", "fp16"])
def test_a_lost_chunk_is_filled_alone_and_the_answer_comes_back_rounded_once(kind):
    """Two workers' pieces (gradients already of the 16-bit dtype travel
    exactly), worker 0's chunk 1 lost: the server decodes every other
    element bit for bit and fills chunk 1's 716 alone ("mean": worker 1's);
    the answer is the aggregate rounded once to the dtype, and the rounding
    the server left out goes into its next answer (error feedback)."""
    n = 3 * Q + 100
    rng = np.random.default_rng(3)
    grads = [rounded(rng.standard_normal(n).astype(np.float32) * (w + 1), kind)
             for w in (0, 1)]
    codec = make_codec(kind, CB)
    pieces = []
    for g in grads:
        buf = g.copy()
        pieces.append(WorkerCodec(CB).piece(buf, kind).copy())
        assert not buf.any()                      # exact: nothing left to feed back
    srv = ServerCodec(CB)
    assert srv.open(7, n, reliable=False, wire=kind) == codec.words(n)
    masks = np.ones((2, codec.chunks(n)), bool)
    masks[0, 1] = False
    rows = srv.decode(7, np.stack(pieces), masks, "mean")
    lo, hi = Q, 2 * Q
    assert np.array_equal(rows[1], grads[1])
    assert np.array_equal(rows[0, :lo], grads[0][:lo]) and np.array_equal(rows[0, hi:], grads[0][hi:])
    assert np.array_equal(rows[0, lo:hi], grads[1][lo:hi])
    agg = rows.mean(axis=0).astype(np.float32)
    tail = np.arange(5, dtype=np.float32)
    wire = srv.answer(np.concatenate([agg, tail]), d=8)
    wk = WorkerCodec(CB)
    wk.expect(8, n, kind)
    assert wk.wire_elems(8, n + 5) == len(wire) == codec.words(n) + 5
    out = np.zeros(n + 5, dtype=np.float32)
    wk.decode(8, wire, out)
    assert np.array_equal(out[:n], rounded(agg, kind)) and np.array_equal(out[n:], tail)
    assert np.array_equal(srv.residual[(kind, n)], agg - rounded(agg, kind))


@pytest.mark.unit
def test_compress_auto_sends_half_gradients_as_such_and_the_rest_as_float32():
    from ltpx.control.torchapi.codec import wire_for
    bf, fp, f32 = torch.bfloat16, torch.float16, torch.float32
    assert wire_for("auto", {bf}) == "bf16" and wire_for("auto", [fp, fp]) == "fp16"
    assert wire_for("auto", {f32}) == "none" and wire_for("auto", {bf, fp}) == "none"
    assert wire_for("auto", {bf, f32}) == "none" and wire_for("auto", set()) == "none"
    assert wire_for("auto", {bf}, deferred=True) == "none"   # a deferred chunk is float32's
    for setting in ("none", "uint8", "bf16", "fp16"):                 # a setting rules
        assert wire_for(setting, {bf}) == wire_for(setting, {f32}) == setting


@pytest.mark.unit
def test_under_auto_a_piece_keeps_its_values_and_decodes_exactly():
    """compress auto (codec.piece_feedback False): a bf16 gradient's piece is
    coded in one pass and left as it was (no rounding error to keep)."""
    from ltpx.control.torchapi.settings import Settings
    from ltpx.control.torchapi.codec import piece_feedback
    assert not piece_feedback(Settings.resolve({"compress": "auto"}))
    assert piece_feedback(Settings.resolve({"compress": "bf16"}))
    g = rounded(np.random.default_rng(9).standard_normal(2 * Q + 7).astype(np.float32), "bf16")
    buf = g.copy()
    words = WorkerCodec(CB, keep_error=False).piece(buf, "bf16").copy()
    assert np.array_equal(buf, g)                        # untouched
    out = np.zeros((1, len(g)), dtype=np.float32)
    make_codec("bf16", CB).decode(words[None, :], len(g), out)
    assert np.array_equal(out[0], g)
