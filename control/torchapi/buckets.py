# SPDX-License-Identifier: Apache-2.0
"""Gradient buckets: which parameters go up together, and copying gradients in and out.

As DistributedDataParallel does, parameters are taken in reverse
registration order (backward produces the last layers' gradients first) and
packed whole into buckets: a bucket is closed once it holds `cap` elements or
more (so a layer's bias and weight stay together, and a parameter larger than
the cap ends a bucket). Bucket 0 is pushed first. The flat vector of
a step is the buckets one after another, each float32, whatever the
parameters' own dtype (float16 and bfloat16 convert exactly to float32, and
the aggregate converts back the same way on every worker).

A parameter whose .grad is None in a step contributes zeros, as Horovod's
does, and afterwards its .grad is the aggregate like every other's.

Parameters on a GPU: the flat vectors are pinned host memory; a bucket's
gradients go down with copies queued on their stream (an event says when the
bucket may be sent) and its part of the aggregate comes back in one copy per
device, each .grad a view of it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...errors import UsageError


@dataclass
class Bucket:
    index: int
    params: list[torch.Tensor] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)   # [lo, hi) in the flat vector
    lo: int = 0
    hi: int = 0

    @property
    def numel(self) -> int:
        return self.hi - self.lo

    def pack(self, flat: torch.Tensor, add: bool = False):
        """Copy (or add) this bucket's gradients into flat[lo:hi] as float32.
        A CUDA gradient's copy is queued on its stream (into pinned memory it
        runs while the caller goes on): the returned CUDA event says when
        flat[lo:hi] is whole; None when every copy is done on return."""
        dev = None
        for p, (a, b), name in zip(self.params, self.spans, self.names):
            g = p.grad
            if g is None:
                if not add:
                    flat[a:b].zero_()
                continue
            if g.is_sparse:
                raise UsageError(f"parameter {name}: sparse gradients are not supported "
                                 "(use a dense embedding)")
            src = g.detach().reshape(-1)
            if add:
                flat[a:b].add_(src.to(flat.device))
            elif src.device.type == "cuda":
                flat[a:b].copy_(src, non_blocking=True)
                dev = src.device
            else:
                flat[a:b].copy_(src)
        if dev is None:
            return None
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(dev))
        return ev

    def apply(self, agg: torch.Tensor) -> set:
        """Make each parameter's .grad the aggregate. A float32 parameter's .grad
        becomes a view of `agg` (no copy) or, on another device, of one copy
        of the bucket's part there; others get a converted copy. Returns the
        devices copied to (their streams hold copies from `agg`)."""
        moved: dict = {}
        for p, (a, b) in zip(self.params, self.spans):
            src = agg[a:b]
            if p.device != agg.device:
                there = moved.get(p.device)
                if there is None:   # one copy per device, from pinned memory: queued
                    there = moved[p.device] = agg[self.lo:self.hi].to(p.device, non_blocking=True)
                src = there[a - self.lo:b - self.lo]
            src = src.view(p.shape)
            if p.dtype == torch.float32:
                p.grad = src
            elif p.grad is not None and p.grad.dtype == p.dtype and p.grad.shape == p.shape:
                p.grad.copy_(src)
            else:
                p.grad = src.to(p.dtype)
        return set(moved)


class BucketPlan:
    """The buckets of one optimizer's parameters."""

    def __init__(self, named: list[tuple[str, torch.Tensor]], cap: int):
        if not named:
            raise UsageError("DistributedOptimizer: no parameters that require a gradient")
        self.buckets: list[Bucket] = []
        cur = Bucket(0)
        off = 0
        for name, p in reversed(named):
            n = p.numel()
            cur.params.append(p)
            cur.names.append(name)
            cur.spans.append((off, off + n))
            off += n
            cur.hi = off
            if cur.numel >= cap:
                self.buckets.append(cur)
                cur = Bucket(len(self.buckets), lo=off, hi=off)
        if cur.params:
            self.buckets.append(cur)
        self.numel = off
        self.of = {id(p): b.index for b in self.buckets for p in b.params}

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(b.numel for b in self.buckets)

    def __len__(self) -> int:
        return len(self.buckets)


def named_params(optimizer: torch.optim.Optimizer, named_parameters) -> list[tuple[str, torch.Tensor]]:
    """The optimizer's parameters that need a gradient, in registration order,
    each named (named_parameters, e.g. model.named_parameters(); without it
    they are named by position). UsageError for a parameter of the optimizer
    that named_parameters lacks, or a name used twice."""
    opt_params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    if named_parameters is None:
        return [(f"param.{i}", p) for i, p in enumerate(dict.fromkeys(opt_params))]
    named = list(named_parameters)
    names = [n for n, _ in named]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"DistributedOptimizer: parameter name {dup[0]!r} is used twice")
    ids = {id(p) for _, p in named}
    lacking = [p for p in opt_params if id(p) not in ids]
    if lacking:
        raise UsageError(f"DistributedOptimizer: {len(lacking)} of the optimizer's parameters "
                         "are not in named_parameters (pass model.named_parameters() of the "
                         "model the optimizer trains)")
    wanted = {id(p) for p in opt_params}
    seen: set[int] = set()
    out = []
    for n, p in named:   # a module shared twice names its parameters once
        if id(p) in wanted and id(p) not in seen:
            seen.add(id(p))
            out.append((n, p))
    return out
