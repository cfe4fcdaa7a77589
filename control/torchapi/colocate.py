# SPDX-License-Identifier: Apache-2.0
"""Co-located servers started by the trainers themselves (`colocate`,
LTP_COLOCATE=1; over TCP or LTP): a job with no server ranks to start.

Trainer r of N is two ranks of the LTP job, which has 2N: its worker (LTP
rank N + r, as a trainer is beside N server ranks) and server r, which sums
slice r of every bucket (sharded servers, shards.py). torch's world is the N
trainers, so a stock script runs under torchrun as it is, and each
trainer's port carries about 2(N-1)/N of the gradient each way, as a ring
all-reduce's does.

Server r is the trainer's child process (`Child`, the default: the server
rank a user would start beside it, started by it; childserver.py), whose
worker reaches it by its Unix socket (localsock.py). With
LTP_COLOCATE_THREAD=1 it runs on a thread of the trainer's process instead
(`Partner`: its own Job, store client and heartbeats, no flight recorder of
its own), and the worker's link meets it in memory (handoff.py: one copy,
no socket). On an H200 server processes beside the trainers (those a
`Child` starts) ran 4-30 % faster than servers on threads, which share the
trainer's GIL, and the hand-off in memory bought nothing measurable
(docs/benchmarks.md, "Issue 41's GPU goal").

Over LTP the trainer's worker and its server are two seats of the
trainer's one device (`server_settings`: the server on the worker's UDP
port + SERVER_PORT), and a worker reaches a server on its own host off the
wire, which XDP never sees (link_ltp_near.py: by the server's Unix socket,
or in memory on a thread).

Either serves with the process's job key (a member key file, which holds
no server's key, is refused up front: `settle`) and ends when the job does
(the workers' goodbye); a trainer that shuts down waits for it, one that is
dying does not (a child gets SIGTERM when its trainer dies). A server that
cannot start, or a child that dies while its trainer runs, ends the trainer
at once, as a server that stops beating does (exchange.py), rather than
leave it waiting for the job's timeout.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import threading

from ...errors import UsageError
from .. import settings_table
from ..settings_table import MAX_SERVERS, OPTIONS, to_env
from ..trust import jobkey
from .server import run_server

log = logging.getLogger("ltpx.torch")

END_S = 10.0      # a clean shutdown waits this long for the partner's loop to end
SERVER_PORT = 1000   # over LTP, a trainer's server's UDP port: this above its worker's


def on_thread() -> bool:
    """Whether a trainer's server runs on a thread of its process
    (LTP_COLOCATE_THREAD=1), not as its child."""
    return bool(settings_table.env("colocate_thread"))


# settings whose variables name a server rank: one set means the job has server ranks
SERVER_NAMES = ("servers", "rank", "role", "world_size")
SERVER_VARS = tuple(settings_table.TABLE[n].env for n in SERVER_NAMES)


def chosen() -> tuple[bool, bool]:
    """(co-located, by default) for the `ltp` backend. LTP_COLOCATE decides
    where it is set; unset, a job whose trainers name no server rank (none of
    SERVER_VARS: torchrun's ranks alone) co-locates by default, and one that
    names any has server ranks of its own (`ltp launch` sets LTP_SERVERS and
    LTP_RANK on every rank; a hand-started server's trainers set LTP_SERVERS)."""
    given = settings_table.env("colocate") \
        if os.environ.get(settings_table.TABLE["colocate"].env) else None
    if given is not None:
        return bool(given), False
    named = any(os.environ.get(v) for v in SERVER_VARS)
    return not named, not named


def for_init(options: dict, place: tuple[int, int] | None) -> dict:
    """init()'s options with co-location decided: as the `ltp` backend's
    (`chosen`), where neither a keyword nor LTP_COLOCATE decides, a job
    whose trainers name no server rank, by variable or keyword (`servers`,
    `rank`, `role`, `world_size`), co-locates (torchrun alone: every trainer
    serves a slice). A caller's `place` (the backend's own call), or no
    RANK and WORLD_SIZE (no launcher: rendezvous says what is missing), leave
    the options as they are."""
    if place is not None or "colocate" in options \
            or any(options.get(n) is not None for n in SERVER_NAMES) \
            or not ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        return options
    colocated, by_default = chosen()
    return dict(options, colocate=True) if colocated and by_default else options


def by_default_refused(e: UsageError) -> UsageError:
    """A refusal to co-locate (`settle`) in a job co-located by default: the
    same, with why it was and how to have server ranks instead."""
    return UsageError(f"{e} [co-located by default, as no variable names a server rank; for "
                      "server ranks of their own set LTP_SERVERS=S on every rank and start "
                      "them (docs/deploy.md)]")


def server_settings(s):
    """A co-located server's settings, from its trainer's: over LTP its own
    seat of the trainer's device, on a port of its own."""
    if s.transport != "ltp":
        return s
    return dataclasses.replace(s, share_dev=True, udp_port=s.udp_port + SERVER_PORT)


def place(rank: int, size: int) -> tuple[int, int]:
    """(LTP rank, LTP world) of trainer `rank` of `size`: the worker's."""
    return size + rank, 2 * size


def settle(s, given: tuple[int, int] | None):
    """(settings, the worker's place) of a co-located trainer: servers = N.
    `given` is the place a caller worked out (the backend's); else torch's
    RANK and WORLD_SIZE (a launcher's LTP_RANK has no meaning here)."""
    if s.transport == "ltp":
        if s.loss_policy == "defer":
            raise UsageError("colocate over LTP: a trainer's own slice and answer are handed "
                             "over in memory, which tolerant answers (loss_policy defer) do "
                             "not cover: use loss_policy auto or repair")
        if s.udp_port + SERVER_PORT > 65535:
            raise UsageError(f"colocate over LTP: udp_port {s.udp_port} leaves no port "
                             f"{SERVER_PORT} above it for the trainer's server")
        s = dataclasses.replace(s, share_dev=True)   # its worker and server: seats of its device
    if s.secret_file and isinstance(jobkey.read_key_file(s.secret_file, "secret_file "
                                                        "(LTP_SECRET_FILE)"), jobkey.MemberKeys):
        raise UsageError("colocate: LTP_SECRET_FILE names a member key file, but a co-located "
                         "trainer serves a slice too, and a server needs the job key file "
                         "(hex): give every trainer the job key")
    if settings_table.env("role") == "server":
        raise UsageError("LTP_ROLE=server with LTP_COLOCATE=1: a co-located job has no server "
                         "ranks (each trainer starts its own); start the trainers only")
    if s.tcp_port:
        raise UsageError(f"colocate: tcp_port {s.tcp_port} (LTP_TCP_PORT): every trainer's "
                         "server on a host would take that one port; leave it 0 (any)")
    if given is None:
        missing = [v for v in ("RANK", "WORLD_SIZE") if v not in os.environ]
        if missing:
            raise UsageError(f"init(): {', '.join(missing)} not set: start the script with "
                             "torchrun (env:// rendezvous)")
        given = place(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    size = given[1] // 2
    if not 1 <= size <= MAX_SERVERS:
        raise UsageError(f"colocate: {size} trainers; co-located servers serve 1 to "
                         f"{MAX_SERVERS} trainers (one server each): use LTP_SERVERS and "
                         "server ranks of their own beyond that")
    return dataclasses.replace(s, servers=size), given


class Child:
    """Server r as a child process of trainer r (the default): the server rank
    a user would start beside the trainer, started by it, with the trainer's
    settings (keywords too) as its LTP_* variables. Its own session, so a
    launcher's signal to the trainer's process group is the trainer's to
    answer (`stop`). It hears of the trainer's death by PR_SET_PDEATHSIG
    (over TCP it ends; over LTP it serves its slice on while the job runs,
    childserver.orphaned): set by the child itself, the signal fires when
    the thread that started it ends, so the watcher thread, which lives as
    long as the child, starts it. A child that fails while the trainer runs
    ends the trainer at once, as a server that stops beating does
    (exchange.py)."""

    def __init__(self, s, rank: int, world: int):
        self.rank, self.closing = rank, False
        ltp = {**{n: getattr(s, n) for n in OPTIONS}, "colocate": False, "role": "server",
               "rank": rank, "world_size": world}
        self.env = {k: v for k, v in {**os.environ, **to_env(ltp)}.items() if v is not None}
        self.env["TORCHELASTIC_USE_AGENT_STORE"] = "True"   # a client of the job's store
        self.proc: subprocess.Popen | None = None
        self.started = threading.Event()
        self.error: BaseException | None = None
        self.watch = threading.Thread(target=self._watch, name=f"ltpx-server{rank}-watch",
                                      daemon=True)
        self.watch.start()
        self.started.wait()
        if self.error is not None:
            raise self.error

    def _watch(self) -> None:
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", f"{__package__}.childserver", "--parent",
                 str(os.getpid())], env=self.env, stdin=subprocess.DEVNULL,
                stdout=sys.stderr.fileno(), start_new_session=True)
        except BaseException as e:   # noqa: BLE001 - raised by __init__ on the trainer's thread
            self.error = e
            return
        finally:
            self.started.set()
        code = self.proc.wait()
        if code != 0 and not self.closing:
            log.error("ltpx.torch: the co-located server (rank %d, pid %d) exited %d: ending "
                      "this trainer (its worker would wait for it until the job's timeout)",
                      self.rank, self.proc.pid, code)
            os.kill(os.getpid(), signal.SIGTERM)    # as exchange.server_dead does

    def ending(self) -> None:
        """The trainer is shutting the job down: the server's exit is expected."""
        self.closing = True

    def stop(self, crashed: bool) -> None:
        """After the trainer's own close: the job's goodbye ends the server;
        one still there after END_S (at once, dying) is ended."""
        self.closing = True
        try:
            self.proc.wait(0.0 if crashed else END_S)
        except subprocess.TimeoutExpired:
            if not crashed:
                log.warning("ltpx.torch: the co-located server (rank %d) still serves %.0f s "
                            "after its trainer left: ending it", self.rank, END_S)
            self.proc.terminate()
            try:
                self.proc.wait(2.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Partner:
    """Server r on a thread of trainer r's process: its Job (made by
    `make(place, store)`) started and served there."""

    def __init__(self, make, rank: int, world: int, store):
        self.rank = rank
        self.job = make((rank, world), store)
        self.code: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, name=f"ltpx-server{rank}",
                                       daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            self.job.start()
        except BaseException as e:   # noqa: BLE001 - a thread's end: said, and the trainer ended
            self.error, self.code = e, 1
            self.job.close()
            log.error("ltpx.torch: the co-located server (rank %d) could not start: %s: ending "
                      "this trainer (its worker would wait for it until the job's timeout)",
                      self.rank, e)
            os.kill(os.getpid(), signal.SIGTERM)    # as exchange.server_dead does
            return
        try:
            self.code = run_server(self.job)
        except BaseException as e:   # noqa: BLE001 - a thread's end: said, kept for stop()
            self.error, self.code = e, 1
            log.error("ltpx.torch: the co-located server (rank %d) failed: %s", self.rank, e)
        finally:
            self.job.close()

    def ending(self) -> None:
        """The trainer is shutting the job down (its loop ends by itself)."""

    def stop(self, crashed: bool) -> None:
        """After the trainer's own close: wait for the loop to end (the job's
        goodbye ends it), or, dying, close its link under it."""
        self.thread.join(0.0 if crashed else END_S)
        if self.thread.is_alive():
            if not crashed:
                log.warning("ltpx.torch: the co-located server (rank %d) still serves %.0f s "
                            "after its trainer left: closing it", self.rank, END_S)
            self.job.close()
            self.thread.join(1.0)
