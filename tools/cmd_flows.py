# SPDX-License-Identifier: Apache-2.0
"""`ltp flows` and `ltp top`: per-worker counters of loaded LTP programs, once
or live. Both read the pinned maps of what `ltp load` (or a running
endpoint) left; see cmd_ops.py for load/unload/status and docs/operations.md.

  ltp flows [DEV] [--netns NS] [-j]
  ltp top [DEV] [--netns NS] [--interval 1] [-c N] [-j]
"""
from __future__ import annotations

import signal
import sys
import time
import re
from typing import Any

from .common import (LtpError, UsageError, add_json, console, emit, need_root, table,
                     wants_json)
from .flags import add_netns
from .opviews import (add_parser, check_dev, guard, job_text, listed_ns, netns_arg, registry,
                      role_text)

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
  sudo ltp top -c 3 > snapshot.txt        (batch mode: no terminal needed)
  sudo ltp top -j --interval 5 | jq -c '.programs[].flows[] | {worker, rates}'

Rows are sorted by the loss of the last recorded round (then over all rounds).
Rates are per second over the interval. Keys: q quits (Ctrl-C too).
-j prints one JSON object a line per interval: {time, interval_s, programs:
[the `ltp flows -j` snapshot, each flow with "rates" per second], errors}.
"""


def register(sub) -> None:
    p = add_parser(sub, "flows", "per-worker counters of loaded LTP programs", FLOWS_EPILOG)
    _add_targets(p)
    add_json(p)
    p.set_defaults(func=guard(cmd_flows))

    p = add_parser(sub, "top", "live per-worker rates and loss, worst first", TOP_EPILOG)
    _add_targets(p)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between updates "
                   "(0.1..60, default 1)")
    p.add_argument("-c", "--count", "--iterations", type=int, metavar="N", dest="iterations",
                   help="stop after N updates (default: until q, Ctrl-C or SIGTERM)")
    add_json(p)
    p.set_defaults(func=guard(cmd_top))


def _add_targets(p) -> None:
    """DEV and --netns: one program, or every program (in one namespace)."""
    p.add_argument("dev", metavar="DEV", nargs="?", help="device (default: every program)")
    add_netns(p, "either")


def _targets(args) -> list:
    """Records of the programs a flows/top command is about: a device's
    own and those in seats of its mux."""
    reg = registry()
    dev = check_dev(args.dev)
    if dev:
        ns = netns_arg(args.netns)
        seats = reg.seat_records(ns, dev)
        try:
            return [reg.find(dev, ns), *seats]
        except reg.RegistryError:
            if seats:           # a device shared through its mux: its seats alone
                return seats
            raise
    ns = listed_ns(args.netns)
    return [reg.find(d, n) for n, d in reg.entries(ns)] + reg.seat_records(ns)


def _key(s: dict) -> tuple:
    """A snapshot's program: its device, and its seat's port (None: the device's own)."""
    return s["netns"], s["dev"], s.get("seat_port")


# --------------------------------------------------------------------------- formats

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


# --------------------------------------------------------------------------- flows

#: (header, width): counters get a K/M/G suffix past their width, so a row
#: fits 80 columns whatever the counts
FLOW_COLS = [("WORKER", 6), ("PKTS", 7), ("BYTES", 7), ("ACKS", 7), ("DUP", 5), ("LATE", 5),
             ("OOR", 5), ("LAST", 6), ("FILL", 5), ("LOSS%", 6), ("C/E/D/T", 11)]


def _snapshots(recs: list) -> list[dict]:
    """A flows snapshot per record; a program whose pins cannot be read gets
    {"netns", "dev", "error"} instead."""
    from ..dataplane.xdp import flows
    reg = registry()
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
                        "seat_port": rec.port or None,
                        "error": getattr(e, "strerror", None) or str(e)})
    return out


def _wrap(text: str, width: int | None = None) -> str:
    """`text` in lines of at most `width` (the console's: the terminal's, 80
    off one), broken only between its phrases (parts set off by two spaces
    or a comma), never inside one; continuation lines indented."""
    width = width or console().width
    lines = []
    for line in text.splitlines() or [""]:     # a newline in the text stays a break
        cur = ""
        for phrase in re.findall(r".+?(?:,\s|\s\s|$)", line):
            if cur.strip() and len(cur.rstrip()) + len(phrase.rstrip()) > width:
                lines.append(cur.rstrip())
                cur = "  "
            cur += phrase
        lines.append(cur.rstrip())
    return "\n".join(lines)


def _program_title(s: dict) -> str:
    rn = s["round_now"]
    wire = f" (wire {rn['wire_round']})" if rn and rn["wire_round"] != rn["round"] else ""
    now = (f"round {rn['round']}{wire} {rn['state']}, {rn['nchunks']} chunks" if rn
           else "no round opened yet")
    # "sender xdp (the default)", "sender socket (the fallback)", "... (asked for)"
    why = (s.get("sender_why") or "").partition(":")[2].split(",")[0].strip()
    sender = f"  sender {s['sender']}" + (f" ({why})" if why else "") if s.get("sender") else ""
    seat = f" port {s['seat_port']}" if s.get("seat_port") else ""
    return _wrap(f"{s['netns']}/{s['dev']}{seat}  {role_text(s)}  job {job_text(s['job'])}  prog "
                 f"{s['prog_id']} ({s['mode']}){sender}  {now}")


_DROP_NAMES = {"malformed": "malformed", "foreign_job": "foreign-job",
               "unknown_worker": "unknown-worker", "bad_magic": "bad-magic",
               "bad_version": "bad-version", "ack_fail": "ack-fail", "bad_token": "bad-token",
               "stale_owner": "stale-owner"}


def _program_line(t: dict) -> str:
    """Program-wide drops (no slot): malformed and foreign-job always, the
    rarer classes when not zero."""
    shown = [k for k in _DROP_NAMES if k in ("malformed", "foreign_job") or t[k]]
    return _wrap("program: " + ", ".join(f"{_DROP_NAMES[k]} {t[k]}" for k in shown))


def _flow_table(s: dict):
    """One program's rows and its total, columns as FLOW_COLS."""
    t = table([(h, "right", False) for h, _ in FLOW_COLS], [], least=[w for _, w in FLOW_COLS])
    for r in s["flows"]:
        rd, last = r["rounds"], r["last_round"] is not None
        vals = [r["worker"], r["packets"], r["bytes"], r["acks"], r["dup"], r["late"],
                r["out_of_range"], r["last_delivered"] if last else None,
                r["last_filled"] if last else None]
        t.add_row(*[_human(v, w) for v, (_, w) in zip(vals, FLOW_COLS)], _pct(r["loss"]),
                  f"{rd['complete']}/{rd['early']}/{rd['deadline']}/{rd['timeout']}")
    tot = s["totals"]
    t.add_row("total", *[_human(tot[k], w) for k, (_, w) in
                         zip(("packets", "bytes", "acks", "dup", "late", "out_of_range"),
                             FLOW_COLS[1:])], style="bold")
    return t


def flows_text(snaps: list[dict]):
    from rich.console import Group
    from rich.text import Text
    if not snaps:
        return "(nothing loaded: `ltp load DEV --role ps --workers N` loads a program)"
    parts: list[Any] = []
    for s in snaps:
        if parts:
            parts.append(Text(""))
        if "error" in s:
            seat = f" port {s['seat_port']}" if s.get("seat_port") else ""
            parts.append(Text(_wrap(f"{s['netns']}/{s['dev']}{seat}: error: {s['error']}"),
                              style="red"))
            continue
        parts += [Text(_program_title(s), style="bold"), _flow_table(s),
                  Text(_program_line(s["totals"]))]
    return Group(*parts)


def cmd_flows(args) -> int | None:
    check_dev(args.dev)
    listed_ns(args.netns)
    need_root("ltp flows")
    snaps = _snapshots(_targets(args))
    broken = [s for s in snaps if "error" in s]
    if broken and args.dev:
        raise LtpError(f"{args.dev}: {broken[0]['error']}")
    emit(args, snaps, flows_text)
    return 1 if broken else None


# --------------------------------------------------------------------------- top

def _top_render(snaps: list[dict], prev: dict, errors: list[str], keys: bool = False):
    """One update of `ltp top`; `keys`: the q key works (a terminal), so say so."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from ..dataplane.xdp import flows
    parts: list[Any] = []
    if not snaps and not errors:
        parts.append(Text("no LTP program is loaded (`ltp load DEV --role ps --workers N`); "
                          "waiting ..." + (" (q quits)" if keys else "")))
    for s in snaps:
        key = _key(s)
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

            def rate(k, scale=1.0, rt=rt):
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
    parts.append(Text(time.strftime("%H:%M:%S") + ("  q quits" if keys else ""), style="dim"))
    return Group(*parts)


class _Keys:
    """cbreak mode on a terminal stdin (restored on exit); `wait` returns a key or None."""

    def __init__(self):
        self.fd = sys.stdin.fileno() if sys.stdin.isatty() else None
        self.saved = None

    def __enter__(self) -> _Keys:
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


class _Sampler:
    """Snapshots of the programs `ltp top` shows: each program's pinned maps
    are opened once (again when its program id changes) and closed when it
    goes away or `close` is called."""

    def __init__(self, args):
        self.args = args
        self.opened: dict[tuple, tuple] = {}      # (netns, dev, port) -> (record, maps)

    def __call__(self) -> tuple[list[dict], list[str]]:
        from ..dataplane.xdp import flows
        reg = registry()
        errors = []
        try:
            recs = _targets(self.args)
        except LtpError:
            raise
        except Exception as e:  # noqa: BLE001 - a program may vanish between list and open
            recs, errors = [], [str(e)]
        keys = set()
        snaps = []
        for rec in recs:
            key = (reg.ns_key(rec.netns), rec.dev, rec.port or None)
            keys.add(key)
            try:
                if key not in self.opened or self.opened[key][0].prog_id != rec.prog_id:
                    if key in self.opened:
                        self.opened.pop(key)[1].close()
                    self.opened[key] = (rec, reg.open_maps(rec))
                snaps.append(flows.snapshot(rec, self.opened[key][1]))
            except Exception as e:  # noqa: BLE001
                errors.append(f"{key[1]}{f' port {key[2]}' if key[2] else ''} in {key[0]}: {e}")
        for key in list(self.opened):
            if key not in keys:
                self.opened.pop(key)[1].close()
        return snaps, errors

    def close(self) -> None:
        for _, m in self.opened.values():
            m.close()


def cmd_top(args) -> None:
    if not 0.1 <= args.interval <= 60:
        raise UsageError(f"--interval: must be in 0.1..60 seconds, got {args.interval}")
    if args.iterations is not None and args.iterations < 1:
        raise UsageError(f"--count: must be at least 1, got {args.iterations}")
    check_dev(args.dev)
    listed_ns(args.netns)
    need_root("ltp top")
    sample = _Sampler(args)

    def on_term(signum, frame):  # noqa: ARG001 - leave through the same clean-up as Ctrl-C
        raise KeyboardInterrupt

    old_term = signal.signal(signal.SIGTERM, on_term)
    try:
        if wants_json(args):
            _top_json(args, sample)
        else:
            with _Keys() as keys:
                _top_loop(args, sample, keys)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old_term)
        sample.close()


def _top_loop(args, sample: _Sampler, keys: _Keys) -> None:
    """Update every --interval until q, Ctrl-C or --count updates: in
    place on a terminal (full screen), else one printed block per update."""
    import contextlib

    from rich.console import Console
    from rich.live import Live
    screen = Console()
    snaps, errors = sample()
    with contextlib.ExitStack() as stack:
        if sys.stdout.isatty():
            live = stack.enter_context(Live(_top_render(snaps, {}, errors, keys.fd is not None),
                                            console=screen,
                                            screen=True, auto_refresh=False, transient=True))

            def show(r) -> None:
                live.update(r, refresh=True)
        else:
            show = screen.print
        n = 0
        while True:
            prev = {_key(s): s for s in snaps}
            if (keys.wait(args.interval) or "").lower() == "q":
                break
            snaps, errors = sample()
            show(_top_render(snaps, prev, errors, sys.stdout.isatty() and keys.fd is not None))
            n += 1
            if args.iterations and n >= args.iterations:
                break


def _top_json(args, sample: _Sampler) -> None:
    """-j: after every --interval, one JSON object (a line; -p indents it):
    each program's flows snapshot, each flow with its per-second rates over
    the interval, until --count objects, Ctrl-C or SIGTERM."""
    from ..dataplane.xdp import flows
    snaps, _ = sample()
    n = 0
    while not args.iterations or n < args.iterations:
        prev = {_key(s): s for s in snaps}
        time.sleep(args.interval)
        snaps, errors = sample()
        for s in snaps:
            rates = flows.rates(prev.get(_key(s)), s)
            for r in s["flows"]:
                r["rates"] = rates.get((r["worker"], r["slot"]))
        emit(args, {"time": time.time(), "interval_s": args.interval, "programs": snaps,
                    "errors": errors})
        sys.stdout.flush()
        n += 1
