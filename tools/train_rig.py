# SPDX-License-Identifier: Apache-2.0
"""`ltp train`'s rig: its flags, the shape they ask for, and the rig of each run.

A run's shape is its workers and servers and where they sit:
- one rank per host (the default): a worker host per worker;
- `--colocate`: a server beside every worker, each rank with a device of
  its own on a node, a node's devices sharing one link (docs/deploy.md);
- `--colocate --share-nic`: no server ranks at all; each trainer starts its
  server itself (LTP_COLOCATE=1), over LTP its worker and server two seats
  of its host's one device (`in_trainers`; docs/deploy.md, Co-located servers);
- `--ranks-per-node R`: R trainers on each worker host. Over LTP's XDP path
  (ltp, ddp-ltp) each rank then needs a device of its own, on a node of R
  devices sharing one link, unless `--share-nic` seats them on their host's
  one device (the mux: docs/deploy.md, "Several ranks on one NIC"); TCP and
  gloo share a host's device as they would on real hosts.
"""
from __future__ import annotations

import dataclasses
import os

from ..control.training.config import LTP_TRANSPORTS
from . import train_text as show
from .common import UsageError
from .flags import check_colocate


def add_rig_flags(p) -> None:
    rig = p.add_argument_group("the rig")
    rig.add_argument("--colocate", action="store_true",
                     help="no server hosts: a server beside every worker, each on its node "
                     "(--servers = --workers, at most 8); over LTP each rank has a device of "
                     "its own and a node's two share one link; with --share-nic no server "
                     "ranks: each trainer starts its server itself, on its host's one device "
                     "(docs/deploy.md)")
    rig.add_argument("--ranks-per-node", type=int, default=1, metavar="R",
                     help="R trainers on each worker host (it divides --workers; default 1); "
                     "over LTP each has a device of its own on a node of R sharing one link, "
                     "unless --share-nic")
    rig.add_argument("--share-nic", action="store_true",
                     help="over LTP, a host's trainers share its one device, each rank's "
                     "program in a seat of the device's mux on a UDP port of its own; "
                     "answers to a host's several trainers go by unicast (docs/deploy.md, "
                     "Several ranks on one NIC)")
    rig.add_argument("--loss", default="0", help="drop probability on every rig port, in "
                     "[0, 1) (default 0)")
    rig.add_argument("--rate", default="1gbit", help="rate of every rig port (default 1gbit)")
    rig.add_argument("--buffer", default="30kb", help="queue of every rig port (default 30kb)")
    rig.add_argument("--mtu", type=int, default=1500,
                     help="MTU of every rig link, 1280..3500 (default 1500; larger frames "
                     "mean fewer packets for every transport)")
    rig.add_argument("--name", default=None, help="use rig NAME (built if it does not exist, "
                     "kept if it did)")


def check_shape(args) -> None:
    """--colocate, --ranks-per-node and --share-nic together (UsageError
    names the flag)."""
    r = args.ranks_per_node
    if r < 1 or args.workers % r:
        raise UsageError(f"--ranks-per-node: {r} must be at least 1 and divide --workers "
                         f"({args.workers})")
    if args.colocate:
        check_colocate(args)
    if in_trainers(args) and args.restart:
        raise UsageError("--restart: not with --colocate --share-nic (a trainer cannot rejoin "
                         "a job of several servers; `ltp launch --max-restarts` restarts such "
                         "a job whole)")
    if in_trainers(args) and any(k.startswith("server") for k in args.kill or []):
        raise UsageError("--kill: --colocate --share-nic has no server ranks; kill a trainer "
                         "(worker:ID@ITER): its server serves its slice on")


def in_trainers(args) -> bool:
    """--colocate --share-nic: no server ranks; every trainer starts its own
    server (LTP_COLOCATE=1), a run on a rig without nodes."""
    return args.colocate and args.share_nic


def needs_nodes(args, transport: str) -> bool:
    """Does a run of `transport` need a rig with nodes: a server beside each
    worker, or several LTP trainers a host each with a device of its own."""
    return (args.colocate and not args.share_nic) or (
        args.ranks_per_node > 1 and transport in LTP_TRANSPORTS and not args.share_nic)


def rig_fields(rig, args) -> dict:
    """What a run's result says of its rig and the job's shape on it."""
    c = rig.config
    return {"name": rig.name, "mode": c.mode, "rate_bps": c.rate_bps,
            "buffer_bytes": c.buffer_bytes, "loss": c.loss, "shape": c.shape,
            "loss_on": c.loss_on, "mtu": c.mtu, "servers": c.servers, "nodes": c.nodes,
            "colocated": c.colocate, "servers_in_trainers": in_trainers(args),
            "worker_hosts": len(rig.workers),
            "ranks_per_node": args.ranks_per_node,
            "share_nic": args.share_nic}


def rig_for(args, cfg, progress, *, comparing: bool, loss: float, rate: int, buffer: int):
    """(rig, cfg) of one run: the named rig if it exists (with notes on what it
    lacks; an old rig without a broadcast address makes the downlink unicast;
    under --compare, one not shaped alike for every transport), else a new
    rig built for the run's transport and shape (said when --name named it)."""
    from ..control.training.onrig import rig_config, rig_mode_for  # noqa: PLC0415 (the rig's
    from ..dataplane.rig.star import Rig  # noqa: PLC0415 (modules: not for --help)
    nodes = needs_nodes(args, cfg.transport)
    per = args.ranks_per_node
    if not (args.name and Rig.exists(args.name)):
        name = args.name or f"tr{os.getpid() % 1000000}"
        hosts = args.workers if nodes else args.workers // per
        on = f" on {hosts} hosts" if hosts != args.workers else ""
        if args.name:   # a typo must not pass for the rig the user meant
            progress.note(f"note: no rig {name} exists: building one ({args.workers} workers"
                          f"{on}, {rate / 1e6:g} Mbit/s, {buffer} B buffer, loss {loss:g}); "
                          "`ltp rig status` shows the rigs that are up")
        return Rig(rig_config(name, cfg.transport, workers=hosts, rate_bps=rate,
                              buffer_bytes=buffer, loss=loss, mtu=args.mtu,
                              servers=args.workers if nodes and args.colocate
                              else 1 if in_trainers(args) else cfg.servers,
                              nodes=args.workers // per if nodes else 0,
                              colocate=nodes and args.colocate)), cfg
    rig = Rig.attach(args.name)
    _check_kept(args, rig, cfg, nodes)
    if cfg.downlink == "group" and not rig.has_broadcast():
        cfg = dataclasses.replace(cfg, downlink="unicast")
        progress.note(f"note: rig {args.name} predates group sends (no broadcast "
                      "address); the parameter downlink is unicast. Rebuild it "
                      "(ltp rig down / up) for --downlink group")
    if comparing and (rig.config.mode != rig_mode_for(cfg.transport)
                      or rig.config.shape != "all"):
        progress.note(f"note: rig {args.name} is {rig.config.mode} mode, shape "
                      f"{rig.config.shape}; {show.label(cfg.transport, cfg.cc)} compares fairly "
                      f"on a {rig_mode_for(cfg.transport)}-mode rig with shape all "
                      "(docs/rig.md, docs/training.md)")
    return rig, cfg


def _check_kept(args, rig, cfg, nodes: bool) -> None:
    """A kept rig (--name that exists) has the shape the run needs."""
    c, per = rig.config, args.ranks_per_node
    if (args.colocate and not args.share_nic) != c.colocate:
        raise UsageError(f"--colocate: rig {args.name} has " + (
            f"a server beside each of its {c.workers} workers, on nodes: "
            + ("--colocate --share-nic starts no server ranks and needs a rig without nodes"
               if in_trainers(args) else "add --colocate")
            if c.colocate else "no server beside each worker: build one with `ltp rig up "
            "--workers W --servers W --nodes W --colocate`") + ", or use another rig")
    if c.nodes and args.workers != c.workers:
        raise UsageError(f"--workers: rig {args.name} has {c.nodes} nodes of "
                         f"{c.workers // c.nodes} workers; a job on it takes all {c.workers}")
    if per > 1 and nodes and c.nodes != args.workers // per:
        raise UsageError(f"--ranks-per-node: rig {args.name} has " + (
            f"{c.nodes} nodes" if c.nodes else "no nodes") + f"; this run needs "
            f"{args.workers // per} nodes of {per} (`ltp rig up --workers {args.workers} "
            f"--nodes {args.workers // per}"
            + (f" --servers {args.workers} --colocate`)" if args.colocate
               else "`), or --share-nic"))
    if per > 1 and not nodes and c.nodes:
        raise UsageError(f"--ranks-per-node: rig {args.name} has nodes (a device for every "
                         f"rank); {per} trainers sharing a host's device need a rig without "
                         f"(`ltp rig up --workers {args.workers // per}`)")
    hosts = args.workers if nodes else args.workers // per
    if len(rig.workers) < hosts:
        raise UsageError(f"--workers: rig {args.name} has only {len(rig.workers)} "
                         f"worker hosts, asked for {hosts}")
    if cfg.servers > 1 and not in_trainers(args) and len(rig.servers) < cfg.servers:
        raise UsageError(f"--servers: rig {args.name} has {len(rig.servers)} server host(s), "
                         f"asked for {cfg.servers} (`ltp rig up --servers {cfg.servers}`)")
