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
from ..control.training.args import add_train_flags
from ..control.training.faults import fault_lines
from .flags import MAX_WORKERS
from .common import (LtpError, UsageError, add_json, emit, need_bcc, need_root, parse_rate,
                     parse_size)

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
  sudo ltp train --name myrig                     use rig `myrig` (ltp rig up --name myrig)
  sudo ltp train --compare tcp --plot curves.png --tensorboard runs/

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
    rig = p.add_argument_group("the rig")
    rig.add_argument("--loss", default="0", help="drop probability on every rig port, in "
                     "[0, 1) (default 0)")
    rig.add_argument("--rate", default="1gbit", help="rate of every rig port (default 1gbit)")
    rig.add_argument("--buffer", default="30kb", help="queue of every rig port (default 30kb)")
    rig.add_argument("--mtu", type=int, default=1500,
                     help="MTU of every rig link, 1280..3500 (default 1500; larger frames "
                     "mean fewer packets for every transport)")
    rig.add_argument("--name", default=None, help="use rig NAME (built if it does not exist, "
                     "kept if it did)")
    p.add_argument("--compare", default="none", metavar="LIST",
                   help="baselines to run after the main run, comma-separated: ltp, tcp, "
                   "tcp:CC, gloo, ddp-ltp, each optionally with :KEY=VALUE settings ("
                   + ", ".join(f"{k}={'|'.join(TABLE[k].choices) or TABLE[k].takes()[3:]}"
                               for k in COMPARE_KEYS) + "), e.g. "
                   "ltp:servers=1,tcp:cubic:servers=2 (default none; "
                   "a run takes the main run's settings unless it names them; an item equal to "
                   "the main run names it: ltp,ltp:compress=uint8)")
    p.add_argument("--timeout", type=float, default=900.0, help="give up after this many "
                   "seconds per run (default 900)")
    fx = p.add_argument_group("faults (the main run; docs/training.md, Faults)")
    fx.add_argument("--kill", action="append", metavar="ROLE:ID@ITER",
                    help="SIGKILL a rank once the lead reports iteration ITER: worker:2@10, "
                    "server:0@20 (repeatable)")
    fx.add_argument("--restart", action="store_true",
                    help="start a dead worker again (it rejoins with the current state); a "
                    "dead server, or any dead rank of a sharded job (--servers > 1), restarts "
                    "the job (it resumes from --checkpoint-dir)")
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

def _runs(args) -> list[dict]:
    """The runs to make: the main one, then each --compare item."""
    main = {"transport": args.transport, "cc": args.cc, "servers": args.servers,
            "compress": args.compress,
            "sender": args.sender if args.transport == "ltp" else NO_SENDER}
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
COMPARE_KEYS = ("servers", "compress", "sender")
NO_SENDER = TABLE["sender"].default   # a run without LTP: the sender is not its to name


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
    run = {"transport": tr, "cc": args.cc, "servers": 1 if tr == "gloo" else args.servers,
           "compress": "none" if tr == "gloo" else args.compress,
           "sender": args.sender if tr in ("ltp", "ddp-ltp") else NO_SENDER}
    usage = (f"--compare: cannot read {item!r} (items: ltp, tcp, tcp:{'|'.join(CCS)}, gloo, "
             "ddp-ltp, "
             f"each with optional :KEY=VALUE, keys {', '.join(COMPARE_KEYS)})")
    if tr not in ("ltp", "tcp", "gloo", "ddp-ltp"):
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
    if run["sender"] == "xdp" and tr not in ("ltp", "ddp-ltp"):
        raise UsageError(f"--compare: {item!r}: sender={run['sender']} is LTP's (the ACK clock)")
    return run


def _run_key(run: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in run.items()
                        if k != "cc" or run["transport"] == "tcp"))


def _validate(args) -> tuple:
    """(loss, rate, buffer, runs) from the flags; UsageError names a bad one."""
    from ..control.training.args import config_from_args
    if not 1 <= args.workers <= MAX_WORKERS:
        raise UsageError(f"--workers: must be in 1..{MAX_WORKERS}, got {args.workers}")
    if args.sender == "xdp" and args.transport not in ("ltp", "ddp-ltp"):
        raise UsageError(f"--sender {args.sender}: the ACK clock is LTP's (--transport ltp "
                         "or ddp-ltp)")
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
    except ValueError as e:
        raise UsageError(str(e)) from None
    bad = [w for w in cfg.straggler if w >= args.workers]
    if bad:
        raise UsageError(f"--straggler: worker {bad[0]} does not exist (--workers "
                         f"{args.workers}: 0..{args.workers - 1})")
    runs = _runs(args)
    from ..control.training.faults import parse_kills
    try:
        args.kills = parse_kills(args.kill, args.workers)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if (args.kills or args.restart) and runs[0]["transport"] != "ltp":
        raise UsageError("--kill/--restart: the main run must be LTP (--transport ltp)")
    if args.kills and not args.restart and runs[0]["servers"] > 1:
        raise UsageError("--kill with --servers > 1 needs --restart: a sharded job cannot go on "
                         "without a worker (every rank is started again)")
    if any(r["transport"] == "gloo" and r["servers"] > 1 for r in runs):
        raise UsageError("--servers: gloo all-reduce has no servers (run gloo with --servers 1, "
                         "or compare ltp:servers=S and tcp:servers=S)")
    if any(r["transport"] == "gloo" and r["compress"] != "none" for r in runs):
        raise UsageError("--compress: gloo all-reduce sends float32 (compare ltp:compress=uint8 "
                         "and tcp:compress=uint8)")
    from ..control.training.curves import check_outputs
    check_outputs(args.tensorboard, args.plot)
    if args.sync == "wbsp" and any(r["transport"] in ("gloo", "ddp-ltp") for r in runs):
        raise UsageError("--sync wbsp needs a parameter server's own API: DDP (--transport/"
                         "--compare gloo or ddp-ltp) is bsp only")
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
    if any(r["transport"] in ("ltp", "ddp-ltp") for r in runs):
        need_bcc()
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")   # before torch is imported
    from ..control.training import forkserver
    forkserver.warm()          # the ranks' imports, while the rig is built
    from ..control.training.args import config_from_args
    from ..control.training.curves import Curves, run_label
    from ..control.training.onrig import train_on_rig

    results = []
    progress = _Progress(quiet=False)
    curves = Curves(args.tensorboard, args.plot)

    def on_event(ev: dict) -> None:
        progress.event(ev)
        curves.event(ev)
    try:   # LaunchError, RigError, BenchError are LtpErrors: common.run reports them
        for run in runs:
            cfg = config_from_args(args, transport=run["transport"], cc=run["cc"])
            cfg = dataclasses.replace(cfg, servers=run["servers"], compress=run["compress"],
                                      sender=run["sender"])
            rig, cfg = _rig_for(args, cfg, progress, loss=loss, rate=rate, buffer=buffer)
            label = _label(cfg.transport, cfg.cc, cfg.servers, cfg.compress, cfg.sender)
            progress.begin(label)
            curves.begin(run_label(label))
            faults = None
            if run is runs[0] and (args.kills or args.restart):
                from ..control.training.faults import Faults
                faults = Faults(args.kills, restart=args.restart, servers=cfg.servers)
            with rig:
                res = train_on_rig(rig, cfg, workers=args.workers,
                                   progress=on_event, faults=faults,
                                   timeout_s=args.timeout, deadline_min_s=args.deadline_min)
                res["rig"] = {"name": rig.name, "mode": rig.config.mode,
                              "rate_bps": rig.config.rate_bps,
                              "buffer_bytes": rig.config.buffer_bytes, "loss": rig.config.loss,
                              "shape": rig.config.shape, "loss_on": rig.config.loss_on,
                              "mtu": rig.config.mtu, "servers": rig.config.servers}
                res["servers"] = cfg.servers
                res["compress"] = cfg.compress
                res["sender"] = cfg.sender
            progress.end(res)
            results.append(res)
    finally:
        progress.close()
        written = curves.close()
    out = {k: v for k, v in results[0].items() if k != "event"}
    if written:
        out["plot"] = written
    if args.tensorboard:
        out["tensorboard"] = args.tensorboard
    if len(results) > 1:
        out["compare"] = results[1:]
        out["speedup"] = {_label(r["transport"], r.get("cc"), r.get("servers", 1),
                                 r.get("compress", "none"), r.get("sender", "socket")):
                          _ratio(results[0], r) for r in results[1:]}
    emit(args, out, lambda o: _text(results, args, loss, rate, buffer))
    broken = [r for r in results if not r.get("replicas_identical")]
    if broken:
        raise LtpError(f"{_label(broken[0]['transport'], broken[0].get('cc'))}: the PS and the "
                       f"workers ended with different parameters ({broken[0]['worker_digests']})")
    return 0


def _rig_for(args, cfg, progress, *, loss: float, rate: int, buffer: int):
    """(rig, cfg) of one run: the named rig if it exists (with notes on what it
    lacks; an old rig without a broadcast address makes the downlink unicast;
    under --compare, one not shaped alike for every transport), else a new
    rig built for the run's transport (said when --name named it)."""
    from ..control.training.onrig import rig_config, rig_mode_for
    from ..dataplane.rig.star import Rig
    if not (args.name and Rig.exists(args.name)):
        name = args.name or f"tr{os.getpid() % 1000000}"
        if args.name:   # a typo must not pass for the rig the user meant
            progress.note(f"note: no rig {name} exists: building one ({args.workers} workers, "
                          f"{rate / 1e6:g} Mbit/s, {buffer} B buffer, loss {loss:g}); "
                          "`ltp rig status` shows the rigs that are up")
        return Rig(rig_config(name, cfg.transport, workers=args.workers, rate_bps=rate,
                              buffer_bytes=buffer, loss=loss, mtu=args.mtu,
                              servers=cfg.servers)), cfg
    rig = Rig.attach(args.name)
    if len(rig.workers) < args.workers:
        raise UsageError(f"--workers: rig {args.name} has only {len(rig.workers)} "
                         f"workers, asked for {args.workers}")
    if cfg.servers > 1 and len(rig.servers) < cfg.servers:
        raise UsageError(f"--servers: rig {args.name} has {len(rig.servers)} server host(s), "
                         f"asked for {cfg.servers} (`ltp rig up --servers {cfg.servers}`)")
    if cfg.downlink == "group" and not rig.has_broadcast():
        cfg = dataclasses.replace(cfg, downlink="unicast")
        progress.note(f"note: rig {args.name} predates group sends (no broadcast "
                      "address); the parameter downlink is unicast. Rebuild it "
                      "(ltp rig down / up) for --downlink group")
    comparing = len(_runs(args)) > 1     # fairness matters only between runs
    if comparing and (rig.config.mode != rig_mode_for(cfg.transport)
                      or rig.config.shape != "all"):
        progress.note(f"note: rig {args.name} is {rig.config.mode} mode, shape "
                      f"{rig.config.shape}; {_label(cfg.transport, cfg.cc)} compares fairly "
                      f"on a {rig_mode_for(cfg.transport)}-mode rig with shape all "
                      "(docs/rig.md, docs/training.md)")
    return rig, cfg


def _label(transport: str, cc: str | None, servers: int = 1, compress: str = "none",
           sender: str = NO_SENDER) -> str:
    base = f"tcp ({cc})" if transport == "tcp" else transport
    base = f"{base} x{servers}" if servers > 1 else base
    base = base if sender == NO_SENDER else f"{base} {sender}-sender"
    return base if compress == "none" else f"{base} {compress}"


def _ratio(a: dict, b: dict) -> float | None:
    if a.get("iterations_per_s") and b.get("iterations_per_s"):
        return round(a["iterations_per_s"] / b["iterations_per_s"], 3)
    return None


class _Progress:
    """A rich progress bar per run on stderr: iterations, accuracy, rounds/s."""

    def __init__(self, quiet: bool = False):
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)
        self.console = Console(stderr=True)
        self.bar = Progress(TextColumn("{task.description:<12}"), BarColumn(bar_width=24),
                            MofNCompleteColumn(), TextColumn("acc {task.fields[acc]}"),
                            TextColumn("{task.fields[rps]} rounds/s"), TimeElapsedColumn(),
                            console=self.console, disable=quiet)
        self.bar.start()
        self.task = None

    def note(self, text: str) -> None:
        self.console.print(text)

    def begin(self, label: str) -> None:
        self.task = self.bar.add_task(label, total=None, acc="-    ", rps="-   ")

    def event(self, ev: dict) -> None:
        kind = ev.get("event")
        if kind == "start":
            self.bar.update(self.task, total=ev["iterations"])
        elif kind == "iter":
            rps = ev["t"] / ev["wall_s"] if ev.get("wall_s") else 0.0
            self.bar.update(self.task, completed=ev["t"], rps=f"{rps:5.1f}")
        elif kind == "eval":
            self.bar.update(self.task, acc=f"{ev['accuracy']:.3f}")

    def end(self, res: dict) -> None:
        self.bar.update(self.task, completed=res["iterations"],
                        acc=f"{res['final_accuracy']:.3f}",
                        rps=f"{res['iterations_per_s']:5.1f}")

    def close(self) -> None:
        self.bar.stop()


def _straggler(r: dict) -> str:   # the worker named straggler most often, in how many steps
    named = r.get("straggler_rounds") or {}
    w = max(named, key=named.get, default=None)
    return f"w{w} {named[w]}/{r['iterations']}" if w is not None else "-"


def _text(results: list[dict], args, loss: float, rate: int, buffer: int) -> str:
    r0 = results[0]
    rc = r0.get("rig", {})
    head = (f"ltp train: {r0['workers']} workers, {r0['sync']}, {r0['epochs']:g} epochs "
            f"({r0['iterations']} iterations), seed {args.seed}\n"
            f"model: MLP, {r0['params']} parameters")
    if r0.get("straggler"):
        head += "; straggler " + ", ".join(f"w{k} x{v:g}" for k, v in r0["straggler"].items())
    head += (f"\nrig: {rc.get('rate_bps', rate) / 1e9:g} Gbit/s, "
             f"{rc.get('buffer_bytes', buffer) / 1000:g} KB queue, loss "
             f"{rc.get('loss', loss):g} on "
             f"{'every port' if rc.get('loss_on') == 'all' else 'the PS port'}")
    cols = [_label(r["transport"], r.get("cc"), r.get("servers", 1), r.get("compress", "none"),
                   r.get("sender", "socket")) for r in results]

    def early(r):
        if r["transport"] not in ("ltp", "ddp-ltp"):
            return "-"
        return f"{r['rounds_early_closed']}/{(r.get('ltp') or {}).get('rounds', r['iterations'])}"

    def ttt(r):
        t = r.get("time_to_target")
        return f"{t['wall_s']:.2f}" if t else ("never" if r.get("target_accuracy") else "-")

    rows = [("final accuracy", [f"{r['final_accuracy']:.4f}" for r in results]),
            ("train loss", [f"{r['initial_train_loss']:.3f}->{r['final_train_loss']:.3f}"
                            for r in results]),
            ("rounds/s", [f"{r['iterations_per_s']:.2f}" for r in results]),
            ("wall s", [f"{r['wall_s']:.2f}" for r in results]),
            ("delivered", [f"{r['delivered_fraction']:.5f}" for r in results]),
            ("early-closed", [early(r) for r in results]),
            ("straggler", [_straggler(r) for r in results]),
            ("replicas equal", ["yes" if r.get("replicas_identical") else "NO" for r in results])]
    if args.target_accuracy is not None:
        rows.insert(4, (f"s to acc {args.target_accuracy:g}", [ttt(r) for r in results]))
    w = max(*(len(c) for c in cols), *(len(v) for _, vals in rows for v in vals)) + 2
    lines = [head, "", " " * 18 + "".join(f"{c:>{w}}" for c in cols)]
    lines += [f"{name:<18}" + "".join(f"{v:>{w}}" for v in vals) for name, vals in rows]
    if args.sync == "wbsp":
        lines += ["", "local steps per worker (gradients computed):"]
        lines += [f"  {c:<16}" + " ".join(str(v) for v in r["local_steps"].values())
                  for c, r in zip(cols, results)]
    faults = [ln for c, r in zip(cols, results) for ln in fault_lines(c, r)]
    lines += [""] + faults if faults else []
    ratios = [(c, _ratio(r0, r)) for c, r in zip(cols[1:], results[1:])]
    if any(x for _, x in ratios):
        lines.append("")
    lines += [f"{cols[0]}: {x:.2f}x the rounds/s of {c}" for c, x in ratios if x]
    if args.plot or args.tensorboard:
        lines.append("")
    if args.plot:
        lines.append(f"plot: {args.plot}")
    if args.tensorboard:
        lines.append(f"tensorboard: {args.tensorboard} (tensorboard --logdir {args.tensorboard})")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    from .cli import main
    sys.exit(main(["train", *sys.argv[1:]]))
