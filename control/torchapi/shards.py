# SPDX-License-Identifier: Apache-2.0
"""Sharded servers (BytePS's split): S server ranks, each summing a slice of every piece.

With `servers=S` (LTP_SERVERS) ranks 0..S-1 serve. Every piece of every op
(a step's bucket, a broadcast's buffer) is cut into S contiguous slices
balanced by bytes (`plan_slices`: sizes differ by at most one float32); server
i gets slice i of each, so every server sees every op, with the same op and
round numbers, and runs the ordinary server loop (server.py) unchanged: Early
Close and Bubble Filling per server, its answer over the reliable class.

Each server has its own coordination namespace (the store under prefix
"s<i>", so coord.py's keys never collide) and its own link. A worker holds S
links and S exchange.Exchange objects behind one `ShardedExchange`, which
looks like one Exchange to the optimizer and the collectives: it splits each
piece, pushes slice i to server i from shard i's own thread (all S at once),
pulls the S answers and joins them, with one StepReport merged from the S.
Replicas stay bit-identical: every worker joins the same S answers. Each shard
thread has a store client of its own (`shard_clients`).

A worker pushes to each server over the device its route there leaves by
(`route_to`). Over LTP the links of one device share its endpoint (one XDP
program owns a device): server s's rounds go on the wire as r·S + s, two
banks of the program each (transport/roundspace.py), so one device serves
any number of servers; a host with a device per server uses each.
The root store keeps every rank's meta and `user/...`; server summaries merge.
"""
from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
import torch.distributed as dist

from ...dataplane import netns
from ...errors import UsageError
from ..trust import jobkey
from .breakdown import worker as worker_phases
from .handoff import proc
from .coord import Coord
from .exchange import Arrival, Exchange
from .host import rank_host, route_to
from .localsock import here, on_host
from .link_ltp_worker import LtpWorkerLink, SharedDevice
from .link_tcp import TcpWorkerLink
from .links import WorkerLink
from .ops import ALLGATHER, SHUTDOWN, STEP, Op, StepReport
from .shardplan import merge_reports, merge_summaries, plan_slices, split_op
from .threads import CallThread


@dataclasses.dataclass
class ShardRun:
    """One op in flight on a sharded worker: the op, and each shard's Run."""

    op: Op
    runs: list                      # exchange.Run per shard
    slices: list[list[tuple[int, int]]]   # per piece: [lo, hi) per shard (of the padded piece)

    @property
    def seq(self) -> int:
        return self.runs[0].seq      # every shard numbers every op alike


class ShardCoord:
    """What the optimizer asks of `exchange.co` (wbsp), over every shard's Coord."""

    def __init__(self, coords: list[Coord]):
        self.coords = coords

    @property
    def view(self):
        """The membership (ops.Members) as shard 0's server reports it (every
        server drops a dead worker after the same missed steps)."""
        return self.coords[0].view

    def gone(self, s: int) -> bool:
        return all(c.gone(s) for c in self.coords)

    def set_k(self, s: int, w: int, k: int) -> None:
        for c in self.coords:
            c.set_k(s, w, k)


class ShardedExchange:
    """S exchanges (one per server) that look like one Exchange (exchange.py)."""

    def __init__(self, exchanges: list[Exchange], worker: int, workers: int):
        self.exs, self.id, self.workers = exchanges, worker, workers
        self.S = len(exchanges)
        self.co = ShardCoord([ex.co for ex in exchanges])
        self.threads = [CallThread(f"ltpx-shard{i}") for i in range(self.S)]
        self.answers: dict[int, list[np.ndarray]] = {}   # per shard: answer buffers by size
        self.barrier_s = 0.0
        self.barrier_seen: Arrival | None = None
        self.donations: dict = {}   # elastic.py's: rejoining is one-server only (see joining)

    # what else the job asks of its exchange (membership, the timeline, an
    # aside), as shard 0's Exchange has it: every server sees the same workers
    @property
    def lost(self) -> dict[int, int]:
        return self.exs[0].lost

    @property
    def dropped(self) -> dict[int, int]:
        return self.exs[0].dropped

    @property
    def rejoined(self) -> dict[int, int]:
        return self.exs[0].rejoined

    @property
    def timeline(self):
        return self.exs[0].timeline

    def set_aside(self, why: str) -> None:
        self.exs[0].set_aside(why)     # shard 0's record takes the own time (barrier)

    def left_out(self) -> set[int]:
        """Workers any server went on without (a worker that died between two
        servers' barriers is left out of one slice only)."""
        return set().union(*(ex.left_out() for ex in self.exs))

    @property
    def joining(self) -> bool:
        """A worker restarted into a running job (elastic.py) rejoins an
        unsharded one only: with several servers that is refused."""
        if any(getattr(ex, "joining", False) for ex in self.exs):
            raise UsageError("this worker started after the job began: rejoining is "
                             "supported with one server only (servers=1)")
        return False

    @property
    def times(self) -> dict:
        """Seconds at barriers, and the longest shard's pushing and pulling."""
        return {"barrier_s": self.barrier_s,
                "push_s": max(ex.times["push_s"] for ex in self.exs),
                "pull_s": max(ex.times["pull_s"] for ex in self.exs)}

    def plan(self, op: Op) -> ShardRun:
        subs, slices = split_op(op, self.S)
        return ShardRun(op, [ex.plan(sub) for ex, sub in zip(self.exs, subs)], slices)

    def prepare(self, run: ShardRun) -> None:
        # every link's endpoint first: links sharing a device share one, and
        # one made larger for a later shard drops what earlier shards opened
        for ex, r in zip(self.exs, run.runs):
            ex.link.ensure(r.op.max_elems(self.workers))
        for ex, r in zip(self.exs, run.runs):
            ex.prepare(r)

    def arrive(self, run: ShardRun) -> bool:
        last = [ex.arrive(r) for ex, r in zip(self.exs, run.runs)]
        return last[0]

    def barrier(self, run: ShardRun) -> None:
        """Arrive at every server's barrier, then wait for each to lift."""
        t0 = time.perf_counter()
        run.runs[0].rec.arrive_ns = int(t0 * 1e9)
        own, aside = self.exs[0].own(run.runs[0].rec)   # shard 0's answer: as late as any
        last = [ex.co.arrive(r.seq, r.op) for ex, r in zip(self.exs, run.runs)]
        t1 = time.perf_counter()
        for ex, r in zip(self.exs, run.runs):
            ex.co.wait_go(r.seq)
        t2 = time.perf_counter()
        self.barrier_s += t2 - t0
        worker_phases().add("comm_barrier", t2 - t0)
        self.barrier_seen = Arrival(run.runs[0].seq, t2 - t1, last[0], own, aside)
        run.runs[0].rec.lift_ns, run.runs[0].rec.last = int(t2 * 1e9), last[0]
        run.runs[0].rec.wait_ns = int((t2 - t1) * 1e9)

    def push(self, run: ShardRun, i: int, piece: np.ndarray) -> None:
        """Piece i: slice s to server s, from shard s's thread (returns at once;
        finish() waits). `piece` must not change before finish()."""
        sl = run.slices[i]
        if len(piece) < sl[-1][1]:     # shorter than the servers: padded with zeros
            padded = np.zeros(sl[-1][1], dtype=piece.dtype)
            padded[:len(piece)] = piece
            piece = padded
        for s, (ex, r) in enumerate(zip(self.exs, run.runs)):
            lo, hi = sl[s]
            self.threads[s].submit(ex.push, r, i, piece[lo:hi])

    def finish(self, run: ShardRun, out: np.ndarray) -> np.ndarray:
        """Every server's answer, joined into out[:down_elems] (returned): by
        links that scatter, each slice read straight into its place."""
        if run.op.kind != ALLGATHER and all(ex.link.scatters for ex in self.exs):
            return self.scatter(run, out)
        bufs = []
        for s, (ex, r) in enumerate(zip(self.exs, run.runs)):
            buf = self.buffer(s, r.op.down_elems(self.workers))
            bufs.append(buf)
            self.threads[s].submit(ex.finish, r, buf)
        self.wait()
        return self.join(run, bufs, out)

    def scatter(self, run: ShardRun, out: np.ndarray) -> np.ndarray:
        """finish() where every link `scatters`: server s's slice of piece i
        goes straight into out (a padded slice's tail into a scratch buffer);
        each server's report into a buffer of its own, then merged."""
        op, W = run.op, self.workers
        view, offs = out[:op.down_elems(W)], op.offsets()
        tails = []
        for s, (ex, r) in enumerate(zip(self.exs, run.runs)):
            parts = []
            for i, n in enumerate(op.sizes):
                lo, hi = run.slices[i][s]
                k = max(0, min(hi, n) - lo)
                if k:
                    parts.append(view[offs[i] + lo:offs[i] + lo + k])
                if hi - lo > k:
                    parts.append(self.buffer(-1 - s, hi - lo - k))   # padding
            tails.append(self.buffer(s, r.op.down_elems(W) - sum(r.op.sizes)))
            self.threads[s].submit(ex.finish, r, tails[s], [*parts, tails[s]])
        self.wait()
        if op.kind == STEP:
            merge_reports([StepReport.decode(t) for t in tails], W).encode(view[sum(op.sizes):])
        return view

    def buffer(self, s: int, n: int) -> np.ndarray:
        have = self.answers.setdefault(s, [])
        for b in have:
            if len(b) == n:
                return b
        b = np.empty(n, dtype=np.float32)
        have.append(b)
        return b

    def join(self, run: ShardRun, bufs: list[np.ndarray], out: np.ndarray) -> np.ndarray:
        op = run.op
        view = out[:op.down_elems(self.workers)]
        if op.kind == ALLGATHER:
            return self.join_rows(run, bufs, view)
        offs = op.offsets()
        sub_offs = [r.op.offsets() for r in run.runs]
        for i, n in enumerate(op.sizes):
            for s, (lo, hi) in enumerate(run.slices[i]):
                if lo >= n:
                    break                 # padding
                a = sub_offs[s][i]
                k = min(hi, n) - lo
                view[offs[i] + lo:offs[i] + lo + k] = bufs[s][a:a + k]
        if op.kind == STEP:
            total = sum(op.sizes)
            reps = [StepReport.decode(b[sum(r.op.sizes):]) for b, r in zip(bufs, run.runs)]
            merge_reports(reps, self.workers).encode(view[total:])
        return view

    def join_rows(self, run: ShardRun, bufs: list[np.ndarray], view: np.ndarray) -> np.ndarray:
        """An all-gather's answer: server s's holds slice s of every worker's
        row (a row per worker of its slice's width), put back into each row."""
        n, W = run.op.sizes[0], self.workers
        rows = view.reshape(W, n)
        for s, (lo, hi) in enumerate(run.slices[0]):
            if lo >= n:
                break                     # padding
            rows[:, lo:min(hi, n)] = bufs[s][:W * (hi - lo)].reshape(W, hi - lo)[:, :min(hi, n) - lo]
        return view

    def wait(self) -> None:
        errors = []
        for t in self.threads:
            try:
                t.drain()
            except BaseException as e:   # every shard drained before one error is raised
                errors.append(e)
        if errors:
            raise errors[0]

    # a whole op in the caller's thread: Exchange's, over the calls above
    run = Exchange.run

    def shutdown(self) -> dict:
        """Every server's last op; their summaries merged."""
        self.wait()
        runs = [ex.plan(Op(SHUTDOWN)) for ex in self.exs]
        for ex, r in zip(self.exs, runs):
            ex.co.arrive(r.seq, r.op)
        sums = [ex.co.get_json("fin") for ex in self.exs]
        self.close()
        return merge_summaries(sums)

    def close(self) -> None:
        for t in self.threads:
            t.close()
        self.threads = []


def _added(counters) -> dict:
    out: dict[str, int] = {}
    for c in counters:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


class ShardLinks:
    """A sharded worker's links, one per server, closed together (job.link):
    the parts and counters of links.WorkerLink."""

    def __init__(self, links: list[WorkerLink], devices: list | None = None):
        self.links = links
        self.devices = devices or []   # LTP: the endpoints the links share (SharedDevice)

    def parts(self) -> list[WorkerLink]:
        return list(self.links)

    @property
    def uplink(self) -> dict:
        """The links' push counters, added up (WorkerLink.uplink)."""
        return _added(link.uplink for link in self.links)

    @property
    def downlink(self) -> dict:
        """The links' answer counters, added up (WorkerLink.downlink)."""
        return _added(link.downlink for link in self.links)

    def close(self) -> None:
        for link in self.links:
            link.close()
        for device in self.devices:
            device.close()


def _store(store, i: int):
    return dist.PrefixStore(f"s{i}", store)


def worker_links(job, servers: list[dict]) -> tuple[list, list[tuple[str, str]]]:
    """One link per server, each on the device its route leaves by; over LTP
    the links of one device share its endpoint (link_ltp_worker.SharedDevice)."""
    s = job.s
    with netns.inside(s.netns if s.netns and s.netns != netns.current() else None):
        # over LTP a server in this process (colocate) or on this host is met
        # off the wire (link_ltp_near.py), on this rank's own device's endpoint
        # (its route would be the host's loopback)
        nets = [(s.dev, s.ip) if s.transport == "ltp" and on_host(m, rank_host(s.netns, s.node))
                else route_to(m["ip"]) for m in servers]
    links: list = []
    devices: dict[str, SharedDevice] = {}
    try:
        if s.transport == "ltp":
            secrets = [jobkey.token_secret(job.key, i, job.run) for i in range(len(servers))]
        for i, (dev, ip) in enumerate(nets):
            sub = dataclasses.replace(s, dev=dev, ip=ip)
            if s.transport == "tcp":
                links.append(TcpWorkerLink(sub, job.rank, job.workers,
                                           key=jobkey.hello_key(job.key, job.run)))
                continue
            if dev not in devices:
                devices[dev] = SharedDevice(sub, job.rank, job.workers, secrets, len(servers))
            links.append(LtpWorkerLink(sub, job.rank, job.workers, secret=secrets[i],
                                       device=devices[dev], shard=i,
                                       key=jobkey.hello_key(job.key, job.run)))
    except BaseException:
        ShardLinks(links, list(devices.values())).close()
        raise
    return links, nets, list(devices.values())


def shard_clients(store, n: int, store_netns: str | None = None) -> list:
    """A store client per shard thread (made as liveness.Beat's): one serves a call
    at a time, so shard i's blocking wait would hold up shard j's word to server
    j, which server j waits for (a deadlock with 3+ servers, seen on the rig)."""
    with netns.inside(store_netns):
        return [store.clone() for _ in range(n)]


def start_sharded(job) -> None:
    """job.Job.start for servers > 1 (after the rendezvous): coordination,
    links and, on a worker, the ShardedExchange."""
    s, S, W = job.s, job.s.servers, job.workers
    key = jobkey.store_auth(job.key, job.rank, job.run)   # one identity: what root learns, the shards know
    root = Coord(job.store, W, s.timeout, servers=S, key=key)
    me = {"rank": job.global_rank, "role": "server" if job.is_server else "worker",
          "ip": s.ip, "dev": s.dev, "host": rank_host(s.netns, s.node), "pid": os.getpid(),
          # a server in this process meets its worker in memory; over LTP one
          # on this host (and network namespace) by its Unix socket
          "proc": proc(), **here()}
    if job.is_server:
        i = job.global_rank
        job.coord = Coord(_store(job.store, i), W, s.timeout, key=key, scope=f"s{i}")
        # heartbeats in the root's store, by job-wide rank (liveness.py): the
        # op barrier goes on without a dead worker
        job.coord.start_liveness(i, s.store_netns, beats=job.store, server=i, servers=S)
        job.link = job.make_link(shard=i)
        root.set_json(f"meta/{i}", {**me, "shard": i, **job.link.address(),
                                    **root.directory()})
        metas = root.metas(range(job.world))
        job.local_rank = 0
        job.link.connect({w: dict(metas[S + w], ip=metas[S + w]["shard_ips"][i])
                          for w in range(W)})
        return
    job.coord = root
    root.start_liveness(job.global_rank, s.store_netns)    # watches every server's beat
    servers = root.metas(range(S))
    links, nets, devices = worker_links(job, servers)
    job.link = ShardLinks(links, devices)
    root.set_json(f"meta/{job.global_rank}", {**me, "ltp_port": s.udp_port, "shared": s.share_dev,
                                              "shard_ips": [ip for _, ip in nets],
                                              "shard_devs": [d for d, _ in nets]})
    metas = root.metas(range(job.world))
    job.local_rank = job.local_index(metas)
    for link, m in zip(links, servers):
        link.connect(m)
    clients = shard_clients(job.store, len(links), s.store_netns)
    coords = [Coord(_store(clients[i], i), W, s.timeout, key=key, scope=f"s{i}")
              for i in range(len(links))]
    for i, co in enumerate(coords):    # shard i's waits give up once server i stops beating
        co.start_liveness(None, beats=clients[i], server=i, servers=S)
    job.exchange = ShardedExchange([Exchange(link, co, job.rank, W)
                                    for link, co in zip(links, coords)], job.rank, W)
    root.on_server_dead = lambda i: job.exchange.exs[i].server_dead()


__all__ = ["plan_slices", "split_op", "merge_reports", "merge_summaries", "ShardedExchange",
           "ShardRun", "shard_clients", "start_sharded"]
