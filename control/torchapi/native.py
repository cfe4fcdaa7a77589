# SPDX-License-Identifier: Apache-2.0
"""The `ltp` backend's collectives over LTP itself, not gloo (issue 41).

Each is an op of the job (ops.py) through the server, its uplink and its
answer over LTP's reliable class unless it says tolerant:

  broadcast               BROADCAST: the root's bytes, any dtype
  allreduce               SUM or AVG of float32, float16, bfloat16: ALLREDUCE,
                          summed on the server in float32 in one fixed order
                          (aggregate.py); every other dtype and SUM, AVG,
                          MIN, MAX, PRODUCT, BAND, BOR, BXOR: ALLGATHER, then
                          the same reduction on every rank in the tensor's own
                          dtype, rank by rank in order (exact for int64 and
                          float64, bit-identical everywhere)
  allgather,              ALLGATHER: every rank's bytes, in rank order
  all_gather_single
  reduce_scatter_single   in backward, a float SUM or AVG (FSDP2's gradients):
                          a tolerant step op of its own (ddp.TolerantReduce:
                          Early Close, Bubble Filling), then this rank's slice;
                          otherwise the exact all-reduce above, then its slice
  barrier                 an ALLREDUCE of one element
  their coalesced forms   the call on each pair in turn

What stays on gloo (the backend's `exact` group, made at its first use):
the other collectives (gather, scatter, reduce, all-to-all, a coalesced
all-reduce or list all-gather), PREMUL_SUM, a subgroup's, and every exact
collective issued in a backward pass while DDP's buckets are in flight (a
step op waits for the later buckets, and a blocking call between them would
wait for it). Which way a call goes depends only on what every rank sees
alike (its kind, dtype, op, the backward's buckets), never on the
data, so every rank takes the same way.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ...errors import CommError
from .collectives import allgather as gather_rows, allreduce as reduce_floats
from .collectives import barrier as ltp_barrier, broadcast_parameters
from .job import current

RO = dist.ReduceOp
HALVES = (torch.float32, torch.float16, torch.bfloat16)   # the server's float32 sum keeps them
LOCAL = {RO.SUM: torch.add, RO.AVG: torch.add, RO.MIN: torch.minimum, RO.MAX: torch.maximum,
         RO.PRODUCT: torch.mul, RO.BAND: torch.bitwise_and, RO.BOR: torch.bitwise_or,
         RO.BXOR: torch.bitwise_xor}


def _future(result):
    fut = torch.futures.Future()
    fut.set_result(result)
    return fut


def done(result):
    """A future of result, after the op's check: an exact collective the job
    went on without some worker (dead, or dropped) would be wrong without
    a word, so every rank raises instead, as gloo's would (a tolerant one
    goes on without it, as DDP's buckets do)."""
    gone = current().exchange.left_out()
    if gone:
        raise CommError(f"ltp backend: worker(s) {sorted(gone)} took no part in this "
                        "collective (dead, or dropped from the job): its result would "
                        "leave them out")
    return _future(result)


def reducible(op) -> bool:
    """An all-reduce op this module runs (PREMUL_SUM carries a factor it cannot read)."""
    return op in LOCAL


def allreduce(tensors: list[torch.Tensor], op) -> torch.futures.Future:
    """Each tensor reduced over the workers, in place."""
    for t in tensors:
        if op in (RO.SUM, RO.AVG) and t.dtype in HALVES:
            t.copy_(reduce_floats(t, average=op == RO.AVG))
        else:
            t.copy_(reduce_local(gather_rows(t), op))
    return done(tensors)


def reduce_local(rows: torch.Tensor, op) -> torch.Tensor:
    """rows [workers, ...] reduced over the first dimension in worker order
    (each rank computes the same bits); AVG of integers truncated toward
    zero, as NCCL's."""
    acc = rows[0].clone()
    f = LOCAL[op]
    for r in rows[1:]:
        acc = f(acc, r)
    if op == RO.AVG:
        if acc.is_floating_point() or acc.is_complex():
            acc = acc / rows.shape[0]
        else:
            acc = torch.div(acc, rows.shape[0], rounding_mode="trunc")
    return acc


def broadcast(tensors: list[torch.Tensor], root: int) -> torch.futures.Future:
    broadcast_parameters(tensors, root_rank=root)
    return done(tensors)


def allgather(outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor]):
    for outs, t in zip(outputs, inputs):
        rows = gather_rows(t)
        for o, r in zip(outs, rows):
            o.copy_(r)
    return done(outputs)


def all_gather_single(output: torch.Tensor, t: torch.Tensor):
    output.view(-1).copy_(gather_rows(t).view(-1))
    return done([output])


def reduce_scatter(output: torch.Tensor, t: torch.Tensor, op, rank: int, reduce=None):
    """output <- this rank's slice of t reduced over the workers: through
    `reduce` (ddp.TolerantReduce.alone: loss-tolerant) where given, else
    exact (`allreduce`)."""
    flat = t.detach().reshape(-1)
    n = output.numel()
    if reduce is not None:
        full = reduce.alone(flat, scale=1.0 if op == RO.AVG else float(current().workers))
        output.view(-1).copy_(full[rank * n:(rank + 1) * n])
        return _future([output])
    full = flat.clone()
    allreduce([full], op)           # checked there
    output.view(-1).copy_(full[rank * n:(rank + 1) * n])
    return _future([output])


def barrier():
    ltp_barrier()
    return done([])
