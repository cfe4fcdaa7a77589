# SPDX-License-Identifier: Apache-2.0
"""A bucket's trip through host memory (control/torchapi/staging.py), on
the CPU (the GPU's copies are checked by tests/gpu): down, a 2-byte tensor
whose op travels in its own dtype is staged as its bits, which the worker's
codec puts on the wire as they are (what encoding its float32 copy gives);
back, the answer times the scale lands in the tensor's own memory, whatever
its strides and dtype, rounded once to that dtype, bit for bit what float32
arithmetic and one conversion give; the answers' buffer is one, grown and
reused."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ltpx.control.torchapi.codec import WorkerCodec, staged_as_bits
from ltpx.control.torchapi.staging import Staging

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", [1.0, 2.0, 3.0])
def test_the_answer_times_the_scale_is_rounded_once_into_the_tensors_memory(dtype, scale):
    g = torch.Generator().manual_seed(7)
    answer = torch.randn(48 * 32, generator=g) * 1e3
    want = (answer * scale).to(dtype)                   # float32 product, one rounding
    base = torch.full((32, 48), -1.0, dtype=dtype)
    t = base.t()                                        # not contiguous: written through its strides
    before = base.data_ptr()
    Staging().up(answer.clone(), t, scale)
    assert base.data_ptr() == before
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(t.contiguous().view(bits), want.view(48, 32).view(bits))


def test_the_answers_buffer_is_one_grown_and_reused():
    s = Staging()
    a = s.answer(1000, False)
    b = s.answer(600, False)
    assert b.data_ptr() == a.data_ptr() and b.numel() == 600 and b.dtype == torch.float32
    c = s.answer(5000, False)
    assert c.numel() == 5000 and s.answer(10, False).data_ptr() == c.data_ptr()


@pytest.mark.parametrize("dtype,wire", [(torch.bfloat16, "bf16"), (torch.float16, "fp16")])
@pytest.mark.parametrize("n", [1, 357, 1000])
def test_a_two_byte_tensor_staged_as_its_bits_goes_on_the_wire_as_its_float32_copy_would(
        dtype, wire, n):
    g = torch.Generator().manual_seed(n)
    t = (torch.randn(n, generator=g) * 100).to(dtype)
    s = Staging()
    bits = s.host("b", n, t.device, torch.int16)
    assert s.down(t, bits) is None and bits.dtype == torch.int16
    assert torch.equal(bits, t.view(torch.int16))       # the bits, as they are
    f32 = s.host("f", n, t.device)
    s.down(t, f32)
    codec = WorkerCodec(1432, keep_error=False)
    want = codec.piece(f32.numpy(), wire).copy()        # the float32 copy, encoded
    got = WorkerCodec(1432, keep_error=False).piece(bits.numpy(), wire)
    assert got.dtype == np.float32 and np.array_equal(got.view(np.int32), want.view(np.int32))
    assert s.host("b", n, t.device, torch.int16).data_ptr() == bits.data_ptr()   # kept
    assert s.host("b", n, t.device).dtype == torch.float32   # another dtype: a new buffer


@pytest.mark.parametrize("wire", ["none", "uint8"])
def test_a_pieces_bits_on_a_wire_not_of_two_bytes_is_refused(wire):
    with pytest.raises(ValueError, match="2-byte wire"):
        WorkerCodec(1432).piece(np.zeros(10, np.int16), wire)


def test_a_tensor_is_staged_as_its_bits_only_where_its_op_goes_in_its_dtype():
    bf16, fp16, f32 = torch.bfloat16, torch.float16, torch.float32
    assert staged_as_bits(bf16, "auto", False) and staged_as_bits(fp16, "auto", False)
    assert staged_as_bits(bf16, "bf16", False) and not staged_as_bits(fp16, "bf16", False)
    assert not staged_as_bits(f32, "auto", False) and not staged_as_bits(f32, "bf16", False)
    assert not staged_as_bits(bf16, "none", False) and not staged_as_bits(bf16, "uint8", False)
    assert not staged_as_bits(bf16, "auto", True)        # deferred answers: float32
    # its op took float32 the step before (float32 buckets beside it): float32
    assert not staged_as_bits(bf16, "auto", False, last="none")
    assert staged_as_bits(bf16, "auto", False, last="bf16")
