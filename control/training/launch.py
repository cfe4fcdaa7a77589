"""Start every rank of a training job inside a rig's namespaces and collect the result.

What torchrun does on real hosts, done on the rig: this process hosts the
rendezvous store (a TCPStore on the PS namespace's loopback, so coordination
never crosses the measured network), then starts one
`python -m ltpx.control.training` per rank with the env:// variables set
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True)
and --dev/--ip of the rank's host. Rank 0 (the PS, or gloo's first worker)
reports on stdout; the others' output goes to log files that are kept and
named when something fails.

Rigs for comparisons: every switch port is shaped and lossy alike
(shape="all", loss_on="all"); LTP runs on a native-mode rig (XDP_TX needs
XDP on the switch-side veths), TCP and gloo on an skb-mode rig, because the
switch-side XDP_PASS programs turn TSO off on the host veths and make TCP
look better than it would on a NIC (docs/rig.md).
"""
from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from typing import Callable

from ...dataplane import netns
from ...dataplane.rig.star import BROADCAST
from ...errors import LaunchError
from ..procs import stop_all
from .config import TrainConfig


def rig_mode_for(transport: str) -> str:
    return "native" if transport == "ltp" else "skb"


def rig_config(name: str, transport: str, *, workers: int, rate_bps: int, buffer_bytes: int,
               loss: float, mtu: int = 1500):
    """The RigConfig a run of `transport` should build (see the module docstring)."""
    from ...dataplane.rig.star import RigConfig
    return RigConfig(name=name, workers=workers, rate_bps=rate_bps, buffer_bytes=buffer_bytes,
                     loss=loss, shape="all", loss_on="all", mode=rig_mode_for(transport), mtu=mtu)


def rank_hosts(rig, cfg: TrainConfig, workers: int | None) -> list:
    """The rig hosts of ranks 0..: the PS (not for gloo), then the first `workers` workers."""
    cfg.validate()
    W = workers or len(rig.workers)
    if not 1 <= W <= len(rig.workers):
        raise ValueError(f"workers: rig {rig.name} has {len(rig.workers)} workers, asked for {W}")
    bad = [w for w in cfg.straggler if w >= W]
    if bad:
        raise ValueError(f"straggler: worker {bad[0]} does not exist (workers 0..{W - 1})")
    return ([] if cfg.transport == "gloo" else [rig.ps]) + list(rig.workers[:W])


def rank_argv(rig, host, cfg: TrainConfig, rank_timeout_s: float,
              deadline_min_s: float | None, early_close: dict | None) -> list[str]:
    """The command line of the rank on `host`."""
    argv = [sys.executable, "-m", "ltpx.control.training", "--config", cfg.to_json(),
            "--dev", host.ifname, "--ip", host.ip, "--xdp-mode", rig.config.mode,
            "--capacity", str(rig.config.rate_bps), "--mtu", str(rig.config.mtu),
            "--store-netns", rig.ps.netns, "--netns", host.netns,
            "--timeout", str(rank_timeout_s)]
    if cfg.downlink == "group":  # the rig's bridge floods its subnet broadcast
        argv += ["--group", BROADCAST]
    if deadline_min_s is not None:
        argv += ["--deadline-min", str(deadline_min_s)]
    if early_close:
        argv += ["--early-close", json.dumps(early_close)]
    return argv


def rank_env(rank: int, world: int, store_port: int) -> dict[str, str]:
    """env:// variables as torchrun's agent sets them (the store is the launcher's)."""
    return dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store_port),
                RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                TORCHELASTIC_USE_AGENT_STORE="True", OMP_NUM_THREADS="1",
                TORCH_CPP_LOG_LEVEL="ERROR", PYTHONUNBUFFERED="1")


def train_on_rig(rig, cfg: TrainConfig, *, workers: int | None = None,
                 progress: Callable[[dict], None] | None = None, timeout_s: float = 900.0,
                 rank_timeout_s: float = 120.0, deadline_min_s: float | None = None,
                 early_close: dict | None = None) -> dict:
    """Run one training job on `rig` (a dataplane.rig.Rig); returns rank 0's
    result dict (see ps.PsRun.result). `progress(event)` sees every event rank 0
    prints (start, iter, eval). `early_close`: EarlyCloseConfig fields for the
    LTP PS (e.g. threshold 1.0: rounds close only complete). Every process
    started here is gone when this returns or raises."""
    import torch.distributed as dist
    hosts = rank_hosts(rig, cfg, workers)
    if cfg.transport == "tcp":
        from ...dataplane.tcp_cc import ensure_cc
        ensure_cc(cfg.cc)
    with netns.inside(rig.ps.netns):
        store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=rank_timeout_s),
                              wait_for_workers=False)
    logdir = tempfile.mkdtemp(prefix=f"ltp-train-{rig.name}-")
    procs: list[subprocess.Popen] = []
    logs: list = []
    ok = False
    try:
        for r, h in enumerate(hosts):
            argv = rank_argv(rig, h, cfg, rank_timeout_s, deadline_min_s, early_close)
            err = open(os.path.join(logdir, f"rank{r}.err"), "w")
            logs.append(err)
            if r == 0:   # rank 0's stdout is followed here; the others' go to logs
                out = subprocess.PIPE
            else:
                out = open(os.path.join(logdir, f"rank{r}.out"), "w")
                logs.append(out)
            procs.append(netns.popen(h.netns, argv, env=rank_env(r, len(hosts), store.port),
                                     stdout=out, stderr=err, text=True, bufsize=1))
        result = _follow(procs, hosts, logdir, progress, timeout_s)
        _wait_exits(procs, hosts, logdir, 60.0)
        ok = True
        return result
    finally:
        stop_all(procs)
        for f in logs:
            f.close()
        del store
        if ok:
            shutil.rmtree(logdir, ignore_errors=True)


def _wait_exits(procs, hosts, logdir: str, within_s: float) -> None:
    """After the result: every rank exits, with code 0, within `within_s`."""
    end = time.monotonic() + within_s
    for r, p in enumerate(procs):
        try:
            rc = p.wait(timeout=max(1.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise LaunchError(f"rank {r} ({hosts[r].name}) did not exit after training; "
                              f"logs in {logdir}") from None
        if rc != 0:
            raise LaunchError(_describe(r, hosts[r], p, logdir))


def _follow(procs, hosts, logdir, progress, timeout_s) -> dict:
    lead = procs[0]
    deadline = time.monotonic() + timeout_s
    while True:
        for r, p in enumerate(procs[1:], start=1):
            rc = p.poll()
            if rc not in (None, 0):
                raise LaunchError(_describe(r, hosts[r], p, logdir))
        if time.monotonic() > deadline:
            raise LaunchError(f"training took longer than {timeout_s:g}s; logs in {logdir}")
        ready, _, _ = select.select([lead.stdout], [], [], 0.5)
        if not ready:
            continue
        line = lead.stdout.readline()
        if not line:
            lead.wait(timeout=10)
            raise LaunchError(_describe(0, hosts[0], lead, logdir))
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        ev = msg.get("event")
        if ev == "error":
            lead.wait(timeout=10)
            raise LaunchError(_describe(0, hosts[0], lead, logdir, msg.get("error")))
        if ev == "result":
            return msg
        if progress:
            progress(msg)


def _describe(r: int, host, p, logdir: str, error: str | None = None) -> str:
    if error is None:
        error = _last_error(os.path.join(logdir, f"rank{r}.out")) or \
            _tail(os.path.join(logdir, f"rank{r}.err"))
    where = f"{host.name} in {host.netns}"
    return f"rank {r} ({where}) exited with code {p.poll()}: {error or 'no message'}; " \
           f"logs in {logdir}"


def _last_error(path: str) -> str | None:
    try:
        with open(path) as f:
            for line in reversed(f.read().splitlines()):
                if '"error"' in line:
                    return json.loads(line).get("error")
    except (OSError, ValueError):
        pass
    return None


def _tail(path: str, n: int = 1) -> str:
    try:
        with open(path) as f:
            lines = [ln for ln in f.read().splitlines() if ln.strip()]
        return " | ".join(lines[-n:])[-400:]
    except OSError:
        return ""
