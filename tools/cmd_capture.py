# SPDX-License-Identifier: Apache-2.0
"""`ltp capture`: LTP frames live at the NIC, or from a capture file; shown
as lines or JSON, written as pcap or pcapng. The mechanism is dataplane/xdp's:
capring.py (ltp_xdp's capture ring), capture.py (decoding, AF_PACKET), pcap.py.

  ltp capture DEV [--netns NS] [-c N] [--duration S] [--snaplen N] [--tx]
              [--job J] [--worker W] [--round R] [--via auto|xdp|socket]
              [-w FILE.pcap[ng] [--print]] [-j]
  ltp capture -r FILE [-c N] [--job J] [--worker W] [--round R] [-w FILE] [-j]
"""
from __future__ import annotations

import json
import os
import signal
import sys

from ..dataplane.xdp.headers import defines
from .common import UsageError, add_json, need_root, wants_json
from .flags import add_netns, add_port, check_port
from .opviews import add_parser, check_dev, guard, netns_arg

# eth + ip + udp + LTP header: the least a snapshot must keep to be decoded
MIN_SNAPLEN = 14 + 20 + 8 + defines("ltp_wire.h")["LTP_HDR_LEN"]
MAX_SNAPLEN = 262144
# The ring is drained by this process: when the workload keeps every CPU busy
# (16 incast workers on 2 cores) a capture at the normal priority gets too
# small a share to keep pace, the ring fills and frames are lost (counted).
NICE = -10

CAPTURE_EPILOG = """examples:
  sudo ltp capture ltp-ps --netns ltp-default-ps -c 20
  sudo ltp capture ltp-ps --netns ltp-default-ps -w /tmp/ltp.pcapng --duration 5
  sudo ltp capture ltp-ps --netns ltp-default-ps --worker 3 --round 7 --tx
  sudo ltp capture ltp-w0 --netns ltp-default-w0 --via socket -c 10
  ltp capture -r /tmp/ltp.pcapng -j
  ltp capture -r /tmp/ltp.pcap --worker 3 -c 5

Where DEV carries ltp_xdp (loaded by `ltp load` or by a running endpoint), the
program itself copies each LTP frame as it arrives, with a kernel timestamp
and its verdict, into a ring buffer this command drains (--via xdp; --tx adds
the ACKs it sends back). Elsewhere an AF_PACKET socket captures (--via socket):
it sees what XDP passes and what the host sends, not what an XDP program
consumes. The summary on stderr always gives the drop count (ring full, or
socket buffer full), also with -q; under -j it is one JSON object.

One line per LTP packet: time, in/out, addresses, type, worker (w=), round (r=),
chunk/nchunks (c=), payload length, flags (ACK: receiver state and advertised
rate), and ltp_xdp's verdict. -j prints one JSON object per packet (JSON
lines); -p one JSON list. With -w nothing is printed per packet unless --print.
-w FILE.pcapng keeps direction and verdict (as the packet comment); any other
name gets a nanosecond pcap. Decode them in Wireshark with the dissector in
tools/wireshark/ltp.lua (docs/wire-format.md).
"""


def register(sub) -> None:
    p = add_parser(sub, "capture", "capture LTP frames at the NIC, or decode a capture file",
                   CAPTURE_EPILOG)
    p.add_argument("dev", metavar="DEV", nargs="?", help="device to capture on (not with -r)")
    add_netns(p)
    p.add_argument("-c", "--count", type=int, metavar="N", help="stop after N LTP packets")
    p.add_argument("-r", "--read", metavar="FILE", help="read packets from a pcap/pcapng file")
    p.add_argument("-w", "--write", metavar="FILE",
                   help="write the LTP packets to FILE (pcapng if it ends .pcapng, else pcap)")
    p.add_argument("--print", action="store_true", help="with -w: print the packets as well")
    p.add_argument("--duration", "--timeout", type=float, metavar="S", dest="duration",
                   help="live: stop after S seconds")
    p.add_argument("--snaplen", type=int, metavar="N",
                   help=f"bytes of each frame to keep ({MIN_SNAPLEN}..{MAX_SNAPLEN}; "
                        "default: all of it)")
    p.add_argument("--job", metavar="J", help="only packets of job cookie J (e.g. 0x17)")
    p.add_argument("--worker", type=int, metavar="W", help="only packets of worker id W")
    p.add_argument("--round", type=int, metavar="R", help="only packets of round R")
    p.add_argument("--tx", action="store_true",
                   help="ring: also the frames ltp_xdp sends back (XDP_TX: its ACKs)")
    p.add_argument("--via", choices=("auto", "xdp", "socket"), default="auto",
                   help="live: ltp_xdp's ring, an AF_PACKET socket, or the ring where DEV "
                        "carries ltp_xdp (default auto)")
    p.add_argument("--nice", type=int, default=NICE, metavar="N",
                   help=f"live: run at this nice level (default {NICE}: a workload that keeps "
                        "the CPUs busy must not starve the capture; 0 leaves it as it is)")
    add_port(p)
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no banner (the summary with the drop count stays)")
    add_json(p)
    p.set_defaults(func=guard(cmd_capture))


def _int_flag(text, flag: str, top: int) -> int | None:
    if text is None:
        return None
    try:
        v = int(text, 0) if isinstance(text, str) else int(text)
    except ValueError:
        raise UsageError(f"{flag}: not a number: {text!r}") from None
    if not 0 <= v <= top:
        raise UsageError(f"{flag}: must be in 0..{top}, got {v}")
    return v


def _check(args) -> str | None:
    """Check the flags (usage errors, exit 2); the namespace of a live capture."""
    if args.read and args.dev:
        raise UsageError("DEV: give a device to capture on, or -r FILE, not both")
    if not args.read and not args.dev:
        raise UsageError("DEV: give a device to capture on (or -r FILE.pcap)")
    check_dev(args.dev)
    ns = netns_arg(args.netns)
    live_only = [f for f, on in (("--netns", args.netns), ("--duration", args.duration),
                                 ("--tx", args.tx), ("--via", args.via != "auto"),
                                 ("--nice", args.nice != NICE)) if on]
    if args.read and live_only:
        raise UsageError(f"{live_only[0]}: only for live capture, not with -r")
    if args.count is not None and args.count < 1:
        raise UsageError(f"-c: must be at least 1, got {args.count}")
    if args.duration is not None and args.duration <= 0:
        raise UsageError(f"--duration: a positive number of seconds, got {args.duration:g}")
    if args.snaplen is not None and not MIN_SNAPLEN <= args.snaplen <= MAX_SNAPLEN:
        raise UsageError(f"--snaplen: must be in {MIN_SNAPLEN}..{MAX_SNAPLEN} (the headers "
                         f"need {MIN_SNAPLEN} bytes), got {args.snaplen}")
    if not -20 <= args.nice <= 19:
        raise UsageError(f"--nice: must be in -20..19, got {args.nice}")
    if args.tx and args.via == "socket":
        raise UsageError("--tx: only with the ring (--via xdp or auto)")
    args.job = _int_flag(args.job, "--job", 2**32 - 1)
    args.worker = _int_flag(args.worker, "--worker", 65535)
    args.round = _int_flag(args.round, "--round", 2**32 - 1)
    check_port(args.port)
    return ns


class _Out:
    """Shows (text, JSON lines, or one JSON list under -p) and writes (-w) the
    LTP packets; counts them, the others and those the filters left out."""

    def __init__(self, args, snaplen: int | None = None, ifname: str | None = None):
        from ..dataplane.xdp import capture
        self.C, self.args, self.snaplen, self.ifname = capture, args, snaplen, ifname
        self.as_json, self.pretty = wants_json(args), bool(getattr(args, "pretty", False))
        self.show = not args.write or args.print
        self.filters = (args.job, args.worker, args.round)
        self.collected: list[dict] = []
        self.lines: list[str] = []
        self.writer = None
        self.seen = self.other = self.filtered = self.inbound = 0
        from ..dataplane.xdp.capring import XDP_VERDICTS
        self._verdict_comments = {v: f"ltp_xdp verdict {n}" for v, n in XDP_VERDICTS.items()}

    def take(self, ts_ns: int, frame: bytes, wire_len: int, direction: str | None = None,
             verdict: str | None = None, linktype: int = 1, prefiltered: bool = False) -> bool:
        """One frame; True once -c packets were taken."""
        C, d = self.C, None
        if self.show or not prefiltered:
            d = C.decode(frame, ts_ns=ts_ns, wire_len=wire_len, direction=direction,
                         port=self.args.port, linktype=linktype)
            if d is None:
                self.other += 1
                return False
            if not prefiltered and not C.matches(d, *self.filters):
                self.filtered += 1
                return False
        self.seen += 1
        self.inbound += direction == "in"
        if d is not None and self.show:
            if verdict:
                d["verdict"] = verdict
            if self.pretty:
                self.collected.append(d)
            else:
                self.lines.append(json.dumps(d) if self.as_json else C.line(d))
        if self.args.write:
            self._write(ts_ns, frame, wire_len, direction, verdict, linktype)
        return bool(self.args.count and self.seen >= self.args.count)

    def take_ring(self, batch, offset_ns: int) -> bool:
        """Records of ltp_xdp's ring (filtered in the kernel); True once -c
        packets were taken. Writing only (-w without --print) skips the
        per-packet decoding: the ring must drain faster than frames come."""
        if self.show:
            return any(self.take(r.ts_ns + offset_ns, r.frame, r.wire_len, r.direction,
                                 r.verdict_name, prefiltered=True) for r in batch)
        if self.args.count:
            batch = batch[:self.args.count - self.seen]
        if batch:
            self._write(batch[0].ts_ns + offset_ns, b"", 0, None, None, 1, open_only=True)
            names = self._verdict_comments
            self.writer.write_many([(r.ts_ns + offset_ns, r.frame[:self.snaplen or None],
                                     r.wire_len, r.direction, names[r.verdict])
                                    for r in batch])
        self.seen += len(batch)
        self.inbound += sum(r.direction == "in" for r in batch)
        return bool(self.args.count and self.seen >= self.args.count)

    def _write(self, ts_ns, frame, wire_len, direction, verdict, linktype,
               open_only: bool = False) -> None:
        if self.writer is None:
            from ..dataplane.xdp.pcap import Writer
            self.writer = Writer(self.args.write, self.snaplen or MAX_SNAPLEN, linktype,
                                 self.ifname)
        if open_only:
            return
        if self.snaplen and len(frame) > self.snaplen:
            frame = frame[:self.snaplen]
        self.writer.write(ts_ns, frame, wire_len, direction,
                          f"ltp_xdp verdict {verdict}" if verdict else None)

    def flush(self) -> None:
        if self.lines:
            sys.stdout.write("\n".join(self.lines) + "\n")
            self.lines = []
        sys.stdout.flush()
        if self.writer:
            self.writer.flush()

    def close(self) -> None:
        self.flush()
        if self.args.write and self.writer is None:
            self._write_empty()
        if self.writer:
            self.writer.close()
        if self.pretty:
            print(json.dumps(self.collected, indent=2))

    def _write_empty(self) -> None:
        from ..dataplane.xdp.pcap import Writer
        self.writer = Writer(self.args.write, self.snaplen or MAX_SNAPLEN, 1, self.ifname)


def cmd_capture(args) -> int | None:
    ns = _check(args)
    out = _Out(args, args.snaplen, None if args.read else args.dev)
    summary: dict = {"via": "file" if args.read else None}
    try:
        if args.read:
            summary.update(_from_file(args, out))
        else:
            need_root("ltp capture (live)")
            if args.nice:
                os.setpriority(os.PRIO_PROCESS, 0, args.nice)
            with _Stopper() as stop:
                summary.update(_live(args, ns, out, stop))
    finally:
        out.close()
    _summarise(args, out, summary)
    return None


def _from_file(args, out: _Out) -> dict:
    """Show (and write) the file's frames; the summary's `cut_short`: where the
    file ends inside a block, read up to the last whole one (None: it does not)."""
    from ..dataplane.xdp import pcap
    notes: list[str] = []
    for i, f in enumerate(pcap.read(args.read, notes)):
        if out.take(f.ts_ns, f.data, f.wire_len, f.direction, _verdict_of(f.comment),
                    f.linktype):
            break
        if i % 4096 == 4095:
            out.flush()
    return {"cut_short": notes[0] if notes else None}


def _verdict_of(comment: str | None) -> str | None:
    """The verdict `-w FILE.pcapng` kept in a packet comment."""
    if comment and comment.startswith("ltp_xdp verdict "):
        return comment.split()[-1]
    return None


def _live(args, ns: str | None, out: _Out, stop: _Stopper) -> dict:
    """Capture on DEV until -c packets, --duration, Ctrl-C or SIGTERM; what
    the summary says."""
    maps = _ring_maps(args, ns)
    if maps is None:
        return _from_socket(args, ns, out, stop)
    try:
        return _from_ring(args, ns, out, maps, stop)
    finally:
        maps.close()


def _ring_maps(args, ns: str | None):
    """The capture maps of the ltp_xdp on DEV, or None to use a socket."""
    from ..dataplane.xdp import capring, lookup
    if args.via == "socket":
        return None
    att = lookup.xdp_on(args.dev, ns)
    maps = capring.CaptureMaps.of_program(att["prog_id"]) if att else None
    where = f"{args.dev} in {ns or 'the host namespace'}"
    if maps is None:
        what = (f"XDP program id {att['prog_id']}, which is not ltp_xdp (or predates capture)"
                if att else "no XDP program")
        if args.via == "xdp" or args.tx:
            raise capring.CaptureError(f"{where} carries {what}: no capture ring there; "
                                       "`ltp load` ltp_xdp on it, or use --via socket")
        _say(args, f"{where} carries {what}: capturing with an AF_PACKET socket, which sees "
                   "only what XDP passes")
    return maps


def _from_ring(args, ns: str | None, out: _Out, maps, stop: _Stopper) -> dict:
    from ..dataplane.xdp import capring
    cap = capring.RingCapture(maps, snaplen=args.snaplen, job=args.job, worker=args.worker,
                              round_=args.round, tx=args.tx)
    out.snaplen, off, done = cap.snaplen, cap.epoch_offset_ns, False

    def take(batch) -> bool:
        done = out.take_ring(batch, off)
        out.flush()
        return done

    with cap:
        _say(args, f"capturing at ltp_xdp on {args.dev} in {ns or 'the host namespace'} "
                   f"(ring of {maps.ring_bytes >> 20} MiB, snaplen {cap.snaplen}); Ctrl-C stops")
        for batch in cap.batches(args.duration, stop.requested):
            if take(batch):
                done = True
                break
        rest = cap.stop()
        if not done:
            take(rest)
        st = cap.stats()
    return {"via": "xdp", "dropped": st["lost"], "dropped_capture": st["lost"],
            "dropped_kernel": 0, "program_frames": st["program_frames"],
            "out_of_order": st["reordered"], "lease_lapsed": st["lapsed"],
            "filtered_in_kernel": cap.filtered}


def _from_socket(args, ns: str | None, out: _Out, stop: _Stopper) -> dict:
    from ..dataplane.xdp import capture as C
    with C.LiveCapture(args.dev, ns, args.port) as sock:
        _say(args, f"listening on {args.dev} in {ns or 'the host namespace'} with an "
                   f"AF_PACKET socket (LTP on UDP port {args.port}); Ctrl-C stops")
        for ts, frame, wire, direction in sock.frames(args.duration):
            done = out.take(ts, frame, wire, direction)
            out.flush()
            if done or stop.requested():
                break
        dropped = sock.drops()
    return {"via": "socket", "dropped": dropped, "dropped_capture": 0,
            "dropped_kernel": dropped}


def _summarise(args, out: _Out, live: dict) -> None:
    """The summary on stderr, always (also under -q): one JSON object under -j."""
    s = {"packets": out.seen, "packets_in": out.inbound, "other": out.other,
         "filtered_out": out.filtered, "dropped": 0, **live, "written": args.write}
    if wants_json(args):
        print(json.dumps(s), file=sys.stderr, flush=True)
        return
    text = f"{out.seen} LTP packet{'s' if out.seen != 1 else ''}"
    if out.other:
        text += f", {out.other} other skipped"
    if out.filtered:
        text += f", {out.filtered} filtered out"
    if s["via"] == "xdp":
        text += f", {s['dropped']} dropped by the capture path (ring full)"
        if not s["filtered_in_kernel"]:
            text += f"; ltp_xdp counted {s['program_frames']} LTP frames coming in meanwhile"
        if s["lease_lapsed"]:
            text += f"; capture paused {s['lease_lapsed']}x (this process fell behind)"
    elif s["via"] == "socket":
        text += f", {s['dropped']} dropped by the kernel (socket buffer full)"
    if args.write:
        text += f"; written to {args.write}"
    if s.get("cut_short"):
        text += f"\nnote: {s['cut_short']}"
    print(text, file=sys.stderr, flush=True)


def _say(args, msg: str) -> None:
    if not args.quiet:
        print(msg, file=sys.stderr, flush=True)


class _Stopper:
    """Ctrl-C and SIGTERM end a live capture between batches (never inside
    one: every frame read is shown and written), switched off, with its
    summary."""

    def __init__(self):
        self.signalled = False

    def requested(self) -> bool:
        return self.signalled

    def __enter__(self) -> _Stopper:
        def note(signum, frame):
            self.signalled = True
        self.old = {s: signal.signal(s, note) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self.old.items():
            signal.signal(s, h)
