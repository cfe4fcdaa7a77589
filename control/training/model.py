"""The model and its flat view: parameters and gradients in one float32 buffer each.

`FlatModel` allocates two numpy float32 arrays (parameters, gradients) and
re-points every parameter's `.data` and `.grad` at a slice of them, so:
- backward() writes gradients straight into the flat gradient buffer (autograd
  accumulates in place into an existing .grad), which goes to the transport
  with no copy (a numpy view is what Endpoint.push and socket.sendmsg take);
- the optimizer updates parameters in place, inside the flat parameter buffer,
  which is what the parameter server broadcasts;
- a received parameter buffer is copied once into it (np.copyto).
Never call optimizer.zero_grad() on a FlatModel (set_to_none would detach
.grad from the buffer); use FlatModel.zero_grad().
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


class FlatModel:
    """A module whose parameters and gradients live in flat float32 buffers."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        params = list(module.parameters())
        self.n = sum(p.numel() for p in params)
        self.param_np = np.empty(self.n, dtype=np.float32)
        self.grad_np = np.zeros(self.n, dtype=np.float32)
        self.params = torch.from_numpy(self.param_np)   # shares memory
        self.grads = torch.from_numpy(self.grad_np)
        off = 0
        for p in params:
            k = p.numel()
            self.params[off:off + k].copy_(p.data.reshape(-1))
            p.data = self.params[off:off + k].view_as(p)
            p.grad = self.grads[off:off + k].view_as(p)
            off += k
        self._ptrs = [p.grad.data_ptr() for p in params]

    def zero_grad(self) -> None:
        self.grads.zero_()

    def check_views(self) -> None:
        """Raise if something replaced a .grad (the zero-copy contract broke)."""
        if [p.grad.data_ptr() if p.grad is not None else 0
                for p in self.module.parameters()] != self._ptrs:
            raise RuntimeError("a parameter's .grad no longer points into the flat buffer "
                               "(was optimizer.zero_grad() called?)")

    def load(self, flat: np.ndarray) -> None:
        np.copyto(self.param_np, flat)

    def digest(self) -> str:
        return param_digest(self.param_np)


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
