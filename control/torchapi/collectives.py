# SPDX-License-Identifier: Apache-2.0
"""Operations besides the optimizer's steps, each reliable end to end:
`broadcast_parameters` (a root worker's tensors, bit for bit, to every worker),
`allreduce` (the mean or sum of a tensor over the workers, on the tensor's
device), `allgather` (every worker's tensor, bit for bit, in worker order),
`barrier`, and `digest` (a hash of a model's parameters, to compare replicas).

A broadcast packs the tensors' raw bytes, each at an 8-byte boundary, into
one float32 buffer: any dtype (float16, bfloat16, integer buffers such as
BatchNorm's counter) arrives unchanged, because the transport copies bytes
and never does arithmetic on them.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from ...errors import UsageError
from .job import current
from .ops import ALLGATHER, ALLREDUCE, BROADCAST, Op

ALIGN = 8


def _tensors(params) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs, sorted by name as Horovod does, from a state_dict,
    named_parameters() or a list of tensors."""
    if isinstance(params, dict):
        return sorted(params.items())
    items = list(params)
    if items and isinstance(items[0], tuple):
        return sorted(items)
    return [(str(i), t) for i, t in enumerate(items)]


def _layout(tensors: list[tuple[str, torch.Tensor]]) -> tuple[list[int], int]:
    offs, off = [], 0
    for _, t in tensors:
        offs.append(off)
        off += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    return offs, max(off, 4)


def broadcast_parameters(params, root_rank: int = 0) -> None:
    """Give every worker root_rank's values of `params` (model.state_dict(),
    model.named_parameters(), or a list of tensors), in place."""
    job = current()
    if job.is_server:
        raise UsageError("broadcast_parameters: this rank is a server")
    if not 0 <= root_rank < job.workers:
        raise UsageError(f"broadcast_parameters: root_rank must be a worker, 0..{job.workers - 1}, "
                         f"got {root_rank}")
    tensors = _tensors(params)
    offs, nbytes = _layout(tensors)
    buf = np.zeros(nbytes // 4, dtype=np.float32)
    raw = torch.from_numpy(buf.view(np.uint8))
    mine = job.rank == root_rank
    if mine:
        for (_, t), o in zip(tensors, offs):
            src = t.detach().contiguous().reshape(-1)
            raw[o:o + src.numel() * src.element_size()].copy_(src.view(torch.uint8))
    job.drain()
    answer = np.empty_like(buf)
    job.exchange.run(Op(BROADCAST, sizes=(buf.size,), root=root_rank,
                        downlink=job.s.downlink), [buf] if mine else None, answer)
    if mine:
        return
    got = torch.from_numpy(answer.view(np.uint8))
    with torch.no_grad():
        for (_, t), o in zip(tensors, offs):
            n = t.numel() * t.element_size()
            t.copy_(got[o:o + n].view(t.dtype).view(t.shape))


def allreduce(tensor: torch.Tensor, average: bool = True) -> torch.Tensor:
    """The mean (or, average=False, the sum) of `tensor` over the workers, as a
    new tensor of its dtype and shape (computed in float32 on the way and on
    the server, in one fixed order: control/transport/aggregate.py)."""
    job = current()
    if job.is_server:
        raise UsageError("allreduce: this rank is a server")
    t = torch.as_tensor(tensor)
    piece = t.detach().to("cpu", torch.float32, copy=True).reshape(-1).numpy()
    if piece.size == 0:
        return t.clone()
    job.drain()
    out = np.empty_like(piece)
    job.exchange.run(Op(ALLREDUCE, sizes=(piece.size,), average=average,
                        downlink=job.s.downlink), [piece], out)
    return torch.from_numpy(out).reshape(t.shape).to(t.device, t.dtype)


def allgather(tensor: torch.Tensor) -> torch.Tensor:
    """Every worker's `tensor` (the same shape and dtype on each), stacked in
    worker order: a new CPU tensor of shape (workers, *tensor.shape). Its
    bytes travel, so any dtype arrives unchanged. A worker the job went on
    without (absent) has zeros in its row."""
    job = current()
    if job.is_server:
        raise UsageError("allgather: this rank is a server")
    t = tensor.detach().to("cpu").contiguous()
    nbytes = t.numel() * t.element_size()
    n = max(1, -(-nbytes // 4))
    buf = np.zeros(n, dtype=np.float32)
    buf.view(np.uint8)[:nbytes] = t.reshape(-1).view(torch.uint8).numpy()
    job.drain()
    out = np.empty(job.workers * n, dtype=np.float32)
    job.exchange.run(Op(ALLGATHER, sizes=(n,), downlink=job.s.downlink), [buf], out)
    rows = torch.from_numpy(out.view(np.uint8).reshape(job.workers, 4 * n)[:, :nbytes].copy())
    return rows.view(t.dtype).reshape(job.workers, *t.shape)


def barrier() -> None:
    """Return once every worker present has called it."""
    allreduce(torch.zeros(1))


def digest(module_or_tensors) -> str:
    """sha256 (16 hex digits) of the parameters' bytes in order: equal digests
    mean bit-identical replicas."""
    ts = module_or_tensors.parameters() if hasattr(module_or_tensors, "parameters") \
        else module_or_tensors
    h = hashlib.sha256()
    for t in ts:
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
