# SPDX-License-Identifier: Apache-2.0
"""`ltp train`'s job on a rig: every rank of the built-in training started with
the launcher's RigJob (control/launcher/launch.py), the lead's JSON events
followed, the others' output kept in logs.

The lead is worker 0 (it evaluates and reports; with gloo, rank 0). Its
stdout (JSON lines: start, iter, eval, result) drives the progress bar;
every rank's other output goes to a log directory that is removed on
success and named in the error otherwise. The result's "startup" says when
the lead's "start" and first "iter" events came, in seconds since this
process started, and how many ranks were forked from the fork server.

Rigs for comparisons: every switch port is shaped and lossy alike
(shape="all", loss_on="all"); LTP runs on a native-mode rig (XDP_TX needs
XDP on the switch-side veths), TCP and gloo on an skb-mode rig, because the
switch-side XDP_PASS programs turn TSO off on the host veths and make TCP
look better than it would on a NIC (docs/rig.md).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

from ...errors import LaunchError, UsageError
from .. import settings_table
from .config import LTP_TRANSPORTS, TrainConfig
from . import RANK_MODULES
from .faults import Faults
from ..launcher import forkserver
from ..launcher.launch import RigJob, job_env
from ..launcher.plan import plan_ranks
from ..launcher.restarts import RestartJob
from ...dataplane.rig.star import RigConfig
from ...dataplane.tcp_cc import ensure_cc


def rig_mode_for(transport: str) -> str:
    return "native" if transport in LTP_TRANSPORTS else "skb"


def rig_config(name: str, transport: str, *, workers: int, rate_bps: int, buffer_bytes: int,
               loss: float, mtu: int = 1500, servers: int = 1, nodes: int = 0,
               colocate: bool = False):
    """The RigConfig a run of `transport` should build (see the module docstring)."""
    return RigConfig(name=name, workers=workers, rate_bps=rate_bps, buffer_bytes=buffer_bytes,
                     loss=loss, shape="all", loss_on="all", mode=rig_mode_for(transport), mtu=mtu,
                     servers=servers, nodes=nodes, colocate=colocate)


def rank_argv(cfg: TrainConfig, rank_timeout_s: float, deadline_min_s: float | None,
              early_close: dict | None) -> list[str]:
    """A rank's command line; its host's network comes in LTP_* variables."""
    argv = [sys.executable, "-m", "ltpx.control.training", "--config", cfg.to_json(),
            "--timeout", str(rank_timeout_s)]
    if deadline_min_s is not None:
        argv += ["--deadline-min", str(deadline_min_s)]
    if early_close:
        argv += ["--early-close", json.dumps(early_close)]
    return argv


class Follow:
    """The lead's events, everyone's other output into the log directory."""

    def __init__(self, lead, logdir: str, progress):
        self.lead, self.logdir, self.progress = lead, logdir, progress
        self.files: dict = {}
        self.result: dict | None = None
        self.error: tuple | None = None
        self.marks: dict[str, float] = {}    # the lead's first start / iter: process age

    def __call__(self, r, stream: str, line: str) -> None:
        if r is self.lead and stream == "stdout":
            try:
                msg = json.loads(line)
            except ValueError:
                msg = None
            if isinstance(msg, dict):
                ev = msg.get("event")
                if ev in ("start", "iter") and ev not in self.marks:
                    self.marks[ev] = round(process_age(), 3)
                if ev == "result":
                    self.result = msg
                elif ev == "error":
                    self.error = (r, msg.get("error"))
                elif self.progress:
                    self.progress(msg)
                return
        f = self.files.get((r.rank, stream))
        if f is None:
            f = self.files[(r.rank, stream)] = open(
                os.path.join(self.logdir, f"rank{r.rank}.{'err' if stream == 'stderr' else 'out'}"),
                "a")      # a restarted rank (or job) writes on
        f.write(line + "\n")
        f.flush()
        if stream == "stdout" and '"error"' in line and self.error is None:
            try:
                self.error = (r, json.loads(line).get("error"))
            except ValueError:
                pass

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def train_on_rig(rig, cfg: TrainConfig, *, workers: int | None = None,
                 progress: Callable[[dict], None] | None = None, timeout_s: float = 900.0,
                 rank_timeout_s: float = 120.0, deadline_min_s: float | None = None,
                 early_close: dict | None = None, faults: Faults | None = None,
                 on_hang: Callable[[list[str]], None] | None = None, per_node: int = 1,
                 share: bool = False, colocated: bool = False) -> dict:
    """Run one training job on `rig` (a dataplane.rig.Rig); returns the lead's
    result dict. `progress(event)` sees every event it prints (start, iter,
    eval). `early_close`: EarlyCloseConfig fields for the LTP server (e.g.
    threshold 1.0: rounds close only complete). `faults`: kills to fire and
    the restart policy (faults.py; the result then has a "faults" entry).
    `on_hang(lines)` gets each flight-recorder screen (launcher/hangs.py; default:
    stderr); the result's "hangs" lists them. `per_node`: trainers a worker
    host (a rig without nodes); `share`: over LTP they share its device
    (each in a seat of its mux, launch.rank_settings). `colocated`: no server
    ranks; each trainer starts its own (LTP_COLOCATE=1; the job's servers are
    cfg.servers = the trainers), and any rank's death ends the job.
    Every process started here is gone when this returns or raises."""
    cfg.validate()
    W = workers or len(rig.workers)
    bad = [w for w in cfg.straggler if w >= W]
    if bad:
        raise ValueError(f"straggler: worker {bad[0]} does not exist (workers 0..{W - 1})")
    if cfg.transport == "tcp":
        ensure_cc(cfg.cc)
    servers = 0 if cfg.transport == "gloo" or colocated else cfg.servers
    fx = faults or Faults([])
    logdir = tempfile.mkdtemp(prefix=f"ltp-train-{rig.name}-")
    argv = rank_argv(cfg, rank_timeout_s, deadline_min_s, early_close)
    ok = False
    while True:      # once, or again after the server died under --restart
        try:
            ranks = plan_ranks(rig, W, servers, colocate=bool(
                servers and getattr(getattr(rig, "config", None), "colocate", False)),
                per_node=per_node)
        except ValueError as e:      # a rig of another shape; the message names the flag
            raise UsageError(f"--{e}") from None
        forkserver.warm(RANK_MODULES)   # (a no-op if `ltp train` warmed it before the rig)
        job = follow = None
        try:
            job = RigJob(rig, ranks, rank_timeout_s, group_keys=cfg.downlink == "group",
                         preload=RANK_MODULES, colocated=colocated)
            if on_hang is not None:
                job.on_hang = on_hang

            def events(ev: dict, job=job) -> None:
                fx.on_event(job, ev)
                if progress:
                    progress(ev)
            follow = Follow(ranks[servers], logdir, events)
            job.start(lambda r: argv, lambda r, job=job, ranks=ranks: job_env(
                rig, r, len(ranks), job.port, servers=servers,
                transport="tcp" if cfg.transport == "tcp" else "ltp",
                group=cfg.downlink == "group", share=share, colocated=colocated))
            result = _follow(job, follow, logdir, timeout_s, fx)
            result["startup"] = {"start_s": follow.marks.get("start"),
                                 "first_iter_s": follow.marks.get("iter"),
                                 "forked_ranks": sum(r.forked for r in ranks),
                                 "ranks": len(ranks)}
            if fx.kills or fx.restart:
                result["faults"] = fx.report()
            if job.flight.screens:
                result["hangs"] = job.flight.screens
            if job.flight.stall_summary():
                result["stalls"] = job.flight.stall_summary()
            ok = True
            return result
        except RestartJob:
            continue
        finally:
            if job is not None:
                job.close()
            if follow is not None:
                follow.close()
            if (ok and not settings_table.env("keep_logs")
                    or job is None and not os.listdir(logdir)):   # no job started: no logs
                shutil.rmtree(logdir, ignore_errors=True)


def _follow(job: RigJob, follow: Follow, logdir: str, timeout_s: float,
            faults: Faults) -> dict:
    """Pump until every rank exited with 0 (within a minute of the lead's
    result); ranks that die go to `faults` first (restarted, let go, or the
    whole job restarted: RestartJob)."""
    deadline = time.monotonic() + timeout_s
    while job.running():
        job.pump(follow)
        failed = faults.settle(job) + job.failed()
        if failed or (follow.error and not faults.restart):
            r, err = follow.error or (failed[0], None)
            job.flight.quiet = True      # the others' waits from here on are no hangs
            time.sleep(0.5)
            job.pump(follow)
            job.stop(grace_s=5.0)
            raise LaunchError(_describe(r, logdir, err))
        follow.error = None if faults.restart else follow.error
        if follow.result is not None:
            deadline = min(deadline, time.monotonic() + 60.0)
        if time.monotonic() > deadline:
            stuck = job.running()[0]
            raise LaunchError(f"rank {stuck.rank} ({stuck.label}) did not exit after training; "
                              f"logs in {logdir}" if follow.result else
                              f"training took longer than {timeout_s:g}s; logs in {logdir}")
    if follow.result is None:
        raise LaunchError(_describe(follow.lead, logdir, "exited without a result"))
    return follow.result


def process_age() -> float:
    """Seconds since this process started (its start time in /proc/self/stat,
    clock ticks since boot)."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")


def _describe(r, logdir: str, error: str | None = None) -> str:
    if error is None:
        error = _tail(os.path.join(logdir, f"rank{r.rank}.err"))
    return (f"rank {r.rank} ({r.label}, {r.host.name} in {r.host.netns}) exited with code "
            f"{r.code}: {error or 'no message'}; logs in {logdir}")


def _tail(path: str, n: int = 1) -> str:
    try:
        with open(path) as f:
            lines = [ln for ln in f.read().splitlines() if ln.strip()]
        return " | ".join(lines[-n:])[-400:]
    except OSError:
        return ""
