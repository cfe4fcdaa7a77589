"""Operator commands on pinned LTP programs, bpftool style: load, unload,
status, flows, top, capture. See docs/operations.md.

  ltp load DEV --role ps|worker [--netns NS] [--mode native|skb] [--job COOKIE]
           [--workers N | --id W] [--max-elems N | --max-chunks N] [--chunk-bytes 1424]
           [--port 7410] [--force] [-j]
  ltp unload DEV [--netns NS] | ltp unload --all [--netns NS]       [-j]
  ltp status [--netns NS] [-j]
  ltp flows [DEV] [--netns NS] [-j]
  ltp top [DEV] [--netns NS] [--interval 1] [--iterations N]
  ltp capture DEV [--netns NS] [-c N] [--timeout S] [-w FILE.pcap] [-j]
  ltp capture -r FILE.pcap [-c N] [-w FILE.pcap] [-j]

`load` leaves the program attached and pinned under
/sys/fs/bpf/ltp/<netns or host>/<dev>/ with a record in
/run/ltp/xdp/<netns or host>/<dev>.json; every other command works from those,
from any process. Exit codes: 0 ok, 1 runtime error, 2 usage error.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ..dataplane.xdp.headers import defines
from .common import (LtpError, UsageError, add_json, emit, need_bcc, need_root, wants_json)

PORT = defines("ltp_wire.h")["LTP_PORT"]  # cheap: no scapy at parser build

DEFAULT_CHUNK_BYTES = 1424
DEFAULT_MAX_CHUNKS = 256
MAX_SLOTS = 1024            # mirrors loader.Geometry (kept import-free for --help)

LOAD_EPILOG = """examples:
  sudo ltp load ltp-ps --netns ltp-default-ps --role ps --workers 4 --max-elems 1000000
  sudo ltp load ltp-w0 --netns ltp-default-w0 --role worker --id 0 --max-elems 1000000
  sudo ltp load eth1 --role ps --workers 16 --job 0x17 --mode skb
  sudo ltp load ltp-ps --netns ltp-default-ps --role ps --workers 8 --force   (replace)

A PS gets slots 0..N-1 for worker ids 0..N-1; a worker gets slot 0 for its own
id (the parameter downlink and the ACKs of its pushes carry it). Geometry: one
round's buffer may have --max-chunks chunks of --chunk-bytes (or enough for
--max-elems float32 elements). The program stays attached after `load` exits;
`ltp unload` removes it. Loading on a device that carries an XDP program is
refused (exit 1) unless --force.
"""

UNLOAD_EPILOG = """examples:
  sudo ltp unload ltp-ps --netns ltp-default-ps
  sudo ltp unload eth1
  sudo ltp unload --all                  everything `ltp load` left on this machine
  sudo ltp unload --all --netns ltp-default-ps

Detaches the program (only if the device still carries the one that was
loaded), removes its pins and record; a record whose namespace is gone is
removed too.
"""

STATUS_EPILOG = """examples:
  sudo ltp status
  sudo ltp status -j
  sudo ltp status --netns ltp-default-ps

STATE: ok; detached (the device carries no program or another one);
no netns / no device (gone: `ltp unload` cleans up); no record / no pins /
partial (some pins missing: unload and load again).
"""

FLOWS_EPILOG = """examples:
  sudo ltp flows                          every loaded program
  sudo ltp flows ltp-ps --netns ltp-default-ps
  sudo ltp flows -j | jq '.[0].flows[] | {worker, packets, loss}'

Columns: PKTS/BYTES DATA packets that passed validation and their payload bytes,
ACKS ACKs sent, DUP duplicates, LATE packets of closed rounds, OOR out-of-range
chunks; LAST/FILL chunks delivered and Bubble-Filled in the last recorded round;
LOSS% filled / (delivered + filled) over all recorded rounds; C/E/D/T rounds
closed complete / early / by deadline / by timeout. Round outcomes come from
the control plane (LtpMaps.record_round): without it they stay 0 and LOSS is
"-". Malformed and foreign-job packets have no slot: see the "program:" line.
"""

TOP_EPILOG = """examples:
  sudo ltp top
  sudo ltp top --netns ltp-default-ps --interval 0.5
  sudo ltp top --iterations 3 > snapshot.txt      (batch mode: no terminal needed)

Rows are sorted by the loss of the last recorded round (then over all rounds).
Rates are per second over the interval. Keys: q quits (Ctrl-C too).
"""

CAPTURE_EPILOG = """examples:
  sudo ltp capture ltp-w0 --netns ltp-default-w0 -c 20
  sudo ltp capture sw-ps --netns ltp-default-sw -w /tmp/ltp.pcap --timeout 5
  ltp capture -r /tmp/ltp.pcap -j
  ltp capture -r /tmp/ltp.pcap -c 5

One line per LTP packet: time, in/out, addresses, type, worker (w=), round (r=),
chunk/nchunks (c=), payload length, flags (ACK: receiver state and advertised
rate). -j prints one JSON object per packet (JSON lines); -p one JSON list.
An XDP program runs before packet capture: on a host whose ltp_xdp consumes
DATA, neither that DATA nor the ACKs it sends (XDP_TX) are visible there.
Capture on the sender's device, or on the rig's switch port (sw-ps in
ltp-NAME-sw), to see both directions.
"""


def _guard(func):
    """Run a command; an OSError from a map or socket becomes one line (exit 1)."""
    import functools

    @functools.wraps(func)
    def run(args):
        try:
            return func(args)
        except (LtpError, PermissionError):
            raise
        except OSError as e:
            raise LtpError(f"{args.command}: {e.strerror or e}"
                           + (f" ({e.filename})" if getattr(e, "filename", None) else "")) from None
    return run


def register(sub) -> None:
    def parser(name: str, help: str, epilog: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".",
                              epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)

    p = parser("load", "attach ltp_xdp to a device and pin it and its maps", LOAD_EPILOG)
    p.add_argument("dev", metavar="DEV", help="device to attach to")
    p.add_argument("--role", choices=("ps", "worker"), required=True,
                   help="ps: receives workers' pushes; worker: receives the downlink")
    p.add_argument("--netns", metavar="NS", help="network namespace of DEV (default: this one)")
    p.add_argument("--mode", choices=("native", "skb"), default="native",
                   help="XDP attach mode (default native)")
    p.add_argument("--job", default="0", metavar="COOKIE",
                   help="job cookie (decimal or 0x hex); other jobs' packets are dropped; "
                   "0 accepts any (default)")
    p.add_argument("--workers", type=int, metavar="N", help="ps: worker ids 0..N-1 (required)")
    p.add_argument("--id", type=int, metavar="W", dest="worker_id",
                   help="worker: this worker's id (required)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--max-elems", type=int, metavar="N",
                   help="largest round buffer in float32 elements")
    g.add_argument("--max-chunks", type=int, metavar="N",
                   help=f"largest round buffer in chunks (default {DEFAULT_MAX_CHUNKS})")
    p.add_argument("--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES,
                   help=f"payload bytes per chunk, a multiple of 8 (default {DEFAULT_CHUNK_BYTES})")
    p.add_argument("--port", type=int, default=PORT, help=f"LTP UDP port (default {PORT})")
    p.add_argument("--force", action="store_true",
                   help="replace a program the device carries already")
    add_json(p)
    p.set_defaults(func=_guard(cmd_load))

    p = parser("unload", "detach and unpin what `ltp load` loaded", UNLOAD_EPILOG)
    p.add_argument("dev", metavar="DEV", nargs="?", help="device (or --all)")
    p.add_argument("--netns", metavar="NS", help="network namespace of DEV (default: this one)")
    p.add_argument("--all", action="store_true", help="every program `ltp load` left")
    add_json(p)
    p.set_defaults(func=_guard(cmd_unload))

    p = parser("status", "list loaded LTP programs", STATUS_EPILOG)
    p.add_argument("--netns", metavar="NS", help="only this namespace ('host': the machine's own)")
    add_json(p)
    p.set_defaults(func=_guard(cmd_status))

    p = parser("flows", "per-worker counters of loaded LTP programs", FLOWS_EPILOG)
    p.add_argument("dev", metavar="DEV", nargs="?", help="device (default: every program)")
    p.add_argument("--netns", metavar="NS", help="namespace of DEV, or the only namespace shown")
    add_json(p)
    p.set_defaults(func=_guard(cmd_flows))

    p = parser("top", "live per-worker rates and loss, worst first", TOP_EPILOG)
    p.add_argument("dev", metavar="DEV", nargs="?", help="device (default: every program)")
    p.add_argument("--netns", metavar="NS", help="namespace of DEV, or the only namespace shown")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between updates "
                   "(0.1..60, default 1)")
    p.add_argument("--iterations", type=int, metavar="N",
                   help="stop after N updates (default: until q or Ctrl-C)")
    p.set_defaults(func=_guard(cmd_top))

    p = parser("capture", "decode LTP packets live in a namespace or from a pcap",
               CAPTURE_EPILOG)
    p.add_argument("dev", metavar="DEV", nargs="?", help="device to capture on (not with -r)")
    p.add_argument("--netns", metavar="NS", help="network namespace of DEV (default: this one)")
    p.add_argument("-c", "--count", type=int, metavar="N", help="stop after N LTP packets")
    p.add_argument("-r", "--read", metavar="FILE", help="read packets from a pcap file")
    p.add_argument("-w", "--write", metavar="FILE", help="also write the LTP packets to a pcap")
    p.add_argument("--timeout", type=float, metavar="S", help="live: stop after S seconds")
    p.add_argument("--port", type=int, default=PORT, help=f"LTP UDP port (default {PORT})")
    p.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")
    add_json(p)
    p.set_defaults(func=_guard(cmd_capture))


# --------------------------------------------------------------------------- helpers

def _registry():
    from ..dataplane.xdp import registry
    return registry


def _dev(dev: str | None, flag: str = "DEV") -> str | None:
    if dev is None:
        return None
    try:
        _registry().check_ifname(dev)
    except ValueError as e:
        raise UsageError(f"{flag}: {e}") from None
    return dev


def _netns(text: str | None) -> str | None:
    """--netns value -> namespace (None: the host's own)."""
    if text is not None and ("/" in text or not text.strip() or text in (".", "..")):
        raise UsageError(f"--netns: {text!r} is not a namespace name (`ip netns list`)")
    return _registry().ns_arg(text)


def _ns_filter(text: str | None):
    """--netns for listing commands: ... (all) when not given."""
    return ... if text is None else _netns(text)


def _int(text: str, flag: str, lo: int, hi: int) -> int:
    try:
        v = int(text, 0)
    except ValueError:
        raise UsageError(f"{flag}: {text!r} is not a number") from None
    if not lo <= v <= hi:
        raise UsageError(f"{flag}: must be in {lo}..{hi}, got {text}")
    return v


def _human(n: float | None, width: int) -> str:
    """n in at most `width` characters: exact, else with a K/M/G/T suffix."""
    if n is None:
        return "-"
    if isinstance(n, float) and not n.is_integer():
        s = f"{n:.1f}" if n < 100 else f"{n:.0f}"
    else:
        s = str(int(n))
    if len(s) <= width:
        return s
    for unit, scale in (("K", 1e3), ("M", 1e6), ("G", 1e9), ("T", 1e12)):
        v = n / scale
        for fmt in ("{:.1f}{}", "{:.0f}{}"):
            s = fmt.format(v, unit)
            if len(s) <= width:
                return s
    return s


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _job(job: int | None) -> str:
    return "-" if job is None else ("any" if not job else f"{job:#x}")


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "*"


# --------------------------------------------------------------------------- load / unload

def cmd_load(args) -> None:
    dev = _dev(args.dev)
    ns = _netns(args.netns)
    job = _int(args.job, "--job", 0, 2**32 - 1)
    if args.role == "ps":
        if args.worker_id is not None:
            raise UsageError("--id: only for --role worker (a PS takes --workers N)")
        if args.workers is None:
            raise UsageError("--workers: a PS needs the number of workers (ids 0..N-1)")
        if not 1 <= args.workers <= MAX_SLOTS:
            raise UsageError(f"--workers: must be in 1..{MAX_SLOTS}, got {args.workers}")
        peers = {w: w for w in range(args.workers)}
    else:
        if args.workers is not None:
            raise UsageError("--workers: only for --role ps (a worker takes --id W)")
        if args.worker_id is None:
            raise UsageError("--id: a worker needs its worker id")
        if not 0 <= args.worker_id <= 65535:
            raise UsageError(f"--id: must be in 0..65535, got {args.worker_id}")
        peers = {args.worker_id: 0}
    if args.chunk_bytes % 8 or not 8 <= args.chunk_bytes <= 8192:
        raise UsageError(f"--chunk-bytes: must be a multiple of 8 in 8..8192, got "
                         f"{args.chunk_bytes}")
    if args.max_elems is not None:
        if args.max_elems < 1:
            raise UsageError(f"--max-elems: must be at least 1, got {args.max_elems}")
        max_chunks = -(-args.max_elems * 4 // args.chunk_bytes)
    else:
        max_chunks = args.max_chunks if args.max_chunks is not None else DEFAULT_MAX_CHUNKS
    if not 1 <= max_chunks <= 1 << 20:
        flag = "--max-elems" if args.max_elems is not None else "--max-chunks"
        raise UsageError(f"{flag}: gives {max_chunks} chunks; must be 1..{1 << 20}")
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port: must be in 1..65535, got {args.port}")
    need_root("ltp load")
    need_bcc()
    reg = _registry()
    from ..dataplane.xdp.loader import Geometry
    geometry = Geometry(slots=len(peers), max_chunks=max_chunks, chunk_bytes=args.chunk_bytes,
                        port=args.port)
    rec = reg.load(dev, ns, role=args.role, geometry=geometry, peers=peers, job=job,
                   mode=args.mode, force=args.force)
    d = rec.to_dict()
    d["peers"] = {str(w): s for w, s in sorted(rec.peers.items())}

    def text(d: dict) -> str:
        g = d["geometry"]
        ids = sorted(int(w) for w in d["peers"])
        who = (f"ps for worker ids {ids[0]}..{ids[-1]}" if d["role"] == "ps"
               else f"worker {ids[0]}")
        flag = f" --netns {ns}" if ns else ""
        mib = g["banks"] * g["slots"] * g["max_chunks"] * g["chunk_bytes"] / 2**20
        return (f"loaded ltp_xdp (prog id {d['prog_id']}) on {reg.where(dev, ns)}, {d['mode']} "
                f"mode: {who}, job {_job(d['job'])}\n"
                f"geometry {g['slots']} slots x {g['max_chunks']} chunks x {g['chunk_bytes']} B "
                f"x {g['banks']} banks ({mib:.1f} MiB), port {g['port']}\n"
                f"pinned in {d['pin_dir']}/, record {d['record']}\n"
                f"next: ltp flows {dev}{flag} | ltp top | ltp unload {dev}{flag}")
    emit(args, d, text)


def cmd_unload(args) -> None:
    dev = _dev(args.dev)
    if args.all and dev:
        raise UsageError("DEV: give a device or --all, not both")
    if not args.all and not dev:
        raise UsageError("DEV: give a device (or --all)")
    need_root("ltp unload")
    need_bcc()
    reg = _registry()
    if args.all:
        done = reg.unload_all(_ns_filter(args.netns))
    else:
        done = [reg.unload(dev, _netns(args.netns))]

    def text(rows: list) -> str:
        if not rows:
            return "nothing to unload"
        out = []
        for r in rows:
            what = f"prog id {r['prog_id']}" if r["prog_id"] else "program"
            out.append(f"unloaded {what} from {r['dev']} in {r['netns']}"
                       f"{'' if r['detached'] else ' (was not attached)'}"
                       + (f": {r['note']}" if r["note"] else ""))
        return "\n".join(out)
    emit(args, done, text)


# --------------------------------------------------------------------------- status

STATUS_COLS = [("NAMESPACE", 17, "<"), ("DEVICE", 15, "<"), ("MODE", 6, "<"), ("PROG", 6, ">"),
               ("ROLE", 6, "<"), ("JOB", 10, "<"), ("MAPS", 5, ">"), ("STATE", 9, "<")]


def _table_row(cols, values) -> str:
    return " ".join(f"{_fit(str(v), w):{a}{w}}" for (_, w, a), v in zip(cols, values)).rstrip()


def status_text(rows: list[dict]) -> str:
    out = [_table_row(STATUS_COLS, [c[0] for c in STATUS_COLS])]
    for r in rows:
        maps = (str(r["maps_pinned"]) if r["maps_pinned"] == r["maps_expected"]
                else f"{r['maps_pinned']}/{r['maps_expected']}")
        prog = r["prog_id"] or r["pinned_prog_id"] or "-"
        out.append(_table_row(STATUS_COLS, [r["netns"], r["dev"], r["mode"] or "-", prog,
                                            r["role"] or "-", _job(r["job"]), maps, r["state"]]))
    if not rows:
        out.append("(nothing loaded: `ltp load DEV --role ps --workers N` loads a program)")
    return "\n".join(out)


def cmd_status(args) -> None:
    ns = _ns_filter(args.netns)
    need_root("ltp status")
    emit(args, _registry().status(ns), status_text)


# --------------------------------------------------------------------------- flows

FLOW_COLS = [("WORKER", 6), ("PKTS", 7), ("BYTES", 7), ("ACKS", 7), ("DUP", 5), ("LATE", 5),
             ("OOR", 5), ("LAST", 6), ("FILL", 5), ("LOSS%", 6)]


def _targets(args) -> list:
    """Records of the programs a flows/top command is about."""
    reg = _registry()
    dev = _dev(args.dev)
    if dev:
        return [reg.find(dev, _netns(args.netns))]
    return [reg.find(d, n) for n, d in reg.entries(_ns_filter(args.netns))]


def _snapshots(recs: list) -> list[dict]:
    """A flows snapshot per record; a program whose pins cannot be read gets
    {"netns", "dev", "error"} instead."""
    from ..dataplane.xdp import flows
    reg = _registry()
    out = []
    for rec in recs:
        try:
            m = reg.open_maps(rec)
            try:
                out.append(flows.snapshot(rec, m))
            finally:
                m.close()
        except (reg.RegistryError, OSError) as e:
            out.append({"netns": reg.ns_key(rec.netns), "dev": rec.dev,
                        "error": getattr(e, "strerror", None) or str(e)})
    return out


def _wrap(text: str, width: int = 80) -> str:
    import textwrap
    return "\n".join(textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False))


def _program_title(s: dict) -> str:
    rn = s["round_now"]
    now = (f"round {rn['round']} {rn['state']}, {rn['nchunks']} chunks" if rn
           else "no round opened yet")
    return _wrap(f"{s['netns']}/{s['dev']}  {s['role']}  job {_job(s['job'])}  prog "
                 f"{s['prog_id']} ({s['mode']})  {now}")


_DROP_NAMES = {"malformed": "malformed", "foreign_job": "foreign-job",
               "unknown_worker": "unknown-worker", "bad_magic": "bad-magic",
               "bad_version": "bad-version", "ack_fail": "ack-fail"}


def _program_line(t: dict) -> str:
    """Program-wide drops (no slot): malformed and foreign-job always, the
    rarer classes when not zero."""
    shown = [k for k in _DROP_NAMES if k in ("malformed", "foreign_job") or t[k]]
    return _wrap("program: " + ", ".join(f"{_DROP_NAMES[k]} {t[k]}" for k in shown))


def flows_text(snaps: list[dict]) -> str:
    if not snaps:
        return "(nothing loaded: `ltp load DEV --role ps --workers N` loads a program)"
    blocks = []
    for s in snaps:
        if "error" in s:
            blocks.append(_wrap(f"{s['netns']}/{s['dev']}: error: {s['error']}"))
            continue
        lines = [_program_title(s),
                 " ".join(f"{n:>{w}}" for n, w in FLOW_COLS) + "  C/E/D/T"]
        for r in s["flows"]:
            rd = r["rounds"]
            vals = [r["worker"], r["packets"], r["bytes"], r["acks"], r["dup"], r["late"],
                    r["out_of_range"], r["last_delivered"] if r["last_round"] is not None else None,
                    r["last_filled"] if r["last_round"] is not None else None]
            cells = [_human(v, w) for v, (_, w) in zip(vals, FLOW_COLS)] + [_pct(r["loss"])]
            lines.append(" ".join(f"{c:>{w}}" for c, (_, w) in zip(cells, FLOW_COLS))
                         + f"  {rd['complete']}/{rd['early']}/{rd['deadline']}/{rd['timeout']}")
        t = s["totals"]
        tot = ["total", t["packets"], t["bytes"], t["acks"], t["dup"], t["late"],
               t["out_of_range"]]
        lines.append(" ".join(f"{_human(c, w) if not isinstance(c, str) else c:>{w}}"
                              for c, (_, w) in zip(tot, FLOW_COLS)).rstrip())
        lines.append(_program_line(t))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def cmd_flows(args) -> int | None:
    _dev(args.dev)
    _ns_filter(args.netns)
    need_root("ltp flows")
    snaps = _snapshots(_targets(args))
    broken = [s for s in snaps if "error" in s]
    if broken and args.dev:
        raise LtpError(f"{args.dev}: {broken[0]['error']}")
    emit(args, snaps, flows_text)
    return 1 if broken else None


# --------------------------------------------------------------------------- top

def _top_render(snaps: list[dict], prev: dict, errors: list[str]):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from ..dataplane.xdp import flows
    parts: list[Any] = []
    if not snaps and not errors:
        parts.append(Text("no LTP program is loaded (`ltp load DEV --role ps --workers N`); "
                          "waiting ... (q quits)"))
    for s in snaps:
        key = (s["netns"], s["dev"])
        rates = flows.rates(prev.get(key), s)
        t = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
        for name in ("WORKER", "PKT/s", "Mbit/s", "ACK/s", "DUP/s", "LATE/s", "ROUND",
                     "LAST%", "ALL%", "C/E/D/T"):
            t.add_column(name, justify="right", no_wrap=True)
        rn = s["round_now"]

        def worst(r):
            return (-1 if r["loss_last"] is None else r["loss_last"],
                    -1 if r["loss"] is None else r["loss"], -r["worker"])
        for r in sorted(s["flows"], key=worst, reverse=True):
            rt = rates.get((r["worker"], r["slot"]))
            rd = r["rounds"]

            def rate(k, scale=1.0):
                return "-" if rt is None else _human(rt[k] * scale, 6)
            t.add_row(str(r["worker"]), rate("packets"), rate("bytes", 8e-6), rate("acks"),
                      rate("dup"), rate("late"),
                      f"{r['round_chunks']}/{rn['nchunks']}" if rn else "-",
                      _pct(r["loss_last"]), _pct(r["loss"]),
                      f"{rd['complete']}/{rd['early']}/{rd['deadline']}/{rd['timeout']}")
        parts += [Text(_program_title(s), style="bold"), t, Text(_program_line(s["totals"])),
                  Text("")]
    for e in errors:
        parts.append(Text(f"error: {e}", style="red"))
    parts.append(Text(time.strftime("%H:%M:%S") + "  q quits", style="dim"))
    return Group(*parts)


class _Keys:
    """cbreak mode on a terminal stdin (restored on exit); `wait` returns a key or None."""

    def __init__(self):
        self.fd = sys.stdin.fileno() if sys.stdin.isatty() else None
        self.saved = None

    def __enter__(self) -> "_Keys":
        if self.fd is not None:
            import termios
            import tty
            self.saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def wait(self, seconds: float) -> str | None:
        if self.fd is None:
            time.sleep(seconds)
            return None
        import os
        import select
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            r, _, _ = select.select([self.fd], [], [], left)
            if r:
                ch = os.read(self.fd, 1).decode(errors="replace")
                if ch:
                    return ch
        return None

    def __exit__(self, *exc) -> None:
        if self.saved is not None:
            import termios
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)


def cmd_top(args) -> None:
    if not 0.1 <= args.interval <= 60:
        raise UsageError(f"--interval: must be in 0.1..60 seconds, got {args.interval}")
    if args.iterations is not None and args.iterations < 1:
        raise UsageError(f"--iterations: must be at least 1, got {args.iterations}")
    _dev(args.dev)
    _ns_filter(args.netns)
    need_root("ltp top")
    import signal

    from rich.console import Console
    from rich.live import Live

    from ..dataplane.xdp import flows
    reg = _registry()
    opened: dict[tuple, tuple] = {}       # (netns, dev) -> (record, maps)
    prev: dict[tuple, dict] = {}

    def sample():
        errors = []
        try:
            recs = _targets(args)
        except LtpError:
            raise
        except Exception as e:  # noqa: BLE001 - a program may vanish between list and open
            recs, errors = [], [str(e)]
        keys = set()
        snaps = []
        for rec in recs:
            key = (reg.ns_key(rec.netns), rec.dev)
            keys.add(key)
            try:
                if key not in opened or opened[key][0].prog_id != rec.prog_id:
                    if key in opened:
                        opened.pop(key)[1].close()
                    opened[key] = (rec, reg.open_maps(rec))
                snaps.append(flows.snapshot(rec, opened[key][1]))
            except Exception as e:  # noqa: BLE001
                errors.append(f"{key[1]} in {key[0]}: {e}")
        for key in list(opened):
            if key not in keys:
                opened.pop(key)[1].close()
        return snaps, errors

    interactive = sys.stdout.isatty()
    console = Console()
    def on_term(signum, frame):  # noqa: ARG001 - leave through the same clean-up as Ctrl-C
        raise KeyboardInterrupt

    old_term = signal.signal(signal.SIGTERM, on_term)
    n = 0
    try:
        with _Keys() as keys:
            snaps, errors = sample()
            if interactive:
                with Live(_top_render(snaps, prev, errors), console=console, screen=True,
                          auto_refresh=False, transient=True) as live:
                    while True:
                        prev = {(s["netns"], s["dev"]): s for s in snaps}
                        if (keys.wait(args.interval) or "").lower() == "q":
                            break
                        snaps, errors = sample()
                        live.update(_top_render(snaps, prev, errors), refresh=True)
                        n += 1
                        if args.iterations and n >= args.iterations:
                            break
            else:
                while True:
                    prev = {(s["netns"], s["dev"]): s for s in snaps}
                    if (keys.wait(args.interval) or "").lower() == "q":
                        break
                    snaps, errors = sample()
                    console.print(_top_render(snaps, prev, errors))
                    n += 1
                    if args.iterations and n >= args.iterations:
                        break
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old_term)
        for _, m in opened.values():
            m.close()


# --------------------------------------------------------------------------- capture

def cmd_capture(args) -> int | None:
    if args.read and args.dev:
        raise UsageError("DEV: give a device to capture on, or -r FILE, not both")
    if not args.read and not args.dev:
        raise UsageError("DEV: give a device to capture on (or -r FILE.pcap)")
    _dev(args.dev)
    ns = _netns(args.netns)
    if args.read and args.netns:
        raise UsageError("--netns: only for live capture, not with -r")
    if args.count is not None and args.count < 1:
        raise UsageError(f"-c: must be at least 1, got {args.count}")
    if args.timeout is not None and (args.read or args.timeout <= 0):
        raise UsageError("--timeout: a positive number of seconds, for live capture only")
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port: must be in 1..65535, got {args.port}")
    from ..dataplane.xdp import capture as C
    as_json, pretty = wants_json(args), bool(getattr(args, "pretty", False))
    collected: list[dict] = []
    seen = other = 0
    writer = C.pcap_writer(args.write) if args.write else None

    def say(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    def show(d: dict) -> None:
        if pretty:
            collected.append(d)
        elif as_json:
            print(json.dumps(d), flush=True)
        else:
            print(C.line(d), flush=True)

    def take(pkt, direction=None) -> bool:
        """Decode, show and keep one packet; True once -c packets were seen."""
        nonlocal seen, other
        d = C.decode(pkt, args.port, direction)
        if d is None:
            other += 1
            return False
        seen += 1
        show(d)
        if writer:
            writer.write(pkt)
        return bool(args.count and seen >= args.count)

    try:
        if args.read:
            for pkt in C.read_pcap(args.read):
                if take(pkt):
                    break
            dropped = 0
        else:
            need_root("ltp capture (live)")
            with C.LiveCapture(args.dev, ns, args.port) as cap:
                say(f"listening on {args.dev} in {ns or 'the host namespace'} (LTP on UDP port "
                    f"{args.port}); Ctrl-C stops")
                try:
                    for ts, frame, direction in cap.frames(args.timeout):
                        if take(C.frame_packet(frame, ts), direction):
                            break
                except KeyboardInterrupt:
                    pass
                dropped = cap.drops()
    except C.CaptureError as e:
        raise LtpError(str(e)) from None
    finally:
        if writer:
            writer.close()
    if pretty:
        print(json.dumps(collected, indent=2))
    say(f"{seen} LTP packet{'s' if seen != 1 else ''}"
        + (f", {other} other skipped" if other else "")
        + (f", {dropped} dropped by the kernel" if dropped else "")
        + (f"; written to {args.write}" if args.write else ""))
    return None
