# SPDX-License-Identifier: Apache-2.0
"""`ltp rig check` and `ltp rig incast-tcp`: measurements on a rig (the
achieved bottleneck rate and drop fraction; TCP incast round times).
tools/cmd_rig.py registers them under `ltp rig` (see `register`)."""
from __future__ import annotations

import os
import sys

from . import rigs
from .common import UsageError, add_json, emit, parse_size, wants_json
from .flags import add_loss, add_rig_name, add_shape, add_size, add_switch_mode, check_name

CHECK_EPILOG = ("  sudo ltp rig check\n  sudo ltp rig check -j --rate 200mbit --loss 0.05\n\n"
                "JSON keys: rate_requested_bps, rate_measured_bps, loss_requested, loss_measured\n"
                "(plus rate_ratio, window_s, senders, datagrams_sent, injector_dropped/passed,\n"
                "tbf_drops). The rate is the PS veth's received Ethernet bytes over a ~1.4 s\n"
                "window of a ~2 s UDP blast from several workers.\n")

INCAST_EPILOG = ("  sudo ltp rig incast-tcp\n  sudo ltp rig incast-tcp -j --cc bbr --rounds 10\n"
                 "  sudo ltp rig incast-tcp --name b      (on the existing rig b)\n\n"
                 "JSON keys: median_s, p99_s, max_s, limit_s, median_over_limit, p99_over_limit,\n"
                 "cc, workers, size_bytes, rounds (plus round_s, min_s, mean_s, rate_bps, ...).\n"
                 "limit_s = workers * size * 8 / rate: the round time at line rate.\n")


def register(action) -> None:
    """Add check and incast-tcp; `action(name, help, epilog)` makes a `ltp rig` action."""
    ck = action("check", "measure a fresh rig's achieved bottleneck rate and drop fraction",
                CHECK_EPILOG)
    add_shape(ck, workers=4)
    # a loss to measure: 0 would leave loss_measured nothing to compare with
    add_loss(ck, "0.01")
    ck.add_argument("--duration", type=float, default=2.0,
                    help="seconds of UDP blast, 1..10 (default 2)")
    ck.add_argument("--senders", type=int, default=4,
                    help="workers that send (default 4, at most --workers)")
    add_switch_mode(ck)
    add_json(ck)
    ck.set_defaults(func=cmd_check)

    ic = action("incast-tcp", "TCP incast: synchronised rounds of every worker sending SIZE "
                "bytes to the PS", INCAST_EPILOG)
    add_rig_name(ic, "run")
    # unset: on an existing rig, any of these given is an error (the rig keeps its own)
    add_shape(ic, workers=16, unset=True)
    add_loss(ic, unset=True, note="on a fresh rig")
    ic.add_argument("--cc", choices=("cubic", "bbr", "reno"), default="cubic",
                    help="TCP congestion control of the workers' sockets (default cubic)")
    add_size(ic, "256KiB")
    ic.add_argument("--rounds", type=int, default=20, help="counted rounds (default 20; one "
                    "warm-up round runs first)")
    add_switch_mode(ic, "skb", unset=True,
                    note="on a fresh rig: no XDP, so the hosts keep TSO, as real NICs do; "
                    "native turns TSO off on the hosts")
    ic.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    add_json(ic)
    ic.set_defaults(func=cmd_incast_tcp)


# --------------------------------------------------------------------------- check

def cmd_check(args) -> int | None:
    if not 1.0 <= args.duration <= 10.0:
        raise UsageError(f"--duration: must be in 1..10 seconds, got {args.duration}")
    if not args.senders >= 1:
        raise UsageError(f"--senders: must be at least 1, got {args.senders}")
    cfg = rigs.star_config(name=f"chk{os.getpid() % 10**7}", **rigs.shaped(args),
                           mode=args.mode)
    rigs.prepare()
    from ..dataplane.rig.star import Rig, measure_rate
    if not wants_json(args):
        print(f"... building a rig with {cfg.workers} workers, measuring for {args.duration:g} s",
              file=sys.stderr)
    with Rig(cfg) as rig:
        res = measure_rate(rig, seconds=args.duration, senders=min(args.senders, cfg.workers))
    fmt = rigs.fmt_rate
    emit(args, res, lambda r: (
        f"rate  requested {fmt(r['rate_requested_bps']):>12}   measured "
        f"{fmt(r['rate_measured_bps']):>12}  ({100 * r['rate_ratio']:.1f} %)\n"
        f"loss  requested {r['loss_requested']:>12.4f}   measured {r['loss_measured']:>12.4f}"
        f"  ({r['injector_dropped']} of {r['injector_dropped'] + r['injector_passed']} packets)\n"
        f"({r['senders']} UDP senders, {r['payload_bytes']}-byte datagrams, window "
        f"{r['window_s']:.2f} s, TBF drops {r['tbf_drops']})"))


# --------------------------------------------------------------------------- incast-tcp

def cmd_incast_tcp(args) -> int | None:
    name = check_name(args.name)
    given = {**rigs.shaped(args), "mode": args.mode}
    size = parse_size(args.size, "--size")
    if not 1 <= size <= 1 << 30:
        raise UsageError(f"--size: must be in 1 B..1 GiB, got {args.size!r}")
    if not 1 <= args.rounds <= 100_000:
        raise UsageError(f"--rounds: must be in 1..100000, got {args.rounds}")
    rigs.prepare()
    rig = _incast_rig(name, args.cc, given)
    from ..control.bench.tcp import run_tcp_incast
    show = not args.quiet
    with rig:
        limit = len(rig.workers) * size * 8 / rig.config.rate_bps
        if show:
            print(f"... {len(rig.workers)} workers x {size} B over TCP {args.cc} into "
                  f"{rigs.fmt_rate(rig.config.rate_bps)} (buffer {rig.config.buffer_bytes} B): "
                  f"line-rate limit {limit * 1e3:.1f} ms per round", file=sys.stderr)
        with _Progress(args.rounds, show) as prog:
            res = run_tcp_incast(rig, size=size, rounds=args.rounds, cc=args.cc,
                                 progress=prog.update)
    res["rig"] = rig.name
    res["mode"] = rig.config.mode
    emit(args, res, lambda r: (
        f"TCP {r['cc']} incast: {r['workers']} workers x {r['size_bytes']} B, {r['rounds']} "
        f"rounds, {rigs.fmt_rate(r['rate_bps'])}, buffer {r['buffer_bytes']} B\n"
        f"limit  {r['limit_s'] * 1e3:9.1f} ms   (workers x size x 8 / rate)\n"
        f"median {r['median_s'] * 1e3:9.1f} ms   {r['median_over_limit']:6.1f} x limit\n"
        f"p99    {r['p99_s'] * 1e3:9.1f} ms   {r['p99_over_limit']:6.1f} x limit\n"
        f"max    {r['max_s'] * 1e3:9.1f} ms"))


def _incast_rig(name: str | None, cc: str, given: dict):
    """The rig incast-tcp runs on: rig `name` as it is when it exists, else a
    fresh one from the flags `given` (RigConfig fields; None: not given),
    removed after the run."""
    from ..dataplane.tcp_cc import ensure_cc
    from ..dataplane.rig.star import Rig
    ensure_cc(cc)
    if name is not None and Rig.exists(name):
        extra = [rigs.SHAPE_FLAGS.get(k, f"--{k}") for k, v in given.items() if v is not None]
        if extra:
            raise UsageError(f"{extra[0]}: rig {name!r} exists and keeps its own settings; "
                             f"drop {', '.join(extra)} or use another --name")
        return rigs.attach(name)
    return Rig(rigs.star_config(name=name or f"inc{os.getpid() % 10**7}",
                                **{**given, "workers": given["workers"] or 16,
                                   "loss": given["loss"] or 0.0, "mode": given["mode"] or "skb"}))


class _Progress:
    """Round progress on stderr: a rich bar on a terminal, plain lines otherwise."""

    def __init__(self, total: int, show: bool):
        self.total, self.show = total, show
        self._bar = None

    def __enter__(self) -> _Progress:
        if self.show and sys.stderr.isatty():
            try:
                from rich.console import Console
                from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                           TimeElapsedColumn)
                self._bar = Progress(TextColumn("rounds"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.description}"), TimeElapsedColumn(),
                                     console=Console(stderr=True), transient=True)
                self._bar.__enter__()
                self._task = self._bar.add_task("", total=self.total)
            except ImportError:  # pragma: no cover
                self._bar = None
        return self

    def update(self, done: int, total: int, seconds: float) -> None:
        if not self.show:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=done, description=f"last {seconds * 1e3:.0f} ms")
        else:
            print(f"... round {done}/{total}: {seconds * 1e3:.1f} ms", file=sys.stderr, flush=True)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
