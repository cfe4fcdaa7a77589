# SPDX-License-Identifier: Apache-2.0
"""The built-in model: an MLP on the digits, its parameter count, digest and evaluation.

Its gradients travel through ltpx.torch's DistributedOptimizer (control/
torchapi), which copies them into its bucket buffers as backward produces them.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from .config import DEFAULT_HIDDEN
from .data import NCLASSES, NFEATURES


def build_mlp(hidden: tuple[int, ...] = DEFAULT_HIDDEN, seed: int = 0) -> torch.nn.Module:
    """64 -> hidden... -> 10 with ReLU; initial weights fixed by the seed."""
    g = torch.Generator().manual_seed(seed)
    layers: list[torch.nn.Module] = []
    d = NFEATURES
    for h in (*hidden, NCLASSES):
        lin = torch.nn.Linear(d, h)
        bound = 1.0 / d ** 0.5   # torch's default init, drawn from our generator
        with torch.no_grad():
            lin.weight.uniform_(-bound, bound, generator=g)
            lin.bias.uniform_(-bound, bound, generator=g)
        layers += [lin, torch.nn.ReLU()]
        d = h
    return torch.nn.Sequential(*layers[:-1])


def count_params(hidden: tuple[int, ...]) -> int:
    dims = (NFEATURES, *hidden, NCLASSES)
    return sum(a * b + b for a, b in zip(dims, dims[1:]))


def param_digest(buf: np.ndarray) -> str:
    """sha256 of a float32 buffer, 16 hex digits (enough to compare replicas)."""
    return hashlib.sha256(memoryview(np.ascontiguousarray(buf)).cast("B")).hexdigest()[:16]


def evaluate(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of `module` on (x, y)."""
    with torch.no_grad():
        out = module(x)
        loss = torch.nn.functional.cross_entropy(out, y).item()
        acc = (out.argmax(1) == y).float().mean().item()
    return acc, loss
