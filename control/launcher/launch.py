# SPDX-License-Identifier: Apache-2.0
"""Start every rank of a job inside a rig's namespaces and follow their output: torchrun for rigs.

The rendezvous store is a TCPStore on the PS namespace's loopback (so
coordination never crosses the measured network), hosted by a process
forked from the fork server (storehost.py) or by this one, and relayed to
127.0.0.1 in every other namespace of the job (storerelay.py), so
MASTER_ADDR works for any script. RigJob starts
one process per rank in its host's network namespace only (the rank sees
the host's /sys and its bpffs): forked from the fork server (forkserver.py:
torch and the job's modules imported once, before the rig was built when a
command called `forkserver.warm()`), or as a new interpreter with
`dataplane.netns.popen` (LTP_FORKSERVER=0, a command that is not a Python
module or script, or the fork server failing). Each rank
gets torchrun's env:// variables (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, LOCAL_RANK, TORCHELASTIC_USE_AGENT_STORE=True; RANK and
WORLD_SIZE count the trainers only, as for a torchrun script) and what
`ltpx.torch.init()` reads (LTP_RANK and LTP_WORLD_SIZE, servers first;
LTP_ROLE; the variables of the settings table's launcher entries, from
`rank_settings`: LTP_DEV, LTP_IP, LTP_XDP_MODE, LTP_CAPACITY, LTP_MTU,
LTP_GROUP, ...).

Ranks 0..servers-1 run on the rig's server hosts (ps, ps1, ...: `ltp rig up
--servers S`; a one-server rig runs them all on ps), rank servers+k on
worker host k // R (`ltp launch --ranks-per-node R`, 1 by default);
co-located (`plan_ranks(colocate=True)`, `ltp launch --colocate`), server i
runs beside worker i, on its host; on a rig with nodes every rank has a host
of its own and its node is the rig's (plan.py).
Their stdout and stderr are read line by line as they come (`RigJob.pump`
hands each line to a callback); when a rank fails the others get `grace_s`
to notice, then SIGTERM (a rank unwinds and detaches
its XDP program), then SIGKILL; a rank that died may first be started again
(`respawn`, as restarts.RestartPolicy decides: `follow`). `ltp launch`
(tools/cmd_launch.py) and `ltp train` (control/training/onrig.py) are its
two users.

The job key (control/trust/jobkey.py): the file LTP_SECRET_FILE names in this
process's environment, else one RigJob makes (mode 0600 in a 0700 folder,
removed at close). Server ranks get LTP_SECRET_FILE naming it; each worker
a member key file of its own (jobkey.RankKeys: its own tokens' keys, the
group keys when `group_keys`, the store's MAC key, its own TCP hello), from
which neither the job key nor another worker's keys follow; a restarted
worker is handed its file again. No key is ever in an argv, an environment
or the store: LTP's round tokens and the MACs of the store's values derive
from these files in each rank, bound to the job's run id (LTP_RUN_ID: the
environment's, else one RigJob draws; the same for a restarted rank).

The flight recorder (hangs.py): every rank gets LTP_FLIGHT_DIR, the job's
flight folder; at each pump a new dump there (a rank that waited past its
stall threshold, SIGUSR1, an error) makes a screen of one line per rank,
handed to `on_hang` (default: stderr, each line prefixed [hang]).
"""
from __future__ import annotations

import json
import os
import select
import selectors
import subprocess
import sys
import time
from collections.abc import Callable

from ...dataplane import netns
from ...dataplane.rig.star import BROADCAST
from ..trust import jobkey
from ..procs import stop_all
from .. import settings_table
from ..settings_table import to_env
from . import forkserver
from .hangs import FlightWatch
from .plan import Rank
from .restarts import describe_exit
from .storerelay import StoreRelay

STORE_MODULE = forkserver.STORE_MODULE
LTP_PORT = settings_table.TABLE["udp_port"].default    # a server's; a seated worker's above it
RC_KILLED = -1000   # a rank this launcher stopped (another one failed first, or the timeout)


def rank_settings(rig, r: Rank, *, servers: int, transport: str = "ltp",
                  group: bool = True, share: bool = False) -> dict:
    """The settings the launcher gives rank r (the settings table's `launcher`
    entries): its host's device, address and namespace, the rig's mode, rate,
    MTU and queue, the job's transport and servers, and for the group downlink
    the rig's broadcast address (its bridge floods it to every host). `share`
    (`--share-nic`): a worker over LTP takes a seat of its host's device
    (share_dev) on port LTP_PORT + 1 + its LOCAL_RANK, or the group's port
    LTP_PORT where it is its host's one worker (the group's answers reach it)."""
    h, c = r.host, rig.config
    node = f"{rig.name}-n{r.node}" if getattr(c, "nodes", 0) and r.node >= 0 else None
    seated = share and transport == "ltp" and r.role == "worker"
    return dict(transport=transport, dev=h.ifname, ip=h.ip, xdp_mode=c.mode,
                capacity=c.rate_bps, mtu=c.mtu, group=BROADCAST if group else None,
                servers=servers, netns=h.netns, store_netns=rig.ps.netns, buffer=c.buffer_bytes,
                node=node, udp_port=LTP_PORT + 1 + r.local if seated and r.local_world > 1
                else LTP_PORT,
                share_dev=seated)


BEAT_LAG_S = 0.5     # a heartbeat's lag per process a core, on a machine all ranks share


def shared_dead_s(processes: int, cores: int | None = None) -> float:
    """LTP_DEAD_S for a rig's ranks: they all share this machine's cores, and
    a heartbeat is a Python thread, so its gaps grow with the processes a
    core carries. 16 processes on 2 cores (4 nodes x 2 co-located trainers,
    each with its server) had beats stop for over 2 s, and live ranks were
    taken for dead (2026-12-02): the default DEAD_S, up to BEAT_LAG_S a
    process a core beyond it (4 s there)."""
    cores = max(1, cores or os.cpu_count() or 1)
    return max(settings_table.TABLE["dead_s"].default, BEAT_LAG_S * processes / cores)


def job_env(rig, r: Rank, world: int, store_port: int, *, servers: int,
            transport: str = "ltp", group: bool = True, share: bool = False,
            colocated: bool = False) -> dict[str, str]:
    """env:// as torchrun's agent sets it, and the LTP_* settings of the rank's host.

    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK mean what
    torchrun means for a script with no servers: the trainers only, a worker
    host a node (a server rank gets RANK 0 of them and LTP_ROLE=server).
    LTP_RANK and LTP_WORLD_SIZE place every rank in the LTP job, servers
    first. MASTER_ADDR is the store on loopback, reached from every
    namespace (StoreRelay); gloo talks over the rank's rig device. The LTP_*
    variables of rank_settings replace what this process's environment has
    (one it leaves unset is removed); the other LTP_* settings pass on.
    `colocated`: the trainers start their servers themselves (LTP_COLOCATE=1,
    LTP_SERVERS the trainers), and `servers` is 0."""
    trainers = world - servers
    torch_rank = 0 if r.role == "server" else r.rank - servers
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store_port),
               RANK=str(torch_rank), WORLD_SIZE=str(trainers), LOCAL_RANK=str(r.local),
               LOCAL_WORLD_SIZE=str(r.local_world), GROUP_RANK=str(max(r.node, 0)),
               TORCHELASTIC_USE_AGENT_STORE="True", GLOO_SOCKET_IFNAME=r.host.ifname,
               **forkserver.IMPORT_ENV,        # OMP_NUM_THREADS=1, TORCH_CPP_LOG_LEVEL, ...
               **to_env({"rank": r.rank, "world_size": world, "role": r.role,
                         "progress": "json"}))
    settings = rank_settings(rig, r, servers=servers, transport=transport, group=group,
                             share=share)
    if colocated:    # no server ranks: each trainer serves a slice (colocate.py)
        settings.update(colocate=True, servers=trainers)
    dead_s = shared_dead_s(world + (trainers if colocated else 0))   # a trainer's server too
    if dead_s > settings_table.TABLE["dead_s"].default and \
            settings_table.TABLE["dead_s"].env not in os.environ:   # an operator's stands
        settings["dead_s"] = dead_s
    for var, text in to_env(settings).items():
        if text is None:
            env.pop(var, None)
        else:
            env[var] = text
    return env


class RigJob:
    """The ranks of one job on a rig: start, pump their output, stop."""

    def __init__(self, rig, ranks: list[Rank], store_timeout_s: float = 300.0,
                 group_keys: bool = True, preload: tuple[str, ...] = (),
                 colocated: bool = False):
        """`preload`: modules a fork server this job starts itself (none was
        warmed) imports beyond forkserver.PRELOAD, as `forkserver.warm(also)`.
        `colocated`: trainers that serve a slice too (LTP_COLOCATE=1) get the
        job key's file, as a server does."""
        self.rig, self.ranks, self.preload = rig, ranks, tuple(preload)
        self.colocated = colocated
        self.sel = selectors.DefaultSelector()
        self.store = self.store_proc = self.relay = None
        self.zygote = forkserver.take(new=False)      # the one warm() started, if any
        self.zygote_asked = self.zygote is not None
        self.keys = None
        self.flight = FlightWatch()
        self.on_hang: Callable[[list[str]], None] = _print_hang
        try:
            # the job key: LTP_SECRET_FILE's, or one made for this job (a 0600
            # file, removed at close), to the servers; each worker its member
            # file; every rank is told its file, never a key
            self.keys = jobkey.RankKeys(sum(r.role == "server" for r in ranks), group_keys)
            # one run id for the job (an operator's LTP_RUN_ID, else a new one),
            # the same for a restarted rank: what the key derives is bound to it
            self.run = settings_table.env("run_id") or jobkey.new_run()
            self.port = self.host_store(store_timeout_s)
            # MASTER_ADDR=127.0.0.1 must reach the store from every rank's namespace
            self.relay = StoreRelay(self.port, rig.ps.netns, [r.host.netns for r in ranks])
        except BaseException:   # the zygote (and a store it forked) end here: no job to close
            self.close()
            raise

    def host_store(self, timeout_s: float) -> int:
        """The rendezvous store on the PS namespace's loopback; its port. Forked
        from the fork server (storehost.py: this process then never imports
        torch), else hosted here."""
        if self.zygote is not None:
            p = self.zygote.spawn([sys.executable, "-m", STORE_MODULE, str(timeout_s)],
                                  dict(self.zygote.env), netns=self.rig.ps.netns)
            port = _port_of(p) if p is not None else None
            if port:
                self.store_proc = p
                return port
            if p is not None:
                stop_all([p], grace_s=1.0)
                forkserver.note("the store did not start there; hosting it here")
        from .storehost import loopback_store  # noqa: PLC0415 (imports torch: only without the fork server)
        with netns.inside(self.rig.ps.netns):
            self.store = loopback_store(timeout_s)
        return self.store.port

    def start(self, argv_for: Callable[[Rank], list[str]],
              env_for: Callable[[Rank], dict]) -> None:
        self.argv_for, self.env_for = argv_for, env_for
        for r in self.ranks:
            self.spawn(r)

    def spawn(self, r: Rank) -> None:
        """Start rank r's process (again, after it died: the same argv and
        environment in the same namespace, as torchrun's agent restarts one)."""
        argv, env = self.argv_for(r), {**self.env_for(r),
                                       jobkey.ENV: self.keys.path(
                                           "server" if self.colocated else r.role, r.index),
                                       jobkey.RUN_ENV: self.run,
                                       # as torchrun's: frameworks (Lightning) see a launcher
                                       jobkey.TORCHRUN_RUN: self.run,
                                       **self.flight.env()}
        r.proc = self.fork(r, argv, env)
        r.forked = r.proc is not None
        if r.proc is None:
            r.proc = netns.popen(r.host.netns, argv, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        r.t0, r.code, r.wall_s, r.killed, r.settled = time.monotonic(), None, None, False, False
        r.starts += 1
        for stream, f in (("stdout", r.proc.stdout), ("stderr", r.proc.stderr)):
            os.set_blocking(f.fileno(), False)
            r.bufs[f.fileno()] = b""
            self.sel.register(f, selectors.EVENT_READ, (r, stream))

    def fork(self, r: Rank, argv: list[str], env: dict):
        """Rank r's process from the fork server (taken at the first rank it can
        run), or None: start it as a new interpreter."""
        if not netns.exists(r.host.netns) or forkserver.plan(argv) is None:
            return None      # (netns.popen names a missing namespace)
        if not self.zygote_asked:
            self.zygote_asked = True
            self.zygote = forkserver.take(also=self.preload)
        return self.zygote.spawn(argv, env, netns=r.host.netns) if self.zygote else None

    def respawn(self, r: Rank) -> None:
        """Start a rank whose process has exited and been reaped again."""
        for f in (r.proc.stdout, r.proc.stderr):
            if f and not f.closed:
                if f in self.sel.get_map():
                    self.sel.unregister(f)
                f.close()
        self.spawn(r)

    def pump(self, on_line: Callable[[Rank, str, str], None], wait_s: float = 0.05) -> None:
        """Read what is there (waiting up to wait_s) and hand over whole lines;
        note the ranks that exited; a screen for a new flight dump."""
        hang = self.flight.poll()
        if hang:
            self.on_hang(hang)
        for key, _ in self.sel.select(wait_s):
            r, stream = key.data
            fd = key.fileobj.fileno()
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not data:   # the rank closed it: the rest is its last line
                self.sel.unregister(key.fileobj)
                if r.bufs[fd]:
                    on_line(r, stream, r.bufs.pop(fd).decode(errors="replace"))
                continue
            *lines, r.bufs[fd] = (r.bufs[fd] + data).split(b"\n")
            for ln in lines:
                on_line(r, stream, ln.decode(errors="replace"))
        for r in self.ranks:
            if r.code is None and r.proc.poll() is not None and not self.open_streams(r):
                r.code = r.proc.returncode
                r.wall_s = time.monotonic() - r.t0

    def open_streams(self, r: Rank) -> bool:
        return any(k.data[0] is r for k in self.sel.get_map().values())

    def running(self) -> list[Rank]:
        return [r for r in self.ranks if r.code is None]

    def failed(self) -> list[Rank]:
        return [r for r in self.ranks if r.code not in (None, 0) and not r.killed
                and not r.settled]

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop every rank still running (SIGTERM, SIGKILL after grace_s)."""
        live = [r for r in self.ranks if r.proc is not None and r.proc.poll() is None]
        for r in live:
            r.killed = True
        stop_all([r.proc for r in self.ranks if r.proc is not None], grace_s=grace_s)
        for r in self.ranks:
            if r.code is None and r.proc is not None:
                r.code = RC_KILLED if r.killed else r.proc.returncode
                r.wall_s = time.monotonic() - r.t0

    def close(self) -> None:
        self.stop()
        if self.relay is not None:
            self.relay.close()
        if self.store_proc is not None:
            stop_all([self.store_proc], grace_s=2.0)
        if self.zygote is not None:
            self.zygote.close()
        if self.keys is not None:
            self.keys.close()
        kept = self.flight.close(keep=bool(self.failed()))
        if kept and self.flight.screens:
            self.on_hang([f"flight records kept in {kept}"])
        self.sel.close()
        self.store = None


def first_failure(ranks: list[Rank]) -> dict | None:
    """The first rank that failed by itself (not stopped by the launcher):
    who, its exit code, when, and the last error line it printed; None
    when none failed."""
    failed = [r for r in ranks if not r.killed and r.code not in (None, 0)]
    if not failed:
        return None
    r = min(failed, key=lambda r: r.t0 + (r.wall_s or 0.0))
    return {"label": r.label, "torch_rank": r.torch_rank, "exit_code": exit_code(r.code),
            "after_s": round(r.wall_s, 3) if r.wall_s is not None else None,
            "error": r.last_error}


def follow(job: RigJob, on_line: Callable[[Rank, str, str], None], policy, *,
           grace_s: float, t_end: float | None = None) -> bool:
    """Pump `job` until every rank has exited (`ltp launch`). A rank that dies
    goes to `policy` first (restarts.RestartPolicy: restarted in place, or
    RestartJob, which the caller answers by starting every rank again); a
    failure gives the others grace_s, then they are left for the caller to
    stop. True if t_end (time.monotonic) came first."""
    failed_at = None
    while job.running():
        job.pump(on_line)
        if failed_at is None:
            policy.settle(job)
            if job.failed():
                failed_at = time.monotonic()
                job.flight.quiet = True     # the others' waits from here on are no hangs
                who = ", ".join(f"{r.role} {r.index} exited {describe_exit(r.code)}"
                                for r in job.failed())
                policy.note(f"{who}; " + (f"the others are stopped in {grace_s:g} s unless "
                                          "they end first (--grace)" if grace_s else
                                          "the others are stopped"))
        if failed_at is not None and time.monotonic() > failed_at + grace_s:
            return False
        if t_end is not None and time.monotonic() > t_end:
            return True
    return False


def _print_hang(lines: list[str]) -> None:
    for ln in lines:
        print(f"[hang] {ln}", file=sys.stderr, flush=True)


def _port_of(p, wait_s: float = 60.0) -> int | None:
    """The port a storehost process prints first (None if it exits instead)."""
    if not select.select([p.stdout], [], [], wait_s)[0]:
        return None
    try:
        return int(json.loads(p.stdout.readline())["port"])
    except (ValueError, KeyError, TypeError):
        return None


def exit_code(code: int | None) -> int:
    """A process's status as a shell shows it (killed by signal N: 128 + N)."""
    if code is None or code == RC_KILLED:
        return 143
    return 128 - code if code < 0 else code


def python_argv(argv: list[str]) -> list[str]:
    """A command as given, with `python`/`python3` or a leading .py script run by
    this interpreter (the one with torch and ltpx), as torchrun does."""
    if argv and argv[0] in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    if argv and argv[0].endswith(".py"):
        return [sys.executable, *argv]
    return list(argv)
