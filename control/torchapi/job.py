# SPDX-License-Identifier: Apache-2.0
"""One rank's place in an ltpx.torch job, and the calls that set it up and end it.

`init()` meets the other ranks through torch.distributed's env:// rendezvous
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; with
TORCHELASTIC_USE_AGENT_STORE=True every rank is a client of a store someone
else hosts, as under torchrun or `ltp launch`). Ranks 0..servers-1 are
servers, the rest workers; `rank()`, `size()` and `local_rank()` count workers
only. Every rank publishes its address in the store and reads the others'.
A server rank then serves (server.py) and exits the process when the
workers shut the job down; a worker returns and trains.

At exit a worker that did not call `shutdown()` shuts down then, unless it
is dying of an exception: then it only closes its endpoint (detaching its
XDP program) and the launcher ends the others.
"""
from __future__ import annotations

import atexit
import dataclasses
import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
from datetime import timedelta

import torch.distributed as dist

from ...dataplane import netns
from ...errors import CommError, UsageError
from .. import settings_table
from ..trust import jobkey
from .flight import SERVER, WORKER, current as flight_current, start as flight_start
from .flight import stop as flight_stop, trigger as flight_trigger
from .colocate import Child, Partner, by_default_refused, for_init, on_thread
from .colocate import server_settings, settle
from .coord import KEY, Coord
from .exchange import Exchange
from .host import dev_broadcast, dev_ipv4, ensure_bpffs, rank_host
from .link_ltp import LtpServerLink
from .link_ltp_worker import LtpWorkerLink
from .link_tcp import TcpServerLink, TcpWorkerLink
from ..trust.sealing import RUN_KEY, Seal
from .storevalues import run_value
from .server import run_server
from .settings import Settings, node_seat
from .trace import rank_trace, write as write_trace
from .shards import shard_clients, start_sharded
from .waits import ranks_note, waiting_note

log = logging.getLogger("ltpx.torch")   # the API's logger; modules log under it

_job: Job | None = None
_ended: Job | None = None     # the last job shut down here: rank() and size() still answer


class Job:
    """This rank in the job: its role, the store, its link, its op loop."""

    def __init__(self, s: Settings, place: tuple[int, int] | None = None, store=None):
        self.s = s
        self.place = place
        self.given = store      # a co-located server's store client (colocate.py)
        self.partner: Child | Partner | None = None   # this trainer's co-located server
        self.crashed = False
        self.summary: dict | None = None
        self.link = None
        self.group: str | None = None
        self.exchange = None
        self.optimizers: list = []      # DistributedOptimizers to drain before an op
        self.tolerant = None            # DDP's TolerantReduce, made at its first use (ddp.py)

    def start(self) -> None:
        s = self.s
        if s.transport == "ltp":
            if not s.dev:
                raise UsageError("init(): LTP needs the device that carries training traffic: "
                                 "init(dev=...) or LTP_DEV (ltp launch sets it)")
            ensure_bpffs()
        if s.dev and not s.ip:
            s = self.s = dataclasses.replace(s, ip=dev_ipv4(s.dev))
        self.key = job_key(s)
        if self.given is None:
            self.store, self.global_rank, self.world = rendezvous(s.store_netns, s.timeout,
                                                                  self.place)
        else:
            self.store, (self.global_rank, self.world) = self.given, self.place
        if self.key is None and self.global_rank == 0:
            warn_keyless(s)
        self.workers = self.world - s.servers
        if self.workers < 1:
            raise UsageError(f"WORLD_SIZE={self.world}: a job needs {s.servers} server "
                             "rank(s) and at least one worker")
        self.is_server = self.global_rank < s.servers
        self.rank = None if self.is_server else self.global_rank - s.servers
        # a worker may hold its own member key file only, a server the job key
        jobkey.check_member(self.key, self.is_server, self.rank,
                            s.servers if s.transport == "ltp" else 0)
        if s.colocate and not self.is_server:   # server `rank`: a child, or on a thread
            self.partner = Partner(lambda at, st: Job(server_settings(s), at, st), self.rank,
                                   self.world, shard_clients(self.store, 1, s.store_netns)[0]) \
                if on_thread() else Child(server_settings(s), self.rank, self.world)
        if self.given is None:     # the process's recorder (LTP_FLIGHT_DIR): not a partner's
            flight_start(self.global_rank, SERVER if self.is_server else WORKER,
                         self.global_rank if self.is_server else self.rank)
        # every value, token, answer and hello below is bound to this run
        with ranks_note(self):
            self.run = agree_run(self.store, self.key, self.global_rank, self.rank,
                                 s.servers, s.timeout, s.run_id)
        if s.servers > 1:   # sharded servers: shards.py sets up coord, links, exchange
            start_sharded(self)
            return
        self.coord = Coord(self.store, self.workers, s.timeout,
                           key=jobkey.store_auth(self.key, self.rank, self.run))
        self.coord.start_liveness(self.global_rank, s.store_netns)   # heartbeats: liveness.py
        self.link = self.make_link()
        me = {"rank": self.global_rank, "role": "server" if self.is_server else "worker",
              "ip": s.ip, "dev": s.dev, "host": rank_host(s.netns, s.node), "pid": os.getpid(),
              **self.link.address(), **self.coord.directory()}
        self.coord.set_json(f"meta/{self.global_rank}", me)
        with ranks_note(self):
            metas = self.coord.metas(range(self.world))
        self.local_rank = self.local_index(metas)
        if self.is_server:
            self.link.connect({w: metas[s.servers + w] for w in range(self.workers)})
        else:
            self.link.connect(metas[0])
            self.exchange = Exchange(self.link, self.coord, self.rank, self.workers)
            if flight_current() is not None:    # a dump carries the latest ops
                flight_current().records = self.exchange.timeline.records

    def make_link(self, shard: int = 0):
        s = self.s
        if s.transport == "tcp":
            if self.is_server:
                if not s.ip:
                    raise UsageError("init(): the TCP server needs its address: dev= or ip= "
                                     "(LTP_DEV / LTP_IP)")
                return TcpServerLink(s, self.workers, key=jobkey.hello_key(self.key, self.run))
            return TcpWorkerLink(s, self.rank, self.workers,
                                 key=jobkey.hello_key(self.key, self.run))
        if self.is_server:
            self.group = s.group or dev_broadcast(s.dev)
            if self.group is None:
                log.warning("ltpx: %s has no IPv4 broadcast address and no group was given: "
                            "answers go to each worker (unicast)", s.dev)
            return LtpServerLink(s, self.workers, self.group,
                                 secret=jobkey.token_secret(self.key, shard, self.run),
                                 shard=shard, servers=s.servers,
                                 key=jobkey.hello_key(self.key, self.run))
        return LtpWorkerLink(s, self.rank, self.workers,
                             secret=jobkey.token_secret(self.key, shard, self.run),
                             key=jobkey.hello_key(self.key, self.run))

    def local_index(self, metas: list[dict]) -> int:
        """This worker's index among the workers on its host (servers: 0)."""
        if self.is_server:
            return 0
        host = metas[self.global_rank]["host"]
        return sum(1 for m in metas[self.s.servers:self.global_rank] if m["host"] == host)

    def drain(self) -> None:
        """Finish what the optimizers' communication threads still push."""
        for opt in self.optimizers:
            opt.drain()

    def close(self) -> None:
        if self.given is None:
            flight_stop()
        if getattr(self, "coord", None) is not None:
            self.coord.stop_liveness()
        for opt in self.optimizers:   # a dying rank does not wait for a push under way
            opt.close(wait_s=1.0 if self.crashed else 10.0)
        self.optimizers = []
        if self.link is not None:
            link, self.link = self.link, None
            link.close()
        if self.partner is not None:
            partner, self.partner = self.partner, None
            partner.stop(self.crashed)


def job_key(s: Settings) -> bytes | jobkey.MemberKeys | None:
    """The job key from s.secret_file (LTP_SECRET_FILE), or a worker's member
    keys (jobkey.MemberKeys); None, with a warning, when there is none
    (UsageError under require_secret, by default where the store is not on
    loopback: a job reachable from other hosts fails closed)."""
    if s.secret_file:
        return jobkey.read_key_file(s.secret_file, "secret_file (LTP_SECRET_FILE)")
    addr = os.environ.get("MASTER_ADDR", "")
    require = s.require_secret if s.require_secret is not None else not on_loopback(addr)
    if require:
        why = "require_secret is set" if s.require_secret else \
            f"the store (MASTER_ADDR={addr}) is not on loopback"
        raise UsageError(f"init(): {why} and no job key was given: set LTP_SECRET_FILE (or "
                         "secret_file=) to a 0600 file: the job key as hex on servers "
                         "(`openssl rand -hex 32`), each worker's member key file on workers "
                         "(`ltp key member`; `ltp launch` makes them)")
    return None


def on_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback one (a name that
    does not resolve is not: a keyless job fails closed)."""
    if not host:
        return True          # no env:// store (rendezvous names what is missing)
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def agree_run(store, key, global_rank: int, worker: int | None, servers: int,
              timeout_s: float, run_id: str | None = None) -> bytes:
    """This run's id, the same on every rank (control/trust/jobkey.py): rank 0
    puts its own under `run` in the store, signed by the server: the one
    given (`run_id`, the run_id setting: LTP_RUN_ID; else torchrun's,
    jobkey.given_run), else one it draws. Every other rank takes it from
    there, and one given an id of its own that differs stops with a usage
    error naming both. That value cannot be bound to the run it names: the
    server writes it first thing, so a value replayed there must win a race
    with it, and where every rank is given the id, a replayed one is only
    refused (docs/operations.md, "Threat model")."""
    given = jobkey.given_run(run_id)
    seal = Seal(jobkey.store_auth(key, worker), prefix=KEY, servers=servers)
    name = KEY + RUN_KEY
    if global_rank == 0:
        run = given or jobkey.new_run().encode()
        store.set(name, seal.seal(name, run))
        return run
    try:
        store.wait([name], timedelta(seconds=timeout_s))
    except RuntimeError:        # torch's DistStoreError: the wait timed out
        raise CommError(f"waited {timeout_s:g}s for the LTP job's rank 0 (a server) in the "
                        "rendezvous store: it never joined (is a server rank started? "
                        "LTP_ROLE=server LTP_RANK=0, docs/deploy.md)") from None
    run = seal.read_from(name, store.get(name), run_value)[1]
    if given is not None and given != run:
        raise UsageError(f"init(): this rank's run id is {given.decode()!r}, rank 0's "
                         f"{run.decode()!r}: give every rank of the job the same LTP_RUN_ID "
                         "(torchrun's --rdzv-id counts as one), or none")
    return run


def warn_keyless(s: Settings) -> None:
    """Rank 0's one line for a job without a key. In a co-located job rank 0
    is trainer 0's server, told apart from a server rank by nothing it
    holds, so the line names both fixes: there every rank takes the job
    key (a member file holds no server's key: colocate.settle)."""
    log.warning("ltpx.torch: no job key (LTP_SECRET_FILE): %sthe store's values are not "
                "authenticated, so whoever reaches MASTER_ADDR:MASTER_PORT can forge them; "
                "give servers a 0600 job key file (`openssl rand -hex 32`) and each worker "
                "its member file (`ltp key member`), as `ltp launch` does; with no server "
                "ranks (co-located, torchrun alone) give every rank the job key file",
                "LTP's round tokens are off and " if s.transport == "ltp" else "")


def rendezvous(store_netns: str | None, timeout_s: float, place: tuple[int, int] | None = None):
    """(store, rank, world) from env://; the store's socket made in store_netns.

    The rank and world are this process's place in the LTP job, servers
    first: `place` where given (the `ltp` backend's), else LTP_RANK and
    LTP_WORLD_SIZE where a launcher set them (then RANK and WORLD_SIZE count
    the trainers only, as torchrun's do), else RANK and WORLD_SIZE."""
    if place is None and settings_table.env("rank") is not None:
        if settings_table.env("world_size") is None:
            raise UsageError("init(): LTP_RANK is set but LTP_WORLD_SIZE is not: a launcher "
                             "sets both (the LTP job's ranks, servers first)")
        place = (settings_table.env("rank"), settings_table.env("world_size"))
    need = ("MASTER_ADDR", "MASTER_PORT") + (("RANK", "WORLD_SIZE") if place is None else ())
    missing = [v for v in need if v not in os.environ]
    if missing:
        raise UsageError(f"init(): {', '.join(missing)} not set: start the script with "
                         "`ltp launch` or torchrun (env:// rendezvous)")
    rank, world = place if place is not None else (-1, -1)
    with netns.inside(store_netns), waiting_note(timeout_s):
        store, rank, world = next(dist.rendezvous("env://", rank=rank, world_size=world,
                                                  timeout=timedelta(seconds=timeout_s)))
    return store, rank, world


def joined() -> Job | None:
    """The job of this process, or None before init()."""
    return _job


def current() -> Job:
    """The job of this process (UsageError before init())."""
    if _job is None:
        raise UsageError("ltpx.torch: call init() first")
    return _job


def init(*, serve: bool = True, place: tuple[int, int] | None = None, **options) -> None:
    """Join the job (see the module docstring; control/settings_table.py lists the options).

    A server rank serves here and exits the process when the job ends, unless
    serve=False (then call serve() yourself). place: (rank, world) in the
    LTP job, servers first (rendezvous() says where it comes from otherwise)."""
    global _job
    if _job is not None:
        raise UsageError("ltpx.torch: init() was called already")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    given = for_init(options, place)   # torchrun alone: co-located by default
    s = node_seat(Settings.resolve(given), options)
    if s.colocate:    # every trainer serves a slice too (colocate.py)
        try:
            s, place = settle(s, place)
        except UsageError as e:
            if given is options:
                raise
            raise by_default_refused(e) from None
    job = Job(s, place)
    try:
        job.start()
    except BaseException:   # no heartbeat thread or open link outlives a failed init
        job.close()
        raise
    s = job.s
    log.info("rank %d of %d: %s over %s%s", job.global_rank, job.world,
             "server" if job.is_server else f"worker {job.rank}", s.transport,
             f" on {s.dev} ({s.ip})" if s.dev else f" ({s.ip})" if s.ip else "")
    _job = job
    _install_exit_handlers(job)
    if job.is_server and serve:
        sys.exit(serve_here())


def serve_here() -> int:
    """Run this server rank's loop until the job ends; its exit code."""
    job = current()
    if not job.is_server:
        raise UsageError("ltpx.torch: serve() runs on server ranks only (is_server())")
    try:
        return run_server(job)
    finally:
        _end(job)


def shutdown() -> dict | None:
    """End the job: every worker calls it (a barrier); returns the server's
    summary. Safe to call twice, or before init (returns None)."""
    job = _job
    if job is None:
        return None
    try:
        if job.is_server:
            return job.summary
        if job.partner is not None:     # its server ends with the goodbye below
            job.partner.ending()
        job.drain()
        job.summary = job.exchange.shutdown()
        if job.s.trace and settings_table.env("trace_ranks"):   # ltp launch --trace: each rank's view
            write_trace(f"{job.s.trace}.worker{job.rank}",
                        rank_trace({}, {job.rank: job.exchange.timeline.records()}))
        return job.summary
    finally:
        _end(job)


def _end(job: Job) -> None:
    global _job, _ended
    job.close()
    if _job is job:
        _job, _ended = None, job


def _install_exit_handlers(job: Job) -> None:
    prev_hook = sys.excepthook

    def on_exception(*exc):
        job.crashed = True
        flight_trigger(exc[0].__name__, str(exc[1]), now=True)   # the ring, as it ended
        prev_hook(*exc)
    sys.excepthook = on_exception
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        pid = os.getpid()

        def on_sigterm(signum, frame):   # unwind, so the endpoint detaches its XDP program
            if os.getpid() == pid:
                job.crashed = True       # and no goodbye at exit: the job is ending
                raise KeyboardInterrupt
        signal.signal(signal.SIGTERM, on_sigterm)
    atexit.register(_at_exit, job)


def abandon() -> None:
    """This process is dying (a signal, a launcher stopping it): close the
    endpoint now, without shutdown()'s barrier and its wait for the server."""
    if _job is not None:
        _job.crashed = True
        _end(_job)


def _at_exit(job: Job) -> None:
    if _job is not job:
        return
    if job.crashed or job.is_server:
        _end(job)
        return
    try:
        shutdown()
    except Exception as e:   # at exit, a failed goodbye is only worth a line
        log.warning("ltpx.torch: shutdown at exit failed: %s", e)
        _end(job)


def placed() -> Job:
    """The job, or the one shut down last: its place (rank, size) outlives it,
    so `if lt.rank() == 0: print(summary)` works after shutdown()."""
    if _job is None and _ended is not None:
        return _ended
    return current()


def rank() -> int:
    """This worker's rank among the workers (0..size()-1); -1 on a server."""
    job = placed()
    return -1 if job.is_server else job.rank


def size() -> int:
    """The number of workers."""
    return placed().workers


def local_rank() -> int:
    """This worker's index among the workers on its host."""
    return placed().local_rank


def is_server() -> bool:
    return placed().is_server
