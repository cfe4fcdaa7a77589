# SPDX-License-Identifier: Apache-2.0
"""A tensor's trip through host memory for the links (ddp.py's buckets):
a float32 host copy of it to push (a bfloat16 or float16 tensor whose op
travels in its own dtype: its 2-byte bits as they are, int16 on the host,
so nothing is converted and half the bytes are copied), and the answer back
into its own memory.

On a GPU the host buffers are pinned and the copies are queued on a side
stream: the copy down after the work that produced the tensor (an event
says when it is done), the copies back from the answer's pinned buffer,
all of a step's queued before one wait, so they run at the copy engine's
rate. Copies from pageable memory (the answer's buffer before: 0.09 s a
step for a 538 MB gradient on an H200, docs/benchmarks.md) are synchronous
and staged by the driver. On the CPU the same calls are plain copies.
"""
from __future__ import annotations

import math

import torch


class Staging:
    """Float32 host buffers for one bucket position, and the copies to and from
    a tensor's device (CUDA: pinned memory, non_blocking on a side stream)."""

    def __init__(self):
        self.bufs: dict[int, torch.Tensor] = {}
        self.stream = None
        self.ans: torch.Tensor | None = None   # the answers' buffer (`answer`)
        self.ans_pinned = False
        self.queued = False                    # copies back queued on the side stream

    def host(self, key, n: int, device: torch.device,
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The host buffer of n elements for `key` (float32; torch.int16: a
        2-byte tensor's bits, `down` copies them as they are)."""
        t = self.bufs.get(key)
        if t is None or t.numel() != n or t.dtype != dtype:
            pin = device.type == "cuda"
            t = self.bufs[key] = torch.empty(n, dtype=dtype, pin_memory=pin)
        return t

    def side(self, device: torch.device):
        if self.stream is None:
            self.stream = torch.cuda.Stream(device=device)
        return self.stream

    def down(self, t: torch.Tensor, host: torch.Tensor):
        """Copy t into host; on CUDA the copy is queued after the work that
        produced t, and the returned event says when it is done."""
        flat = t.detach().reshape(-1)
        if host.dtype == torch.int16:    # the 2-byte bits as they are
            host = host.view(flat.dtype)
        if t.device.type != "cuda":
            host.copy_(flat)
            return None
        side = self.side(t.device)
        side.wait_stream(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(side):
            flat.record_stream(side)   # (a copy, when t is not contiguous)
            host.copy_(flat, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(side)
        return ev

    def answer(self, n: int, device: bool) -> torch.Tensor:
        """A float32 host buffer of n elements for an op's answer, grown as
        needed and reused (pinned once a bucket is on a GPU: its copies back
        are then queued and run at the copy engine's rate)."""
        pin = device or (self.ans is not None and self.ans_pinned)
        if self.ans is None or self.ans.numel() < n or pin != self.ans_pinned:
            self.ans = torch.empty(n, dtype=torch.float32, pin_memory=pin)
            self.ans_pinned = pin
        return self.ans[:n]

    def up(self, result: torch.Tensor, t: torch.Tensor, scale: float = 1.0) -> None:
        """The answer (float32, host: `result`, which it may scale in place)
        times scale into t's own memory (any strides, its dtype), rounded
        once to t's dtype. On the CPU it is done on return; on a GPU it is
        queued on the side stream (from `answer`'s pinned memory): `wait`
        says when every queued copy is done."""
        dst, src = t.detach(), result.view(t.shape)
        if scale != 1.0 and dst.dtype != torch.float32 and \
                (t.device.type != "cuda" or math.frexp(scale)[0] != 0.5):
            # scaled in float32, then rounded once: torch.mul(src, s, out=a
            # bfloat16 dst) takes 5x as long (80 against 16 ms for 17.9M
            # elements), and scaling after the rounding would round twice
            # (on a GPU, a power of two scales exactly: done there)
            src.mul_(scale)
            scale = 1.0
        if t.device.type != "cuda":
            if scale == 1.0:
                dst.copy_(src)
            else:       # no temporary: a 72 MB one cost 3x the copy (its pages, each step)
                torch.mul(src, scale, out=dst)
            return
        side = self.side(t.device)
        with torch.cuda.stream(side):   # non_blocking only from pinned memory
            dst.copy_(src, non_blocking=src.is_pinned())
            if scale != 1.0:
                dst.mul_(scale)
        self.queued = True

    def wait(self) -> None:
        """Every copy `up` queued is done (the answer's buffer may be reused,
        the tensors read on any stream)."""
        if self.queued:
            self.stream.synchronize()
            self.queued = False
