# SPDX-License-Identifier: Apache-2.0
"""The loss policy's wire, a worker's and a server's side (control/torchapi/
carry.py, codec.ServerCodec.set_carry; issue 42).

A worker's rounding error is the one its link's codec makes; across a switch
to bfloat16 and back nothing a gradient held is lost (what was sent plus what
is still kept is what the gradients summed to), and on float32 nothing is
kept; the server carries its answers' rounding only while the ops carry (or
its setting asks for it). The policy's choice itself: test_loss_policy.py;
on a rig, with the workers following it: test_train.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ltpx.control.torchapi.carry import Carry, rounding_error
from ltpx.control.torchapi.codec import ServerCodec, WorkerCodec, make_codec
from ltpx.control.torchapi.ops import STEP, Op

CB = 1432                 # the LTP chunk at a 1500-byte MTU
FP32, BF16 = Op(STEP, sizes=(1,)), Op(STEP, sizes=(1,), wire="bf16", carry=True)


def _sent(piece: np.ndarray, op: Op) -> np.ndarray:
    """What the server decodes of piece pushed under op: the link's codec
    under compress auto (keep_error off: the piece is left as it was)."""
    buf = piece.copy()
    words = WorkerCodec(CB, keep_error=False).piece(buf, op.wire)
    assert np.array_equal(buf, piece)
    if op.wire == "none":
        return words.copy()
    out = np.zeros((1, len(piece)), dtype=np.float32)
    make_codec(op.wire, CB).decode(words[None, :], len(piece), out)
    return out[0]


@pytest.mark.unit
@pytest.mark.parametrize("wire", ["bf16", "fp16"])
def test_the_rounding_error_is_the_codecs_to_the_bit(wire):
    x = np.random.default_rng(1).standard_normal(3001).astype(np.float32) * 7
    x[[5, 6, 7]] = [np.nan, np.inf, -np.inf]
    mine, theirs = np.empty_like(x), np.empty_like(x)
    rounding_error(x, wire, mine)
    make_codec(wire, CB).encode(x, np.empty(len(x), np.float32), residual=theirs)
    assert np.array_equal(mine.view(np.int32), theirs.view(np.int32))
    assert not mine[[5, 6, 7]].any()         # a non-finite value carries nothing on
    ok = np.isfinite(x)
    back = torch.from_numpy(x[ok] - mine[ok]).to(torch.bfloat16 if wire == "bf16"
                                                   else torch.float16).float().numpy()
    assert np.array_equal(back, x[ok] - mine[ok])   # the rest is what the wire holds


@pytest.mark.unit
def test_across_a_switch_and_back_nothing_is_lost_and_nothing_kept_on_float32():
    rng = np.random.default_rng(2)
    ops = [FP32] * 2 + [BF16] * 5 + [FP32] * 3
    carry, sent_sum, grad_sum = Carry(), np.zeros(2000), np.zeros(2000)
    for t, op in enumerate(ops):
        g = (rng.standard_normal(2000) * 1e-2).astype(np.float32)
        grad_sum += g
        piece = g.copy()
        carry.into("b0", piece, op)
        sent = _sent(piece, op)
        sent_sum += sent
        kept = carry.held.get("b0")
        if op.carry:       # what the wire holds plus what is kept is the piece
            assert np.array_equal(sent + kept, piece)
            assert not np.array_equal(sent, piece)          # it rounded
        else:
            assert kept is None and np.array_equal(sent, piece)
        left = np.zeros(2000) if kept is None else kept.astype(np.float64)
        # float32 additions of the carried error: within a few float32 steps
        assert np.allclose(sent_sum + left, grad_sum, rtol=0, atol=1e-7 * (t + 1))
    assert len(carry) == 0
    # the same gradients with no error feedback: rounded, nothing carried
    plain = Carry(keep=False)
    piece = (rng.standard_normal(2000)).astype(np.float32)
    before = piece.copy()
    plain.into("b0", piece, BF16)
    assert len(plain) == 0 and np.array_equal(piece, before)


def _answer(srv: ServerCodec, agg: np.ndarray, d: int) -> np.ndarray:
    """One bf16 step at the server: a round of agg's length decoded (so the
    answer is compressed), then its answer's aggregate as a worker decodes it."""
    n = len(agg)
    srv.open(d, n, reliable=False, wire="bf16")
    srv.decode(d, np.zeros((1, make_codec("bf16", CB).words(n)), np.float32), None, "mean")
    wire = srv.answer(agg.copy(), d=d)
    out = np.zeros((1, n), dtype=np.float32)
    make_codec("bf16", CB).decode(wire[None, :], n, out)
    return out[0]


@pytest.mark.unit
def test_the_server_carries_its_answers_rounding_only_while_the_ops_carry():
    rng = np.random.default_rng(3)
    aggs = [(rng.standard_normal(999) * 1e-3).astype(np.float32) for _ in range(3)]
    srv = ServerCodec(CB, error_feedback=False)     # compress auto's server
    srv.set_carry(True)
    first = _answer(srv, aggs[0], 1)
    kept = srv.residual[("bf16", 999)]
    assert np.array_equal(kept, aggs[0] - first) and kept.any()
    second = _answer(srv, aggs[1], 2)
    assert np.array_equal(second, torch.from_numpy(aggs[1] + aggs[0] - first)
                          .to(torch.bfloat16).float().numpy())
    srv.set_carry(False)          # float32 again: the rounding held is dropped
    assert srv.residual == {}
    plain = _answer(srv, aggs[2], 3)   # a 2-byte op with no carry (bf16 gradients)
    assert np.array_equal(plain, torch.from_numpy(aggs[2]).to(torch.bfloat16).float().numpy())
    assert srv.residual == {}
    ef = ServerCodec(CB, error_feedback=True)        # compress bf16's: its setting rules
    _answer(ef, aggs[0], 1)
    ef.set_carry(False)
    assert ("bf16", 999) in ef.residual
