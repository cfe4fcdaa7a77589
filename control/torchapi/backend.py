# SPDX-License-Identifier: Apache-2.0
"""The torch.distributed backend `ltp`: `dist.init_process_group("ltp")`.

`import ltpx.torch` registers it. A stock DDP script then changes one
string, and DDP's gradient buckets go over LTP (Early Close, Bubble
Filling) while every other collective stays exact:

  tolerant  an all-reduce (SUM or AVG) of one floating tensor issued while
            autograd runs backward on the default group: what DDP's reducer
            sends for a bucket (its own hook, or none). The rule is the
            `tolerant` setting (LTP_TOLERANT): `backward` (the default;
            a blocking call (async_op=False), e.g. SyncBatchNorm's
            statistics in backward, stays exact),
            `hook` (only buckets sent through `ltpx.torch.ddp_hook`) or
            `never`.
  native    broadcast, every other all_reduce, all_gather (and object
            collectives over it), all_gather_into_tensor, reduce_scatter_tensor
            (tolerant in backward: FSDP2's gradients) and barrier: ops of
            the LTP job over its reliable class (native.py says how each
            goes, and what stays on gloo)
  exact     the rest (gather, scatter, reduce, all-to-all, coalesced forms,
            PREMUL_SUM, an exact call while DDP's buckets are in flight): a
            gloo process group on the same store, made at its first use, so
            a job that needs none never opens its connections.

The ranks torch counts (RANK, WORLD_SIZE) are trainers only, as under
torchrun. The parameter server(s) are ranks of the LTP job only: `ltp launch`
starts them (LTP_ROLE=server, LTP_RANK, LTP_WORLD_SIZE), and a server rank
that reaches `init_process_group("ltp")` serves there and exits, as in
`lt.init()`. Without the launcher the job has no server ranks by default:
where no variable names one (LTP_SERVERS, LTP_RANK, LTP_ROLE,
LTP_WORLD_SIZE) and LTP_COLOCATE is unset, trainer r of N starts server r
of N itself and sums slice r of every bucket (colocate.py), so torchrun
alone runs a job. With LTP_SERVERS=S on every rank, trainer r is LTP rank
S + r, and each server is started with LTP_ROLE=server and LTP_RANK set
(docs/deploy.md).

A subgroup (`dist.new_group`) is exact only: its collectives go through
gloo, and DDP over a subgroup runs without loss tolerance (a warning says so).
send/recv and the other point-to-point calls are not supported.
"""
from __future__ import annotations

import collections
import logging
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo, _create_work_from_future

from ...errors import UsageError
from .. import settings_table
from .native import done, reducible
from .native import allgather as ltp_allgather, all_gather_single as ltp_all_gather_single
from .native import allreduce as ltp_allreduce, barrier as ltp_barrier
from .native import broadcast as ltp_broadcast, reduce_scatter as ltp_reduce_scatter
from .ddp import tolerant_reduce, tolerant_rule
from .colocate import by_default_refused, chosen as colocate_chosen
from .colocate import place as colocated_place
from .job import current, init, joined, serve_here, shutdown

log = logging.getLogger("ltpx.torch.backend")

# the collectives handed to the exact group as they are
EXACT = ("allgather_coalesced", "reduce_scatter", "allreduce_coalesced", "gather", "scatter",
         "reduce", "alltoall", "alltoall_base", "all_to_all_single", "monitored_barrier")
# the coalesced forms of a native call: the call on each (output, input) pair in turn
COALESCED = {"all_gather_single_coalesced": "all_gather_single",
             "allgather_into_tensor_coalesced": "all_gather_single",
             "reduce_scatter_single_coalesced": "reduce_scatter_single",
             "reduce_scatter_tensor_coalesced": "reduce_scatter_single"}
NAME = "ltp"   # the backend's name (torchplugin.NAME says it to torch at torch's import)
UNSUPPORTED = ("send", "recv", "recv_anysource")
EXACT_KEYS = "ltp-exact/"    # the exact group's keys of the store
_stores: list = []      # the exact groups' stores (SealedStore: Python objects torch holds)
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class SealedStore(dist.Store):
    """The exact group's keys of the store, its values sealed as the job's
    are (`seal`, the job's sealed.Seal: signed by the rank that writes them,
    over the run's id, and checked when read): whoever reaches the store
    without a key of this job cannot hand gloo an address or a value, nor
    replay an earlier run's (StoreValueError names the key). Any trainer
    may write them, as gloo's ranks do; counters (add) carry no signature."""

    def __init__(self, inner, seal):
        super().__init__()
        self.inner, self.seal = inner, seal

    def set(self, key: str, value) -> None:
        self.inner.set(key, self.seal.seal(EXACT_KEYS + key, bytes(value)))

    def get(self, key: str) -> bytes:
        return self.seal.open(EXACT_KEYS + key, self.inner.get(key))

    def add(self, key: str, n: int) -> int:
        return self.inner.add(key, n)

    def check(self, keys) -> bool:
        return self.inner.check(keys)

    def wait(self, keys, timeout: timedelta | None = None) -> None:
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def delete_key(self, key: str) -> bool:
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        return self.inner.num_keys()

    def set_timeout(self, timeout: timedelta) -> None:
        self.inner.set_timeout(timeout)


def exact_group(store, rank: int, size: int, timeout: timedelta,
                seal=None) -> dist.ProcessGroup:
    """A gloo process group of the same ranks, on its own keys of the store
    (CPU tensors, and CUDA tensors where gloo was built with CUDA), their
    values sealed with `seal` (SealedStore) where one is given."""
    st = dist.PrefixStore(EXACT_KEYS, store)
    if seal is not None:
        st = SealedStore(st, seal)
    pg = dist.ProcessGroup(st, rank, size)
    pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    gloo = ProcessGroupGloo(st, rank, size, timeout)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for d in devices:
        pg._register_backend(torch.device(d), dist.ProcessGroup.BackendType.GLOO, gloo)
    _stores.append(st)     # a Python store lives as long as the process's groups may use it
    return pg


class LtpProcessGroup(dist.ProcessGroup):
    """See the module docstring. `reduce` is the job's ddp.TolerantReduce
    (None: an exact-only group)."""

    def __init__(self, make_exact, rank: int, size: int, reduce=None,
                 rule: str = "never"):
        super().__init__(rank, size)
        self.make_exact, self.reduce, self.rule = make_exact, reduce, rule
        self._exact: dist.ProcessGroup | None = None
        self.routes: collections.Counter = collections.Counter()   # "call way" -> calls
        self.warned = False
        self.key = (-1, 0)     # (graph task, buckets of it so far): a bucket's position

    @property
    def exact(self) -> dist.ProcessGroup:
        """The gloo group, made at its first use (every rank reaches the
        same call the same way: native.py)."""
        if self._exact is None:
            self._exact = self.make_exact()
        return self._exact

    def native(self, call: str) -> bool:
        """Whether an exact collective goes over LTP (native.py): on the
        default group, not between DDP's buckets in backward; never under
        LTP_TOLERANT=never (everything gloo's: the check that LTP is not what
        changed a result). Counted in `routes`."""
        task = torch._C._current_graph_task_id()
        ok = self.reduce is not None and self.rule != "never" and \
            not (task != -1 and self.key[0] == task)
        self.routes[f"{call} {'ltp' if ok else 'gloo'}"] += 1
        return ok

    def getBackendName(self) -> str:
        return NAME

    # torch keeps a group's name and description on its backends, and a group
    # made in Python has none: they are kept here (DeviceMesh, and FSDP2
    # through it, look the group up by its name)
    _name = _desc = ""

    def _set_group_name(self, name: str) -> None:
        self._name = name

    def getGroupName(self) -> str:
        return self._name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    def getGroupDesc(self) -> str:
        return self._desc

    def tolerant(self, tensors, opts) -> bool:
        if self.rule != "backward" or len(tensors) != 1 or tensors[0].dtype not in FLOATS:
            return False
        opts = opts if opts is not None else dist.AllreduceOptions()
        op = opts.reduceOp.op
        if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            return False
        # DDP's reducer calls from C++ with torch's default options, an
        # asynchronous call; a blocking one (torch.distributed's Python API
        # with async_op=False: SyncBatchNorm's statistics in backward, FSDP
        # NO_SHARD's reduce) stays exact, so its wait never joins a step op
        # that waits for DDP's later buckets
        if torch._C._current_graph_task_id() == -1 or not opts.asyncOp:
            return False
        if self.reduce is None:
            if not self.warned:
                self.warned = True
                log.warning("ltpx.torch: DDP over a subgroup runs exact (gloo): only the "
                            "default group of the `ltp` backend is loss-tolerant")
            return False
        return True

    def allreduce(self, tensors, opts=None):
        if not isinstance(tensors, list):
            tensors = [tensors]
        if opts is None:
            opts = dist.AllreduceOptions()
        op = opts.reduceOp.op
        if self.tolerant(tensors, opts):
            return self.tolerant_allreduce(tensors[0], op)
        if op == dist.ReduceOp.AVG and any(t.dtype == torch.bool for t in tensors):
            raise UsageError("ltp backend: ReduceOp.AVG of a bool tensor has no meaning; "
                             "use SUM (a count), MAX (any) or MIN (all)")
        if reducible(op) and self.native("allreduce"):
            return _work(ltp_allreduce(tensors, op))
        if op == dist.ReduceOp.AVG:
            return self.exact_average(tensors, opts)
        return self.exact.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        if not isinstance(tensors, list):
            tensors = [tensors]
        root = opts.rootRank if opts is not None else 0
        if self.native("broadcast"):
            return _work(ltp_broadcast(tensors, root))
        return self.exact.broadcast(tensors, opts or dist.BroadcastOptions())

    def allgather(self, outputs, inputs, opts=None):
        if self.native("allgather"):
            return _work(ltp_allgather(outputs, inputs))
        return self.exact.allgather(outputs, inputs, opts or dist.AllgatherOptions())

    def all_gather_single(self, output, t, opts=None):
        if self.native("all_gather_single"):
            return _work(ltp_all_gather_single(output, t))
        return self.exact.all_gather_single(output, t, opts or dist.AllgatherOptions())

    def reduce_scatter_single(self, output, t, opts=None):
        """FSDP2's gradients (a float SUM or AVG in backward) loss-tolerant,
        every other exact; then this rank's slice."""
        op = opts.reduceOp.op if opts is not None else dist.ReduceOp.SUM
        if not (reducible(op) and
                self.native("reduce_scatter_single")):
            return self.exact.reduce_scatter_single(output, t,
                                                    opts or dist.ReduceScatterOptions())
        tolerant = self.rule == "backward" and t.dtype in FLOATS and \
            op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG) and \
            torch._C._current_graph_task_id() != -1
        if tolerant:
            self.routes["reduce_scatter_single tolerant"] += 1
        return _work(ltp_reduce_scatter(output, t, op, self.rank(),
                                           self.reduce if tolerant else None))

    def barrier(self, opts=None):
        if self.native("barrier"):
            return _work(ltp_barrier())
        return self.exact.barrier(opts or dist.BarrierOptions())

    def tolerant_allreduce(self, t: torch.Tensor, op):
        task = torch._C._current_graph_task_id()
        n = self.key[1] + 1 if self.key[0] == task else 0
        self.key = (task, n)
        self.routes["allreduce tolerant"] += 1
        # DDP divided the bucket by the world size and asks for the SUM: the
        # mean over the workers, times the world size, is that sum
        scale = 1.0 if op == dist.ReduceOp.AVG else float(self.size())
        fut = self.reduce.mean(t, key=n, scale=scale)
        return _create_work_from_future(fut.then(lambda f: [f.value()]))

    def exact_average(self, tensors, opts):
        """AVG: gloo's SUM, divided by the size; an integer tensor's quotient
        truncated toward zero, as NCCL's average of integers (Lightning
        averages its integer batch counts so)."""
        sum_opts = dist.AllreduceOptions()
        sum_opts.reduceOp = dist.ReduceOp.SUM
        sum_opts.timeout = opts.timeout
        size = self.size()

        def divide(f):
            for t in tensors:
                if t.is_floating_point() or t.is_complex():
                    t.div_(size)
                else:
                    t.div_(size, rounding_mode="trunc")
            return tensors
        return _create_work_from_future(
            self.exact.allreduce(tensors, sum_opts).get_future().then(divide))

    def shutdown(self) -> None:
        """destroy_process_group(): the LTP job's goodbye (default group), then gloo's."""
        global _groups
        try:
            if self.reduce is not None:
                _groups = 0          # a later init_process_group("ltp") is a default group again
                shutdown()
        finally:
            if self._exact is not None:
                self._exact.shutdown()


def _work(fut):
    return _create_work_from_future(fut)


def _delegate(name: str):
    def call(self, *args, **kwargs):
        self.routes[f"{name} gloo"] += 1
        return getattr(self.exact, name)(*args, **kwargs)
    call.__name__ = name
    call.__doc__ = f"{name}: exact, through the gloo group."
    return call


def _coalesced(name: str, single: str):
    def call(self, outputs, inputs, opts=None):
        for o, t in zip(outputs, inputs):
            getattr(self, single)(o, t, opts).wait()
        return _work(done(list(outputs)))
    call.__name__ = name
    call.__doc__ = f"{name}: {single} on each pair."
    return call


def _refuse(name: str):
    def call(self, *args, **kwargs):
        raise UsageError(f"ltp backend: {name} is not supported (collectives only); use a "
                         "gloo group for point-to-point: dist.new_group(backend='gloo')")
    call.__name__ = name
    return call


for _n in EXACT:
    setattr(LtpProcessGroup, _n, _delegate(_n))
for _n, _single in COALESCED.items():
    setattr(LtpProcessGroup, _n, _coalesced(_n, _single))
for _n in UNSUPPORTED:
    setattr(LtpProcessGroup, _n, _refuse(_n))


def ltp_place(rank: int, size: int) -> tuple[int, int, bool, bool]:
    """(LTP rank, LTP world, is a server, co-located) of a process torch
    numbers rank of size: co-located where LTP_COLOCATE=1, or by default
    where no variable names a server rank (colocate.chosen)."""
    colocated, _ = colocate_chosen()
    if colocated:    # no server ranks: each trainer serves (colocate.py)
        if settings_table.env("role") == "server":
            raise UsageError("LTP_ROLE=server with LTP_COLOCATE=1: a co-located job has no "
                             "server ranks (each trainer serves a slice); start the trainers only")
        return (*colocated_place(rank, size), False, True)
    servers = settings_table.env("servers")
    lr = settings_table.env("rank")
    if lr is not None:
        lw = settings_table.env("world_size") or 0
        if lw != servers + size:
            raise UsageError(f"LTP_WORLD_SIZE={lw}, but LTP_SERVERS={servers} and WORLD_SIZE="
                             f"{size}: the LTP job has the servers plus the trainers")
    else:
        lr, lw = servers + rank, servers + size
    server = settings_table.env("role") == "server"
    if server != (lr < servers):
        raise UsageError(f"LTP_RANK={lr} with LTP_SERVERS={servers}: LTP ranks below "
                         f"{servers} are servers, and only they have LTP_ROLE=server")
    return lr, lw, server, False


def join(place: tuple[int, int], colocated: bool) -> None:
    """init() at `place`. A refusal to co-locate (colocate.settle) in a job
    co-located by default says why it was and how to have server ranks."""
    _, by_default = colocate_chosen()
    try:
        init(place=place, serve=False, colocate=colocated)
    except UsageError as e:
        if not by_default or "colocate" not in str(e):
            raise
        raise by_default_refused(e) from None


_groups = 0


def create(store, rank: int, size: int, timeout: timedelta) -> dist.ProcessGroup:
    """The backend's creator: torch calls it for init_process_group("ltp") and
    for every new_group(backend="ltp")."""
    global _groups
    _groups += 1
    if _groups > 1:    # a subgroup: exact only
        seal = current().coord.seal
        return LtpProcessGroup(lambda: exact_group(store, rank, size, timeout, seal), rank, size)
    rule = tolerant_rule()
    lr, lw, _, colocated = ltp_place(rank, size)
    if joined() is None:
        join((lr, lw), colocated)
    job = current()
    if job.is_server:
        serve_and_exit()
    seal = job.coord.seal
    return LtpProcessGroup(lambda: exact_group(store, rank, size, timeout, seal), rank, size,
                           tolerant_reduce(), rule)


def serve_and_exit() -> None:
    """A server rank serves here and ends its process when the job ends. It
    skips the interpreter's teardown: torch's C++ teardown of a store whose
    host has gone can abort a finished process (exit -6), and a server has
    nothing of the script's to clean up."""
    code = serve_here()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def register() -> None:
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, create, devices=["cpu", "cuda"])
