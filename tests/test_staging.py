# SPDX-License-Identifier: Apache-2.0
"""A bucket's trip back from the answer (control/torchapi/staging.py), on
the CPU (the GPU's copies are checked by tests/gpu): the answer times the
scale lands in the tensor's own memory, whatever its strides and dtype,
rounded once to that dtype, bit for bit what float32 arithmetic and one
conversion give; the answers' buffer is one, grown and reused."""
from __future__ import annotations

import pytest
import torch

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
