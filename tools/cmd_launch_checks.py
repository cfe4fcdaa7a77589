# SPDX-License-Identifier: Apache-2.0
"""`ltp launch`'s flags checked before anything is built: each bad one a
UsageError that names it (exit 2), then the command itself (a program or
script no rank could run). Also the job's shape: `--ranks-per-node` (R
workers sharing a host's device) and `--colocate` (a server beside every
worker, no server hosts), which the LTP transport cannot run yet."""
from __future__ import annotations

import os
import shutil

from .common import UsageError
from .flags import (check_bytes, check_colocate, check_loss, check_name, check_rate,
                    check_workers)


def check_runnable(cmd: list[str]) -> None:
    """A usage error, before any rig is built, for a command no rank could run:
    a program not on PATH (or not executable), a Python script that is not
    there. `python -m MODULE` and `python -c CODE` are left to the ranks."""
    from ..control.launcher.launch import python_argv
    argv = python_argv(cmd)
    if argv != cmd:     # `python ...` or a .py script: this interpreter runs it
        args = iter(argv[1:])
        for a in args:
            if a in ("-m", "-c"):
                return
            if a in ("-X", "-W"):       # interpreter options that take a value
                next(args, None)
            elif not a.startswith("-"):
                if not os.path.isfile(a):
                    raise UsageError(f"launch: no such script: {a} (from {os.getcwd()})")
                return
        return
    prog = argv[0]
    found = (os.path.isfile(prog) and os.access(prog, os.X_OK)) if "/" in prog \
        else shutil.which(prog) is not None
    if not found:
        raise UsageError(f"launch: cannot run {prog!r}: "
                         + ("no such executable file" if "/" in prog else "not found on PATH"))


def nodes_rig(args) -> bool:
    """Does the job's shape need a rig with nodes: over LTP, ranks on one
    node (`--ranks-per-node`) or a server beside each worker, each rank with
    a device of its own (an endpoint owns its device's XDP program). A script
    without LTP (`--servers 0`: gloo, nccl) shares a node's one device, as
    over TCP."""
    return args.transport == "ltp" and args.servers > 0 and not args.share_nic and \
        (args.ranks_per_node > 1 or args.colocate)


def check_per_node(args) -> None:
    """--ranks-per-node: it divides --workers."""
    r = args.ranks_per_node
    if r < 1 or args.workers % r:
        raise UsageError(f"--ranks-per-node: {r} must be at least 1 and divide --workers "
                         f"({args.workers})")


def check_kept_shape(args, rig) -> None:
    """A kept rig (`--rig NAME` that exists) has the shape the flags ask for:
    nodes of --ranks-per-node ranks for a job that needs them (nodes_rig), a
    server beside each worker for --colocate over LTP."""
    c = rig.config
    if nodes_rig(args) and (not c.nodes or c.workers // c.nodes != args.ranks_per_node):
        raise UsageError(f"--rig: rig {rig.name} has " + (
            f"nodes of {c.workers // c.nodes} workers" if c.nodes else "no nodes")
            + f"; over LTP this job needs {args.workers // args.ranks_per_node} nodes of "
            f"{args.ranks_per_node} (`ltp rig up --workers {args.workers} --nodes "
            f"{args.workers // args.ranks_per_node}"
            + (f" --servers {args.workers} --colocate" if args.colocate else "") + "`)")
    if nodes_rig(args) and args.colocate and not c.colocate:
        raise UsageError(f"--colocate: rig {rig.name} has no server beside each worker "
                         f"(`ltp rig up --workers {args.workers} --nodes "
                         f"{args.workers // args.ranks_per_node} --servers {args.workers} "
                         "--colocate`)")


def check_args(args) -> list[str]:
    """The command to run, after every flag's check (UsageError names the flag)."""
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("launch: give the command after --, e.g. "
                         "`ltp launch --workers 2 -- python train.py`")
    check_workers(args.workers)
    check_name(args.rig, "--rig")
    if args.timeout < 0 or args.grace < 0:
        raise UsageError("--timeout and --grace: seconds, at least 0")
    if args.max_restarts < 0:
        raise UsageError(f"--max-restarts: a count, at least 0, got {args.max_restarts}")
    args.rate_bps, args.loss_p = check_rate(args.rate), check_loss(args.loss)
    check_per_node(args)
    if args.share_nic and args.colocate and args.transport != "ltp":
        raise UsageError("--share-nic with --colocate: over LTP only (its servers in the "
                         "trainers' processes); over TCP leave out --share-nic")
    if args.colocate:
        check_colocate(args)
    args.buffer_bytes = check_bytes(args.buffer, "--buffer")
    from ..control.training.onrig import rig_config
    nodes = nodes_rig(args)
    hosts = args.workers if nodes else args.workers // args.ranks_per_node
    try:   # the rig's own range checks; its messages start with the field's name
        args.rig_config = rig_config(args.rig or "check", args.transport,
                                     workers=hosts, rate_bps=args.rate_bps,
                                     buffer_bytes=args.buffer_bytes, loss=args.loss_p,
                                     mtu=args.mtu,
                                     servers=(args.servers if nodes else 1) if args.colocate
                                     else max(1, args.servers),
                                     nodes=args.workers // args.ranks_per_node if nodes else 0,
                                     colocate=nodes and args.colocate)
    except ValueError as e:
        raise UsageError(f"--{e}") from None
    if args.trace is not None:
        folder = os.path.dirname(os.path.abspath(args.trace))
        if not args.trace or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise UsageError(f"--trace: cannot write {args.trace!r} (its folder {folder} is "
                             "not a writable directory)")
    check_runnable(cmd)     # after the flags: a bad flag is named first
    return cmd
