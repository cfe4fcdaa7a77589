# SPDX-License-Identifier: Apache-2.0
"""`ltp train`: parameter-server training on a netns rig, over LTP or a baseline.

Builds a rig (every port shaped and lossy alike; native mode for LTP and
ddp-ltp, skb mode for TCP and gloo) or uses a named one, starts one rank per
host inside the namespaces (the PS and N workers; gloo: N workers; ddp-ltp:
N DDP trainers and the server of the `ltp` backend), trains the built-in
MLP on scikit-learn's digits, shows progress on stderr and prints a summary.
`--compare tcp` runs a baseline after the main run, on its own rig, with the
same seed, data and model, and prints them side by side. See docs/training.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from ..control.settings_table import TABLE
from ..control.training import RANK_MODULES
from ..control.training.args import add_train_flags
from ..control.training.config import CAPABILITIES, LTP_TRANSPORTS
from . import train_text as show
from .train_rig import add_rig_flags, check_shape, in_trainers, rig_fields, rig_for
from .flags import MAX_WORKERS
from .common import (EXIT_ERROR, LtpError, UsageError, add_json, emit, need_bcc, need_root,
                     parse_rate, parse_size)

CCS = ("cubic", "bbr", "reno")   # the congestion controls --cc and --compare tcp:CC take

EPILOG = """examples:
  sudo ltp train                                  LTP, 4 workers, 3 epochs, bsp
  sudo ltp train --compare tcp                    LTP, then TCP cubic, side by side
  sudo ltp train --workers 8 --loss 0.01 --compare tcp:cubic,tcp:bbr,gloo -j
  sudo ltp train --transport ddp-ltp --compare gloo -j   (stock DDP over the `ltp`
      backend against DDP over gloo: the same job, one backend string apart)
  sudo ltp train --sync wbsp --straggler 1:3      fast workers keep computing
  sudo ltp train --transport tcp --cc bbr --epochs 5
  sudo ltp train --downlink unicast               parameters sent to each worker in turn
  sudo ltp train --workers 8 --servers 2 --compare ltp:servers=1,tcp:cubic
                                                  2 sharded servers, against 1 and TCP x2
  sudo ltp train --rate 100mbit --compare ltp,ltp:compress=uint8,tcp:cubic:compress=uint8
                                                  float32 against 8-bit codes, LTP and TCP
  sudo ltp train --sender socket --compare ltp:sender=xdp
                                                  the paced socket sender against the ACK clock
  sudo ltp train --loss 0.1 --compare ltp,ltp:loss_policy=repair
                                                  the loss policy (auto: it tolerates loss as
                                                  it measures it) against repairing every loss
  sudo ltp train --loss 0.2 --loss-policy defer --loss-budget 0.7
                                                  heavy loss, fixed from the first step: rounds
                                                  closed after one pass, answers sent once
  sudo ltp train --name myrig                     use rig `myrig` (ltp rig up --name myrig)
  sudo ltp train --workers 8 --ranks-per-node 2 --share-nic --compare gloo
                                                  2 trainers a host, sharing its one device
  sudo ltp train --workers 4 --colocate --share-nic --compare gloo
                                                  no server ranks: each trainer sums a slice
                                                  itself, on its host's one device
  sudo ltp train --compare tcp --plot curves.png --tensorboard runs/
  sudo ltp train --transport ddp-ltp --hidden 2048,2048 --floors -j
                                                  where a step's time goes (breakdown),
                                                  beside the host's floors

Ranks start as `python -m ltpx.control.training` with torch.distributed env://
variables, so the same entry point runs under torchrun on real hosts (rank 0 = PS;
docs/training.md). Rigs: shape and loss on every port; LTP on a native-mode rig,
TCP and gloo on an skb-mode rig (docs/rig.md explains why).
"""


def register(sub) -> None:
    p = sub.add_parser("train", help="train a model over LTP (or TCP / gloo) on a netns rig",
                       description="Parameter-server training of an MLP on scikit-learn's digits "
                       "over LTP, TCP or gloo all-reduce, on a network-namespace rig.",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    p.add_argument("--workers", type=int, default=4, help="workers (default 4; 1..64)")
    add_train_flags(p)   # shared with every rank (python -m ltpx.control.training)
    add_rig_flags(p)
    p.add_argument("--compare", default="none", metavar="LIST",
                   help="baselines to run after the main run, comma-separated: ltp, tcp, "
                   "tcp:CC, gloo, ddp-ltp, each optionally with :KEY=VALUE settings ("
                   + ", ".join(f"{k}={TABLE[k].span()}"
                               for k in COMPARE_KEYS) + "), e.g. "
                   "ltp:servers=1,tcp:cubic:servers=2 (default none; "
                   "a run takes the main run's settings unless it names them; an item equal to "
                   "the main run names it: ltp,ltp:compress=uint8)")
    p.add_argument("--timeout", type=float, default=900.0, help="give up after this many "
                   "seconds per run (default 900)")
    fx = p.add_argument_group("faults (the main run; docs/training.md, Faults)")
    fx.add_argument("--kill", action="append", metavar="ROLE:ID@ITER",
                    help="SIGKILL a rank once the lead reports iteration ITER: worker:2@10, "
                    "server:0@20 (repeatable; LTP or TCP)")
    fx.add_argument("--restart", action="store_true",
                    help="start a dead worker again (it rejoins with the current state); a "
                    "dead server, or any dead rank of a sharded job (--servers > 1), restarts "
                    "the job (it resumes from --checkpoint-dir)")
    p.add_argument("--floors", action="store_true",
                   help="after the runs, measure the host's floors (memcpy and streaming "
                   "add, one loopback TCP stream: about 3 s) and set each run's step "
                   "breakdown beside them and the rig's line rate (docs/training.md)")
    out = p.add_argument_group("curves")
    out.add_argument("--tensorboard", metavar="DIR", default=None,
                     help="write TensorBoard scalars as the runs go, one folder per run "
                     "(DIR/ltp, DIR/tcp-cubic, ...)")
    out.add_argument("--plot", metavar="FILE.png", default=None,
                     help="draw accuracy and loss against training time, one line per run "
                     "(.png, .svg or .pdf)")
    add_json(p)
    p.set_defaults(func=cmd_train)


# --------------------------------------------------------------------------- validation

def _runs_main(args) -> dict:
    """The main run's settings."""
    ltp = args.transport in LTP_TRANSPORTS
    return {"transport": args.transport, "cc": args.cc, "servers": args.servers,
            "compress": args.compress,
            "sender": args.sender if args.transport == "ltp" else NO_SENDER,
            "loss_policy": args.loss_policy if ltp else TABLE["loss_policy"].default,
            "loss_budget": args.loss_budget if ltp else 0.0}


def _runs(args) -> list[dict]:
    """The runs to make: the main one, then each --compare item."""
    main = _runs_main(args)
    runs = [main]
    if args.compare.strip().lower() in ("", "none"):
        return runs
    for i, item in enumerate(args.compare.split(",")):
        run = _compare_item(item.strip().lower(), args)
        if i == 0 and _run_key(run) == _run_key(main):
            continue   # the main run, named first: --compare ltp,ltp:compress=uint8
        if _run_key(run) in [_run_key(r) for r in runs]:
            raise UsageError(f"--compare: {item.strip()!r} is already in the runs")
        runs.append(run)
    return runs


# --compare KEY=VALUE settings (their types, bounds and choices: the settings table)
COMPARE_KEYS = ("servers", "compress", "sender", "loss_policy", "loss_budget")
NO_SENDER = show.NO_SENDER


def _compare_value(key: str, text: str):
    """A --compare item's KEY=VALUE value, or None if the setting cannot take it."""
    s = TABLE[key]
    try:
        value = s.read(text)
    except ValueError:
        return None
    return None if s.problem(value) else value


def _compare_item(item: str, args) -> dict:
    """One --compare item, TRANSPORT[:CC][:KEY=VALUE...], as a run dict."""
    tr, *parts = item.split(":")
    can, ltp = CAPABILITIES.get(tr), tr in LTP_TRANSPORTS
    run = {"transport": tr, "cc": args.cc,
           "servers": args.servers if can and can.servers else 1,
           "compress": args.compress if can and can.compress else "none",
           "sender": args.sender if ltp else NO_SENDER,
           "loss_policy": args.loss_policy if ltp else TABLE["loss_policy"].default,
           "loss_budget": args.loss_budget if ltp else 0.0}
    usage = (f"--compare: cannot read {item!r} (items: ltp, tcp, tcp:{'|'.join(CCS)}, gloo, "
             "ddp-ltp, "
             f"each with optional :KEY=VALUE, keys {', '.join(COMPARE_KEYS)})")
    if can is None:
        raise UsageError(usage)
    for i, part in enumerate(parts):
        key, eq, val = part.partition("=")
        if not eq:
            if i or tr != "tcp" or part not in CCS:
                raise UsageError(usage)
            run["cc"] = part
        elif key not in COMPARE_KEYS:
            raise UsageError(usage)
        elif _compare_value(key, val) is None:
            raise UsageError(f"--compare: {item!r}: {key} must be {TABLE[key].takes()}")
        else:
            run[key] = _compare_value(key, val)
    run["item"] = item
    return run


def _run_key(run: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in run.items()
                        if k != "item" and (k != "cc" or run["transport"] == "tcp")))


def _run_config(args, run: dict):
    """The TrainConfig a run trains with: the flags' config for its transport,
    with the run's own settings, checked by TrainConfig.validate (what each
    transport allows: the one table, config.CAPABILITIES); ValueError names
    the flag."""
    from ..control.training.args import config_from_args
    cfg = config_from_args(args, transport=run["transport"], cc=run["cc"])
    cfg = dataclasses.replace(cfg, servers=run["servers"], compress=run["compress"],
                              sender=run["sender"], loss_policy=run["loss_policy"],
                              loss_budget=run["loss_budget"])
    try:
        cfg.validate()
    except ValueError as e:     # its messages start with the field: make that the flag
        raise ValueError(f"--{e}") from None
    return cfg


def _check_run(args, run: dict) -> None:
    """A --compare item's run, checked before anything runs; its error names the item."""
    try:
        _run_config(args, run)
    except ValueError as e:
        raise UsageError(f"--compare: {run['item']!r}: {e}") from None


def _validate(args) -> tuple:
    """(loss, rate, buffer, runs) from the flags; UsageError names a bad one."""
    from ..control.training.args import config_from_args
    if not 1 <= args.workers <= MAX_WORKERS:
        raise UsageError(f"--workers: must be in 1..{MAX_WORKERS}, got {args.workers}")
    check_shape(args)
    try:
        loss = float(args.loss)
    except ValueError:
        raise UsageError(f"--loss: cannot read {args.loss!r} (a probability, e.g. 0.01)") from None
    if not 0.0 <= loss < 1.0:
        raise UsageError(f"--loss: must be in [0, 1), got {args.loss}")
    rate = parse_rate(args.rate, "--rate")
    buffer = parse_size(args.buffer, "--buffer")
    if not args.timeout > 0:
        raise UsageError(f"--timeout: must be positive seconds, got {args.timeout}")
    if args.cc not in CCS:
        raise UsageError(f"--cc: one of {', '.join(CCS)}, got {args.cc!r}")
    try:
        cfg = config_from_args(args)   # every shared training flag, checked once
        # and the main run's LTP settings as given (config_from_args leaves out
        # what its transport cannot take: a --compare item inherits them so)
        _run_config(args, {**_runs_main(args), "sender": args.sender,
                           "loss_policy": args.loss_policy, "loss_budget": args.loss_budget})
    except ValueError as e:
        raise UsageError(str(e)) from None
    bad = [w for w in cfg.straggler if w >= args.workers]
    if bad:
        raise UsageError(f"--straggler: worker {bad[0]} does not exist (--workers "
                         f"{args.workers}: 0..{args.workers - 1})")
    runs = _runs(args)
    for run in runs[1:]:
        _check_run(args, run)
    odd = [r for r in runs if args.colocate and r["transport"] != "gloo"
           and r["servers"] != args.workers]
    if odd:
        raise UsageError(f"--colocate: every run has a server beside each of the "
                         f"{args.workers} workers; {odd[0]['transport']} asks for "
                         f"servers={odd[0]['servers']}")
    defer = [r for r in runs if in_trainers(args) and r["loss_policy"] == "defer"
             and r["transport"] in LTP_TRANSPORTS]
    if defer:
        raise UsageError(f"--colocate --share-nic: {defer[0]['transport']} with loss_policy "
                         "defer (a trainer's own slice and answer are handed over whole, which "
                         "tolerant answers do not cover): use loss_policy auto or repair")
    from ..control.training.faults import parse_kills
    try:
        args.kills = parse_kills(args.kill, args.workers, runs[0]["servers"])
    except ValueError as e:
        raise UsageError(str(e)) from None
    main_transport = runs[0]["transport"]
    if args.restart and main_transport not in ("ltp", "tcp"):
        raise UsageError("--restart: the main run must be LTP or TCP (--transport ltp|tcp)")
    if args.kills and main_transport not in ("ltp", "tcp"):
        raise UsageError("--kill: the main run must be LTP or TCP (--transport ltp|tcp)")
    from ..control.training.curves import check_outputs
    check_outputs(args.tensorboard, args.plot)
    from ..dataplane.rig.star import RigConfig
    try:   # the rig's own range checks; its messages start with the field's name
        RigConfig(name=args.name or "check", workers=args.workers, rate_bps=rate,
                  buffer_bytes=buffer, loss=loss, mtu=args.mtu)
    except ValueError as e:
        raise UsageError(f"--{e}") from None
    return loss, rate, buffer, runs


# --------------------------------------------------------------------------- running

def cmd_train(args) -> int:
    loss, rate, buffer, runs = _validate(args)
    need_root("ltp train")
    if any(r["transport"] in LTP_TRANSPORTS for r in runs):
        need_bcc()
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")   # before torch is imported
    from ..control.launcher import forkserver
    forkserver.warm(RANK_MODULES)   # the ranks' imports, while the rig is built
    from ..control.training.curves import Curves

    results = []
    progress = show.RunBars(quiet=False)
    curves = Curves(args.tensorboard, args.plot)

    def on_event(ev: dict) -> None:
        progress.event(ev)
        curves.event(ev)
    try:   # a run that fails is reported with the others (LaunchError, RigError: LtpErrors)
        for run in runs:
            try:
                res = _one_run(args, run, run is runs[0], progress, on_event, curves,
                               loss=loss, rate=rate, buffer=buffer)
            except UsageError:
                raise
            except LtpError as e:
                if len(runs) == 1:
                    raise
                res = show.failed_run(run, str(e))
                progress.note(f"{show.label_of(res)}: failed: {e}")
            results.append(res)
    finally:
        progress.close()
        written = curves.close()
    if args.floors:
        _floors(args, results, rate)
    out = {k: v for k, v in results[0].items() if k != "event"}
    if written:
        out["plot"] = written
    if args.tensorboard:
        out["tensorboard"] = args.tensorboard
    if len(results) > 1:
        out["compare"] = results[1:]
        out["speedup"] = {show.label_of(r): show.ratio(results[0], r) for r in results[1:]}
    failed = [r for r in results if "error" in r]
    if failed:
        out["failed"] = [show.label_of(r) for r in failed]
    emit(args, out, lambda o: show.text(results, args, loss, rate, buffer))
    if failed:   # said on stderr only: stdout holds the one JSON document above
        print(f"ltp: error: {len(failed)} of {len(results)} runs failed ("
              + "; ".join(f"{show.label_of(r)}: {r['error']}" for r in failed)
              + "); the other runs' results are above", file=sys.stderr)
        return EXIT_ERROR
    broken = [r for r in results if not r.get("replicas_identical")]
    if broken:
        raise LtpError(f"{show.label_of(broken[0])}: the PS and the workers ended with "
                       f"different parameters ({broken[0]['worker_digests']})")
    return 0


def _floors(args, results: list[dict], rate: int) -> None:
    """The host's floors now (control/bench/floors.py), in every run's result,
    and each breakdown over them."""
    from ..control.bench import floors
    fl = floors.measure(rate)
    for r in results:
        if "error" in r:
            continue
        r["floors"] = fl
        if r.get("breakdown"):
            step = floors.per_step(fl, r["params"], r["workers"], r.get("servers", 1))
            r["breakdown"]["vs_floors"] = floors.against(r["breakdown"], step)


def _one_run(args, run: dict, main: bool, progress, on_event, curves, *, loss: float,
             rate: int, buffer: int) -> dict:
    """Train one of the runs on its rig; its result, with the rig it had."""
    from ..control.training.curves import run_label
    from ..control.training.onrig import train_on_rig
    cfg = _run_config(args, run)
    rig, cfg = rig_for(args, cfg, progress, comparing=len(_runs(args)) > 1, loss=loss,
                       rate=rate, buffer=buffer)
    label = show.label(cfg.transport, cfg.cc, cfg.servers, cfg.compress, cfg.sender,
                       cfg.loss_policy, cfg.loss_budget)
    progress.begin(label)
    curves.begin(run_label(label))
    faults = None
    colocated = in_trainers(args) and cfg.transport != "gloo"   # trainers only: no server ranks
    if main and (args.kills or args.restart):
        from ..control.training.faults import Faults
        faults = Faults(args.kills, restart=args.restart, servers=0 if colocated else cfg.servers)
    with rig:
        res = train_on_rig(rig, cfg, workers=args.workers, progress=on_event, faults=faults,
                           timeout_s=args.timeout, deadline_min_s=args.deadline_min,
                           per_node=args.ranks_per_node, share=args.share_nic,
                           colocated=colocated)
        res["rig"] = rig_fields(rig, args)
        res["servers"] = cfg.servers
        res["compress"] = cfg.compress
        res["sender"] = cfg.sender
        res["loss_policy"] = cfg.loss_policy
        res["loss_budget"] = cfg.loss_budget
    progress.end(res)
    return res


if __name__ == "__main__":  # pragma: no cover
    from .cli import main
    sys.exit(main(["train", *sys.argv[1:]]))
