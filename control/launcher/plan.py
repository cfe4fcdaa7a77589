# SPDX-License-Identifier: Apache-2.0
"""Which process of a job runs where: a `Rank` (its role, index, rig host,
and its place on its node, as torchrun numbers it) and `plan_ranks`, which
places a job's servers and workers on a rig's hosts (launch.py starts them).
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field

from . import forkserver


# a traceback's last line: "RuntimeError: ...", "torch.distributed.DistError: ..."
ERROR_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_]\w*\.)*[A-Z]\w*"
                        r"(?:Error|Exception|Interrupt|Exit)\b.*)$")


@dataclass
class Rank:
    """One process of the job."""

    rank: int
    role: str                   # server | worker
    index: int                  # among the servers, or the workers (lt.rank())
    host: object                # the rig host it runs on
    proc: subprocess.Popen | forkserver.ZygoteProc | None = None
    t0: float = 0.0
    wall_s: float | None = None
    code: int | None = None
    killed: bool = False
    last_json: dict | None = None
    last_error: str | None = None   # its last stderr line that names an exception
    bufs: dict = field(default_factory=dict)   # fd -> partial line
    settled: bool = False       # died, and the job goes on without it (restarts.py)
    starts: int = 0             # processes started for this rank
    forked: bool = False        # its process came from the fork server
    local: int = 0              # a worker's place among its host's workers (LOCAL_RANK)
    local_world: int = 1        # ... and how many its host has (LOCAL_WORLD_SIZE)
    node: int = 0               # a worker's host among the job's (GROUP_RANK)

    @property
    def label(self) -> str:
        return f"{'s' if self.role == 'server' else 'w'}{self.index}"

    @property
    def torch_rank(self) -> str:
        """The rank as its script knows it: a worker's torch rank (RANK), or
        the server's index."""
        return f"{'server' if self.role == 'server' else 'rank'} {self.index}"

    def heard(self, stream: str, text: str) -> None:
        """Keep a stderr line that names an exception (its last one is the
        error a failure summary shows), torch's [rankN]: prefix cut."""
        m = ERROR_LINE.match(text) if stream == "stderr" else None
        if m:
            self.last_error = m.group(1)


def plan_ranks(rig, workers: int, servers: int = 1, colocate: bool = False,
               per_node: int = 1) -> list[Rank]:
    """Servers on the rig's server hosts (several servers need as many:
    each a host of its own), then the workers, `per_node` to a worker host
    in order (worker k on host k // per_node). `colocate`: no server hosts;
    server i runs on worker i's host, beside it.

    On a rig with nodes (`ltp rig up --nodes`), every rank has a host of its
    own and the rig says which node it is on: worker k on worker host k,
    server i (`colocate`: the rig's server i, on worker i's node) or the
    dedicated servers as above; LOCAL_RANK counts a node's workers."""
    if getattr(getattr(rig, "config", None), "nodes", 0):
        return _plan_on_nodes(rig, workers, servers, colocate)
    if per_node < 1 or workers % per_node:
        raise ValueError(f"ranks_per_node: {workers} workers do not fill hosts of "
                         f"{per_node} rank(s) each")
    if not 1 <= workers // per_node <= len(rig.workers):
        raise ValueError(f"workers: rig {rig.name} has {len(rig.workers)} workers, asked "
                         f"for {workers // per_node}" + (f" hosts of {per_node} rank(s)"
                                                         if per_node > 1 else ""))
    trainers = [Rank(servers + k, "worker", k, rig.workers[k // per_node], local=k % per_node,
                     local_world=per_node, node=k // per_node) for k in range(workers)]
    if colocate:
        if not 1 <= servers <= workers:
            raise ValueError(f"servers: co-located servers run beside workers, 1..{workers} "
                             f"of them, asked for {servers}")
        return [Rank(i, "server", i, trainers[i].host, node=trainers[i].node)
                for i in range(servers)] + trainers
    hosts = getattr(rig, "servers", [rig.ps])
    if servers > 1 and len(hosts) < servers:
        raise ValueError(f"servers: rig {rig.name} has {len(hosts)} server host(s), asked "
                         f"for {servers} (`ltp rig up --servers {servers}`)")
    return [Rank(i, "server", i, hosts[i] if servers > 1 else rig.ps)
            for i in range(servers)] + trainers


def _plan_on_nodes(rig, workers: int, servers: int, colocate: bool) -> list[Rank]:
    """plan_ranks on a rig whose hosts are grouped into nodes."""
    c = rig.config
    if workers != c.workers:
        raise ValueError(f"workers: rig {rig.name} has {c.nodes} nodes of "
                         f"{c.workers // c.nodes} workers; a job on it takes all {c.workers}")
    if colocate and not c.colocate:
        raise ValueError(f"colocate: rig {rig.name} has no server beside each worker "
                         "(`ltp rig up --nodes K --servers W --colocate` builds one)")
    if colocate and servers != workers:
        raise ValueError(f"servers: co-located servers are one beside each of the {workers} "
                         f"workers, asked for {servers}")
    trainers = [Rank(servers + k, "worker", k, h) for k, h in enumerate(rig.workers)]
    placed: list[Rank] = []
    if colocate or servers > 1:
        if len(rig.servers) < servers:
            raise ValueError(f"servers: rig {rig.name} has {len(rig.servers)} server host(s), "
                             f"asked for {servers} (`ltp rig up --servers {servers}`)")
        placed = [Rank(i, "server", i, rig.servers[i]) for i in range(servers)]
    else:
        placed = [Rank(0, "server", 0, rig.ps)] if servers else []
    for r in placed + trainers:
        k = c.node_of(r.host)
        r.node = -1 if k is None else k       # -1: a dedicated server's own link
    for r in trainers:
        mates = [t for t in trainers if t.node == r.node]
        r.local, r.local_world = mates.index(r), len(mates)
    return placed + trainers
