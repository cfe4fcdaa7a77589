"""`ltp rig`: the network-namespace test rig (switch, PS, workers, TBF
bottleneck, loss injector). See docs/rig.md.

  ltp rig up [--name NAME] [--workers N] [--rate 1gbit] [--buffer 30kb] [--loss P]
             [--shape ps|all] [--mode native|skb]
  ltp rig status [--name NAME] [-j]
  ltp rig exec [--name NAME] HOST -- CMD...
  ltp rig down [--name NAME | --all]
  ltp rig check [--workers N] [--rate R] [--loss P] [-j]
  ltp rig incast-tcp [--workers 16] [--rate 1gbit] [--buffer 30kb] [--cc cubic|bbr]
                     [--size 256KiB] [--rounds 20] [--name NAME] [-j]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from .common import (LtpError, UsageError, add_json, emit, need_bcc, need_root, parse_rate,
                     parse_size, wants_json)

MAX_WORKERS = 64          # mirrors dataplane.rig.MAX_WORKERS (kept import-free for --help)
DEFAULT_NAME = "default"

RIG_EPILOG = """examples:
  sudo ltp rig up --workers 8 --rate 1gbit --buffer 30kb --loss 0.01
  ltp rig status -j
  ltp rig exec w0 -- ip -br addr
  ltp rig exec ps -- python3 -c 'print(1)'
  ltp rig down                 (or: ltp rig down --all)
  ltp rig check -j             measure the achieved rate and drop fraction
  ltp rig incast-tcp -j        TCP incast: 16 workers x 256 KiB into 1 Gbit, 30 KB buffer

Hosts are "ps" and "w0".."wN-1" (namespaces ltp-<name>-ps, ltp-<name>-w3, switch
ltp-<name>-sw); the PS is 198.18.0.1, worker i is 198.18.0.(10+i), all in 198.18.0.0/24
with no route out. The loss injector drops only IPv4 UDP/TCP (never ARP or ICMP).
"""


def register(sub) -> None:
    p = sub.add_parser("rig", help="netns test rig: switch, PS, workers, bottleneck, loss",
                       description="Build and use a network-namespace rig: a bridge (the switch), "
                       "a parameter server and N workers, TBF on the port toward the PS and a "
                       "tc BPF loss injector.",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=RIG_EPILOG)
    rsub = p.add_subparsers(dest="rig_command", metavar="ACTION")

    def sp(name: str, help: str, epilog: str) -> argparse.ArgumentParser:
        return rsub.add_parser(name, help=help, description=help, epilog="examples:\n" + epilog,
                               formatter_class=argparse.RawDescriptionHelpFormatter)

    up = sp("up", "build a rig that stays until `ltp rig down`",
            "  sudo ltp rig up --workers 32\n"
            "  sudo ltp rig up --name b --workers 4 --rate 100mbit --buffer 64kb --loss 0.02\n"
            "  sudo ltp rig up --shape all --mode skb\n")
    up.add_argument("--name", default=DEFAULT_NAME,
                    help=f"rig name, a-z 0-9 _ up to 12 characters (default {DEFAULT_NAME})")
    _shape_args(up, workers=4)
    up.add_argument("--topology", choices=("star", "leaf-spine"), default="star",
                    help="star: one switch (default); leaf-spine: leaf and spine routers, "
                    "jobs' hosts on the leaves, every leaf-spine link shaped to --rate "
                    "(--workers is then per job; see docs/paths.md and `ltp paths`)")
    up.add_argument("--leaves", type=int, default=2, help="leaf-spine: leaves (default 2)")
    up.add_argument("--spines", type=int, default=2, help="leaf-spine: spines (default 2)")
    up.add_argument("--jobs", type=int, default=2, help="leaf-spine: jobs, each a PS on leaf 0 "
                    "and workers on the other leaves (default 2)")
    up.add_argument("--loss", default="0", help="drop probability for IPv4 UDP/TCP toward the "
                    "PS, in [0, 1) (default 0)")
    up.add_argument("--loss-on", choices=("ps", "all"), default="ps",
                    help="ports with the loss injector: toward the PS only, or every port")
    up.add_argument("--shape", choices=("ps", "all"), default="ps",
                    help="TBF on the port toward the PS only (default), or on every port")
    up.add_argument("--mode", choices=("native", "skb"), default="native",
                    help="native: XDP_PASS on the switch-side veths so hosts can run native XDP "
                    "with XDP_TX (default); skb: no XDP on the switch (generic XDP on hosts)")
    add_json(up)
    up.set_defaults(func=cmd_up)

    st = sp("status", "show a rig: hosts, bottleneck, loss-injector counters",
            "  ltp rig status\n  ltp rig status --name b -j\n")
    st.add_argument("--name", help="rig name (default: the only rig, or 'default')")
    add_json(st)
    st.set_defaults(func=cmd_status)

    ex = sp("exec", "run a command inside a host's namespace",
            "  ltp rig exec w0 -- ip -br addr\n  ltp rig exec --name b ps -- ss -tn\n")
    ex.add_argument("--name", help="rig name (default: the only rig, or 'default')")
    add_json(ex)
    ex.add_argument("host", help='"ps", "w<i>", a namespace name or an address')
    ex.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command")
    ex.set_defaults(func=cmd_exec)

    dn = sp("down", "remove a rig (or every rig)",
            "  ltp rig down\n  ltp rig down --name b\n  ltp rig down --all\n"
            "  ltp rig down --all --force\n")
    g = dn.add_mutually_exclusive_group()
    g.add_argument("--name", help="rig name (default: the only rig, or 'default')")
    g.add_argument("--all", action="store_true",
                   help="remove every rig on this machine, except rigs a live process is "
                   "building or using in a `with Rig(...)` block (another test run)")
    dn.add_argument("--force", action="store_true",
                    help="with --all: remove those in-use rigs too")
    add_json(dn)
    dn.set_defaults(func=cmd_down)

    ck = sp("check", "measure a fresh rig's achieved bottleneck rate and drop fraction",
            "  sudo ltp rig check\n  sudo ltp rig check -j --rate 200mbit --loss 0.05\n\n"
            "JSON keys: rate_requested_bps, rate_measured_bps, loss_requested, loss_measured\n"
            "(plus rate_ratio, window_s, senders, datagrams_sent, injector_dropped/passed,\n"
            "tbf_drops). The rate is the PS veth's received Ethernet bytes over a ~1.4 s\n"
            "window of a ~2 s UDP blast from several workers.\n")
    _shape_args(ck, workers=4)
    ck.add_argument("--loss", default="0.01", help="drop probability to set (default 0.01)")
    ck.add_argument("--duration", type=float, default=2.0,
                    help="seconds of UDP blast, 1..10 (default 2)")
    ck.add_argument("--senders", type=int, default=4,
                    help="workers that send (default 4, at most --workers)")
    ck.add_argument("--mode", choices=("native", "skb"), default="native",
                    help="XDP_PASS on the switch ports (native, default) or not (skb)")
    add_json(ck)
    ck.set_defaults(func=cmd_check)

    ic = sp("incast-tcp", "TCP incast: synchronised rounds of every worker sending SIZE "
            "bytes to the PS",
            "  sudo ltp rig incast-tcp\n  sudo ltp rig incast-tcp -j --cc bbr --rounds 10\n"
            "  sudo ltp rig incast-tcp --name b      (on the existing rig b)\n\n"
            "JSON keys: median_s, p99_s, max_s, limit_s, median_over_limit, p99_over_limit,\n"
            "cc, workers, size_bytes, rounds (plus round_s, min_s, mean_s, rate_bps, ...).\n"
            "limit_s = workers * size * 8 / rate: the round time at line rate.\n")
    ic.add_argument("--name", help="run on this rig; if no rig has that name, build one called "
                    "NAME for the run (default: a fresh temporary rig)")
    _shape_args(ic, workers=16, defaults=False)
    ic.add_argument("--loss", default=None, help="drop probability on a fresh rig (default 0)")
    ic.add_argument("--cc", choices=("cubic", "bbr", "reno"), default="cubic",
                    help="TCP congestion control of the workers' sockets (default cubic)")
    ic.add_argument("--size", default="256KiB", help="bytes per worker per round (default 256KiB)")
    ic.add_argument("--rounds", type=int, default=20, help="counted rounds (default 20; one "
                    "warm-up round runs first)")
    ic.add_argument("--mode", choices=("native", "skb"), default=None,
                    help="switch-port XDP of a fresh rig (default skb: no XDP, so the hosts "
                    "keep TSO, as real NICs do; native turns TSO off on the hosts)")
    ic.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    add_json(ic)
    ic.set_defaults(func=cmd_incast_tcp)

    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])


def _shape_args(p: argparse.ArgumentParser, workers: int, defaults: bool = True) -> None:
    p.add_argument("--workers", type=int, default=workers if defaults else None,
                   help=f"number of workers, 1..{MAX_WORKERS} (default {workers})")
    p.add_argument("--rate", default="1gbit" if defaults else None,
                   help="bottleneck rate, e.g. 1gbit, 100mbit (default 1gbit)")
    p.add_argument("--buffer", default="30kb" if defaults else None,
                   help="bottleneck queue in bytes (TBF limit), e.g. 30kb, 64KiB (default 30kb)")
    p.add_argument("--burst", default=None,
                   help="TBF bucket in bytes (default: max(2 frames, 80 us at the rate))")


# --------------------------------------------------------------------------- validation

def _check_name(name: str | None, flag: str = "--name") -> str | None:
    import re
    if name is not None and not re.match(r"^[a-z0-9][a-z0-9_]{0,11}$", name):
        raise UsageError(f"{flag}: {name!r} must be 1-12 characters of a-z, 0-9, _")
    return name


def _workers(n: int | None) -> int | None:
    if n is not None and not 1 <= n <= MAX_WORKERS:
        raise UsageError(f"--workers: must be in 1..{MAX_WORKERS}, got {n}")
    return n


def _loss(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        p = float(text)
    except ValueError:
        p = -1.0
    if not 0.0 <= p < 1.0:
        raise UsageError(f"--loss: must be a probability in [0, 1), got {text!r}")
    return p


def _rate(text: str | None) -> int | None:
    if text is None:
        return None
    from ..dataplane.rig.star import MAX_RATE_BPS, MIN_RATE_BPS
    bps = parse_rate(text, "--rate")
    if not MIN_RATE_BPS <= bps <= MAX_RATE_BPS:
        raise UsageError(f"--rate: must be in 64kbit..32gbit, got {text!r}")
    return bps


def _bytes(text: str | None, flag: str, least: int = 1514) -> int | None:
    if text is None:
        return None
    n = parse_size(text, flag)
    if not least <= n <= 1 << 30:
        raise UsageError(f"{flag}: must be in {least} bytes (one 1500-byte-MTU frame)..1GiB, "
                         f"got {text!r}")
    return n


def _config(**kw: Any):
    """A RigConfig; a ValueError from it becomes a usage error naming the flag."""
    from ..dataplane.rig.star import RigConfig
    try:
        return RigConfig(**{k: v for k, v in kw.items() if v is not None})
    except ValueError as e:
        flag = str(e).split(":", 1)[0].replace("_", "-")
        raise UsageError(f"--{flag}:{str(e).split(':', 1)[1]}") from None


def _prepare() -> None:
    need_root("ltp rig")
    need_bcc()


def _resolve(name: str | None) -> str:
    from ..dataplane.rig.star import Rig
    if name:
        return name
    names = Rig.names()
    if not names:
        raise LtpError("no rig is up: `sudo ltp rig up` builds one")
    if len(names) == 1:
        return names[0]
    if DEFAULT_NAME in names:
        return DEFAULT_NAME
    raise UsageError(f"--name: several rigs are up ({', '.join(names)}); pick one")


def _attach(name: str):
    from ..dataplane.rig.star import Rig, RigError
    try:
        return Rig.attach(name)
    except RigError as e:
        raise LtpError(str(e)) from None


# --------------------------------------------------------------------------- commands

def cmd_up(args) -> int | None:
    if getattr(args, "topology", "star") == "leaf-spine":
        from .cmd_paths import rig_up
        return rig_up(args)
    cfg = _config(name=_check_name(args.name), workers=_workers(args.workers),
                  rate_bps=_rate(args.rate), buffer_bytes=_bytes(args.buffer, "--buffer"),
                  burst_bytes=_bytes(args.burst, "--burst"), loss=_loss(args.loss),
                  shape=args.shape, loss_on=args.loss_on, mode=args.mode)
    _prepare()
    from ..dataplane.rig.star import Rig
    emit(args, bring_up(Rig(cfg)), lambda s: _up_text(s))


def bring_up(rig) -> dict:
    """Build a rig that stays (star or leaf-spine) and return its status; a
    RigError becomes the command's error."""
    from ..dataplane.rig.base import RigError
    try:
        rig.up()
        return rig.status()
    except RigError as e:
        raise LtpError(str(e)) from None
    finally:
        rig.close()


def _up_text(s: dict) -> str:
    c = s["config"]
    last = s["hosts"][-1]
    return (f"rig {s['name']} is up: PS {s['hosts'][0]['ip']} ({s['hosts'][0]['netns']}), "
            f"{c['workers']} workers {s['hosts'][1]['ip']}..{last['ip']} "
            f"({s['hosts'][1]['netns']}..{last['name']})\n"
            f"bottleneck {_fmt_rate(c['rate_bps'])}, buffer {c['buffer_bytes']} B, burst "
            f"{c['burst_bytes']} B on {', '.join(s['shaped_ports'])}; loss {c['loss']:g} on "
            f"{', '.join(s['loss_ports'])}; mode {c['mode']}\n"
            f"next: ltp rig status --name {s['name']} | ltp rig exec --name {s['name']} w0 -- CMD"
            f" | ltp rig down --name {s['name']}")


def cmd_status(args) -> int | None:
    name = _check_name(args.name)
    need_root("ltp rig status")
    from ..dataplane.rig.leafspine import LeafSpine
    if name and LeafSpine.exists(name):  # a leaf-spine rig of that name
        ls = LeafSpine.attach(name)
        try:
            emit(args, ls.status(), lambda st: json.dumps(st, indent=2, default=str))
        finally:
            ls.close()
        return None
    rig = _attach(_resolve(name))
    try:
        st = rig.status()
    finally:
        rig.close()
    emit(args, st, _status_text)


def _status_text(s: dict) -> str:
    import datetime
    c = s["config"]
    when = (datetime.datetime.fromtimestamp(s["created"]).strftime("%Y-%m-%d %H:%M:%S")
            if s.get("created") else "?")
    lines = [f"rig {s['name']}: {c['workers']} workers, mode {c['mode']}, subnet {s['subnet']}, "
             f"switch {s['switch_ns']} ({s['bridge']}), up since {when}"
             + ("" if s.get("namespaces_present") else "  [INCOMPLETE: namespaces missing]")]
    bn = s.get("bottleneck")
    if isinstance(bn, dict):
        lines.append(f"bottleneck: error: {bn.get('error')}")
    else:
        for q in bn:
            state = (f"sent {q.get('packets', 0)} pkts / {q.get('bytes', 0)} B, dropped "
                     f"{q.get('drops', 0)}, overlimits {q.get('overlimits', 0)}, backlog "
                     f"{q.get('backlog', 0)} B" if q["present"] else "TBF MISSING")
            lines.append(f"bottleneck {q['port']}: TBF {_fmt_rate(q['rate_bps'])}, buffer "
                         f"{q['buffer_bytes']} B, burst {q['burst_bytes']} B; {state}")
    li = s.get("loss_injector", {})
    if "error" in li:
        lines.append(f"loss injector: error: {li['error']}")
    else:
        meas = "-" if li.get("measured") is None else f"{li['measured']:.4f}"
        lines.append(f"loss injector on {', '.join(li['ports'])}: p={li['loss']:.4f}; dropped "
                     f"{li['dropped']}, passed {li['passed']} (measured {meas}), not judged "
                     f"(ARP, ICMP, ...) {li['other']}")
    w = max(len(h["netns"]) for h in s["hosts"])
    lines.append(f"{'HOST':5} {'ROLE':6} {'NAMESPACE':{w}} {'ADDRESS':16} {'IFNAME':8} MAC")
    for h in s["hosts"]:
        lines.append(f"{h['name']:5} {h['role']:6} {h['netns']:{w}} "
                     f"{h['ip'] + '/' + str(h['prefixlen']):16} {h['ifname']:8} {h['mac']}")
    return "\n".join(lines)


def cmd_exec(args) -> int:
    name = _check_name(args.name)
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("exec: give a command after --, e.g. `ltp rig exec w0 -- ip -br addr`")
    need_root("ltp rig exec")
    rig = _attach(_resolve(name))
    try:
        host = rig.host(args.host)
    except KeyError as e:
        raise UsageError(f"HOST: {e.args[0]}") from None
    try:
        if wants_json(args):
            r = rig.exec(host, cmd)
            emit(args, {"host": host.name, "netns": host.netns, "argv": cmd,
                        "returncode": r.returncode, "stdout": r.stdout, "stderr": r.stderr})
            return r.returncode
        return subprocess.call(rig._argv(host, cmd))
    except FileNotFoundError as e:
        raise LtpError(f"cannot run: {e}") from None


def cmd_down(args) -> int | None:
    name = _check_name(args.name)
    need_root("ltp rig down")
    from ..dataplane.rig.star import Rig, RigError
    if args.force and not args.all:
        raise UsageError("--force: only with --all")
    skipped: list[dict] = []
    try:
        if args.all:
            before = Rig.names()
            removed = Rig.down_all(force=args.force)
            skipped = [{"name": n, "owner_pid": Rig.owner(n)} for n in before if n not in removed]
        else:
            from ..dataplane.rig.leafspine import LeafSpine
            if name and LeafSpine.exists(name):
                LeafSpine.destroy(name)
                emit(args, {"removed": [name], "skipped": []}, f"removed {name}")
                return None
            target = _resolve(name)
            if not Rig.destroy(target):
                raise LtpError(f"no rig named {target!r} (rigs: {', '.join(Rig.names()) or 'none'})")
            removed = [target]
    except RigError as e:
        raise LtpError(str(e)) from None

    def text(d: dict) -> str:
        out = f"removed {', '.join(d['removed'])}" if d["removed"] else "no rig to remove"
        for k in d["skipped"]:
            out += (f"\nkept {k['name']}: in use by process {k['owner_pid']} "
                    "(--all --force removes it)")
        return out
    emit(args, {"removed": removed, "skipped": skipped}, text)


def cmd_check(args) -> int | None:
    if not 1.0 <= args.duration <= 10.0:
        raise UsageError(f"--duration: must be in 1..10 seconds, got {args.duration}")
    workers = _workers(args.workers)
    if not 1 <= args.senders:
        raise UsageError(f"--senders: must be at least 1, got {args.senders}")
    cfg = _config(name=f"chk{os.getpid() % 10**7}", workers=workers, rate_bps=_rate(args.rate),
                  buffer_bytes=_bytes(args.buffer, "--buffer"),
                  burst_bytes=_bytes(args.burst, "--burst"), loss=_loss(args.loss),
                  mode=args.mode)
    _prepare()
    from ..dataplane.rig.star import Rig, RigError, measure_rate
    if not wants_json(args):
        print(f"... building a rig with {cfg.workers} workers, measuring for {args.duration:g} s",
              file=sys.stderr)
    try:
        with Rig(cfg) as rig:
            res = measure_rate(rig, seconds=args.duration, senders=min(args.senders, cfg.workers))
    except RigError as e:
        raise LtpError(str(e)) from None
    emit(args, res, lambda r: (
        f"rate  requested {_fmt_rate(r['rate_requested_bps']):>12}   measured "
        f"{_fmt_rate(r['rate_measured_bps']):>12}  ({100 * r['rate_ratio']:.1f} %)\n"
        f"loss  requested {r['loss_requested']:>12.4f}   measured {r['loss_measured']:>12.4f}"
        f"  ({r['injector_dropped']} of {r['injector_dropped'] + r['injector_passed']} packets)\n"
        f"({r['senders']} UDP senders, {r['payload_bytes']}-byte datagrams, window "
        f"{r['window_s']:.2f} s, TBF drops {r['tbf_drops']})"))


def cmd_incast_tcp(args) -> int | None:
    name = _check_name(args.name)
    workers = _workers(args.workers)
    rate, buffer = _rate(args.rate), _bytes(args.buffer, "--buffer")
    burst, loss = _bytes(args.burst, "--burst"), _loss(args.loss)
    size = parse_size(args.size, "--size")
    if not 1 <= size <= 1 << 30:
        raise UsageError(f"--size: must be in 1 B..1 GiB, got {args.size!r}")
    if not 1 <= args.rounds <= 100_000:
        raise UsageError(f"--rounds: must be in 1..100000, got {args.rounds}")
    _prepare()
    from ..errors import BenchError
    from ..control.bench.tcp import ensure_cc, run_tcp_incast
    from ..dataplane.rig.star import Rig, RigError
    try:
        ensure_cc(args.cc)
    except BenchError as e:
        raise LtpError(str(e)) from None
    existing = name is not None and Rig.exists(name)
    if existing:
        given = {"--workers": workers, "--rate": rate, "--buffer": buffer, "--burst": burst,
                 "--loss": loss, "--mode": args.mode}
        extra = [k for k, v in given.items() if v is not None]
        if extra:
            raise UsageError(f"{extra[0]}: rig {name!r} exists and keeps its own settings; "
                             f"drop {', '.join(extra)} or use another --name")
        rig = _attach(name)
    else:
        cfg = _config(name=name or f"inc{os.getpid() % 10**7}", workers=workers or 16,
                      rate_bps=rate, buffer_bytes=buffer, burst_bytes=burst, loss=loss or 0.0,
                      mode=args.mode or "skb")
        rig = Rig(cfg)
    show = not args.quiet
    try:
        with rig:
            limit = len(rig.workers) * size * 8 / rig.config.rate_bps
            if show:
                print(f"... {len(rig.workers)} workers x {size} B over TCP {args.cc} into "
                      f"{_fmt_rate(rig.config.rate_bps)} (buffer {rig.config.buffer_bytes} B): "
                      f"line-rate limit {limit * 1e3:.1f} ms per round", file=sys.stderr)
            with _Progress(args.rounds, show) as prog:
                res = run_tcp_incast(rig, size=size, rounds=args.rounds, cc=args.cc,
                                     progress=prog.update)
    except (RigError, BenchError) as e:
        raise LtpError(str(e)) from None
    res["rig"] = rig.name
    res["mode"] = rig.config.mode
    emit(args, res, lambda r: (
        f"TCP {r['cc']} incast: {r['workers']} workers x {r['size_bytes']} B, {r['rounds']} "
        f"rounds, {_fmt_rate(r['rate_bps'])}, buffer {r['buffer_bytes']} B\n"
        f"limit  {r['limit_s'] * 1e3:9.1f} ms   (workers x size x 8 / rate)\n"
        f"median {r['median_s'] * 1e3:9.1f} ms   {r['median_over_limit']:6.1f} x limit\n"
        f"p99    {r['p99_s'] * 1e3:9.1f} ms   {r['p99_over_limit']:6.1f} x limit\n"
        f"max    {r['max_s'] * 1e3:9.1f} ms"))


class _Progress:
    """Round progress on stderr: a rich bar on a terminal, plain lines otherwise."""

    def __init__(self, total: int, show: bool):
        self.total, self.show = total, show
        self._bar = None

    def __enter__(self) -> "_Progress":
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


def _fmt_rate(bps: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.4g} {unit}"
    return f"{bps:.0f} bit/s"
