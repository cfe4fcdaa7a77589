# SPDX-License-Identifier: Apache-2.0
"""Operator commands on pinned LTP programs, bpftool style: load, unload,
status (this module); flows and top (cmd_flows.py); capture (cmd_capture.py).
See docs/operations.md.

  ltp load DEV --role ps|worker [--netns NS] [--mode native|skb] [--job COOKIE]
           [--workers N | --id W] [--max-elems N | --max-chunks N] [--chunk-bytes 1424]
           [--port 7410] [--force] [-j]
  ltp unload DEV [--netns NS] | ltp unload --all [--netns NS]       [-j]
  ltp status [--netns NS] [-j]

`load` leaves the program attached and pinned under
/sys/fs/bpf/ltp/<netns or host>/<dev>/ with a record in
/run/ltp/xdp/<netns or host>/<dev>.json; every other command works from those,
from any process. Exit codes: 0 ok, 1 runtime error, 2 usage error.
"""
from __future__ import annotations

from ..dataplane.xdp.wire import CHUNK_BYTES
from .common import UsageError, add_json, emit, need_bcc, need_root, table
from .flags import add_netns, add_port, add_xdp_mode, check_port
from .opviews import (add_parser, check_dev, dev_text, guard, job_text, listed_ns, netns_arg,
                      ns_filter, registry, role_text)

DEFAULT_CHUNK_BYTES = CHUNK_BYTES
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
--max-elems float32 elements). The program stays attached after `load` exits
(its BPF link, program and maps pinned: the operator's choice; an endpoint's
program instead dies with its process); `ltp unload` removes it. Loading on a
device that carries an XDP program (an endpoint's, another `load`'s, anyone's)
is refused (exit 1) with its id and name, unless --force.
"""

UNLOAD_EPILOG = """examples:
  sudo ltp unload ltp-ps --netns ltp-default-ps
  sudo ltp unload eth1
  sudo ltp unload --all                  everything `ltp load` left on this machine
  sudo ltp unload --all --netns ltp-default-ps

Detaches the program (only if the device still carries the one that was
loaded), removes its pins and record; a record whose namespace is gone, or
whose endpoint process died (STATE dead), is removed too. A running
endpoint's program is not unloaded (it detaches when its process exits).
"""

STATUS_EPILOG = """examples:
  sudo ltp status
  sudo ltp status -j
  sudo ltp status --netns ltp-default-ps

STATE: ok; dead (the endpoint process that held it exited, taking program
and maps with it: `ltp unload` removes the record); detached (the device
carries no program or another one); no netns / no device (gone: `ltp unload`
cleans up); no record / no pins / partial (some pins missing: unload and
load again). MAPS: maps reachable (pinned, or by id while the owner lives).
"""


def register(sub) -> None:
    p = add_parser(sub, "load", "attach ltp_xdp to a device and pin it and its maps", LOAD_EPILOG)
    p.add_argument("dev", metavar="DEV", help="device to attach to")
    p.add_argument("--role", choices=("ps", "worker"), required=True,
                   help="ps: receives workers' pushes; worker: receives the downlink")
    add_netns(p)
    add_xdp_mode(p)
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
    add_port(p)
    p.add_argument("--force", action="store_true",
                   help="replace a program the device carries already (an endpoint's too)")
    add_json(p)
    p.set_defaults(func=guard(cmd_load))

    p = add_parser(sub, "unload", "detach and unpin what `ltp load` loaded", UNLOAD_EPILOG)
    p.add_argument("dev", metavar="DEV", nargs="?", help="device (or --all)")
    add_netns(p)
    p.add_argument("--all", action="store_true", help="every program `ltp load` left")
    add_json(p)
    p.set_defaults(func=guard(cmd_unload))

    p = add_parser(sub, "status", "list loaded LTP programs", STATUS_EPILOG)
    add_netns(p, "filter")
    add_json(p)
    p.set_defaults(func=guard(cmd_status))


# --------------------------------------------------------------------------- load

def _int(text: str, flag: str, lo: int, hi: int) -> int:
    try:
        v = int(text, 0)
    except ValueError:
        raise UsageError(f"{flag}: {text!r} is not a number") from None
    if not lo <= v <= hi:
        raise UsageError(f"{flag}: must be in {lo}..{hi}, got {text}")
    return v


def _peers(args) -> dict[int, int]:
    """worker id -> slot: a PS's --workers N, or a worker's own --id W."""
    if args.role == "ps":
        if args.worker_id is not None:
            raise UsageError("--id: only for --role worker (a PS takes --workers N)")
        if args.workers is None:
            raise UsageError("--workers: a PS needs the number of workers (ids 0..N-1)")
        if not 1 <= args.workers <= MAX_SLOTS:
            raise UsageError(f"--workers: must be in 1..{MAX_SLOTS}, got {args.workers}")
        return {w: w for w in range(args.workers)}
    if args.workers is not None:
        raise UsageError("--workers: only for --role ps (a worker takes --id W)")
    if args.worker_id is None:
        raise UsageError("--id: a worker needs its worker id")
    if not 0 <= args.worker_id <= 65535:
        raise UsageError(f"--id: must be in 0..65535, got {args.worker_id}")
    return {args.worker_id: 0}


def _max_chunks(args) -> int:
    """Chunks of the largest round buffer, from --max-elems or --max-chunks."""
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
    return max_chunks


def cmd_load(args) -> None:
    dev = check_dev(args.dev)
    ns = netns_arg(args.netns)
    job = _int(args.job, "--job", 0, 2**32 - 1)
    peers = _peers(args)
    max_chunks = _max_chunks(args)
    check_port(args.port)
    need_root("ltp load")
    need_bcc()
    reg = registry()
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
        flag = reg.nsflag(ns)
        mib = g["banks"] * g["slots"] * g["max_chunks"] * g["chunk_bytes"] / 2**20
        return (f"loaded ltp_xdp (prog id {d['prog_id']}) on {reg.where(dev, ns)}, {d['mode']} "
                f"mode: {who}, job {job_text(d['job'])}\n"
                f"geometry {g['slots']} slots x {g['max_chunks']} chunks x {g['chunk_bytes']} B "
                f"x {g['banks']} banks ({mib:.1f} MiB), port {g['port']}\n"
                f"pinned in {d['pin_dir']}/, record {d['record']}\n"
                f"next: ltp flows {dev}{flag} | ltp top | ltp unload {dev}{flag}")
    emit(args, d, text)


# --------------------------------------------------------------------------- unload

def cmd_unload(args) -> None:
    dev = check_dev(args.dev)
    if args.all and dev:
        raise UsageError("DEV: give a device or --all, not both")
    if not args.all and not dev:
        raise UsageError("DEV: give a device (or --all)")
    need_root("ltp unload")
    need_bcc()
    reg = registry()
    if args.all:
        done = reg.unload_all(ns_filter(args.netns))
    else:
        done = [reg.unload(dev, netns_arg(args.netns))]

    def text(rows: list) -> str:
        if not rows:
            return "nothing to unload"
        out = []
        for r in rows:
            what = f"prog id {r['prog_id']}" if r["prog_id"] else "program"
            done_ = "left {} on" if r.get("skipped") else "unloaded {} from"
            dev = dev_text(r)
            quiet = r["detached"] or r.get("skipped") or r.get("seat_port") or "seats" in r
            out.append(f"{done_.format(what)} {dev} in {r['netns']}"
                       f"{'' if quiet else ' (was not attached)'}"
                       + (f": {r['note']}" if r["note"] else ""))
        return "\n".join(out)
    emit(args, done, text)


# --------------------------------------------------------------------------- status

#: (header, justify, may shrink): NAMESPACE and DEVICE give way (ending in
#: "…") when a row would not fit the terminal, or 80 columns off a terminal
STATUS_COLS = [("NAMESPACE", "left", True), ("DEVICE", "left", True), ("MODE", "left", False),
               ("PROG", "right", False), ("ROLE", "left", False), ("JOB", "left", False),
               ("MAPS", "right", False), ("STATE", "left", False)]


def status_text(rows: list[dict]):
    from rich.console import Group
    from rich.text import Text
    cells = []
    for r in rows:
        n = r.get("maps", r["maps_pinned"])       # reachable: pinned, or by id
        maps = str(n) if n == r["maps_expected"] else f"{n}/{r['maps_expected']}"
        prog = r["prog_id"] or r["pinned_prog_id"] or "-"
        dev = dev_text(r)
        cells.append([r["netns"], dev, r["mode"] or "-", str(prog), role_text(r),
                      job_text(r["job"]), maps, r["state"]])
    t = table(STATUS_COLS, cells)
    for r, row in zip(rows, cells):
        t.add_row(*row, style=None if r["state"] == "ok" else "red")
    if not rows:
        return Group(t, Text("(nothing loaded: `ltp load DEV --role ps --workers N` loads "
                             "a program)"))
    return t


def cmd_status(args) -> None:
    ns = listed_ns(args.netns)
    need_root("ltp status")
    emit(args, registry().status(ns), status_text)
