"""`ltp capture`: decode LTP packets live on a device (in a namespace) or
from a pcap; the decoding is dataplane/xdp/capture.py's.

  ltp capture DEV [--netns NS] [-c N] [--timeout S] [-w FILE.pcap] [-j]
  ltp capture -r FILE.pcap [-c N] [-w FILE.pcap] [-j]
"""
from __future__ import annotations

import json
import sys

from .common import UsageError, add_json, need_root, wants_json
from .flags import add_netns, add_port, check_port
from .ops import add_parser, check_dev, guard, netns_arg

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


def register(sub) -> None:
    p = add_parser(sub, "capture", "decode LTP packets live in a namespace or from a pcap",
                   CAPTURE_EPILOG)
    p.add_argument("dev", metavar="DEV", nargs="?", help="device to capture on (not with -r)")
    add_netns(p)
    p.add_argument("-c", "--count", type=int, metavar="N", help="stop after N LTP packets")
    p.add_argument("-r", "--read", metavar="FILE", help="read packets from a pcap file")
    p.add_argument("-w", "--write", metavar="FILE", help="also write the LTP packets to a pcap")
    p.add_argument("--timeout", type=float, metavar="S", help="live: stop after S seconds")
    add_port(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")
    add_json(p)
    p.set_defaults(func=guard(cmd_capture))


def _check(args) -> str | None:
    """Check the flags; the namespace of a live capture."""
    if args.read and args.dev:
        raise UsageError("DEV: give a device to capture on, or -r FILE, not both")
    if not args.read and not args.dev:
        raise UsageError("DEV: give a device to capture on (or -r FILE.pcap)")
    check_dev(args.dev)
    ns = netns_arg(args.netns)
    if args.read and args.netns:
        raise UsageError("--netns: only for live capture, not with -r")
    if args.count is not None and args.count < 1:
        raise UsageError(f"-c: must be at least 1, got {args.count}")
    if args.timeout is not None and (args.read or args.timeout <= 0):
        raise UsageError("--timeout: a positive number of seconds, for live capture only")
    check_port(args.port)
    return ns


class _Packets:
    """Decodes, shows (text, JSON lines, or one JSON list under -p) and keeps
    (-w) the LTP packets; counts them and the others."""

    def __init__(self, args, writer):
        from ..dataplane.xdp import capture as C
        self.C, self.args, self.writer = C, args, writer
        self.as_json, self.pretty = wants_json(args), bool(getattr(args, "pretty", False))
        self.collected: list[dict] = []
        self.seen = self.other = 0

    def take(self, pkt, direction=None) -> bool:
        """Decode, show and keep one packet; True once -c packets were seen."""
        C = self.C
        d = C.decode(pkt, self.args.port, direction)
        if d is None:
            self.other += 1
            return False
        self.seen += 1
        if self.pretty:
            self.collected.append(d)
        elif self.as_json:
            print(json.dumps(d), flush=True)
        else:
            print(C.line(d), flush=True)
        if self.writer:
            self.writer.write(pkt)
        return bool(self.args.count and self.seen >= self.args.count)


def cmd_capture(args) -> int | None:
    ns = _check(args)
    from ..dataplane.xdp import capture as C

    def say(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    writer = C.pcap_writer(args.write) if args.write else None
    out = _Packets(args, writer)
    try:
        if args.read:
            for pkt in C.read_pcap(args.read):
                if out.take(pkt):
                    break
            dropped = 0
        else:
            dropped = _live(args, ns, out, say)
    finally:
        if writer:
            writer.close()
    if out.pretty:
        print(json.dumps(out.collected, indent=2))
    say(f"{out.seen} LTP packet{'s' if out.seen != 1 else ''}"
        + (f", {out.other} other skipped" if out.other else "")
        + (f", {dropped} dropped by the kernel" if dropped else "")
        + (f"; written to {args.write}" if args.write else ""))
    return None


def _live(args, ns: str | None, out: _Packets, say) -> int:
    """Capture on DEV until -c packets, --timeout or Ctrl-C; the kernel's drops."""
    need_root("ltp capture (live)")
    from ..dataplane.xdp import capture as C
    with C.LiveCapture(args.dev, ns, args.port) as cap:
        say(f"listening on {args.dev} in {ns or 'the host namespace'} (LTP on UDP port "
            f"{args.port}); Ctrl-C stops")
        try:
            for ts, frame, direction in cap.frames(args.timeout):
                if out.take(C.frame_packet(frame, ts), direction):
                    break
        except KeyboardInterrupt:
            pass
        return cap.drops()
