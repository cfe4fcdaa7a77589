"""`ltp bench`: benchmarks that print numbers (and JSON with -j).

  ltp bench xdp [-j] [--packets N]   ns per packet: XDP DATA path vs a socket loop
"""
from __future__ import annotations

import argparse
import sys

from .common import UsageError, add_json, emit, need_bcc, need_root, wants_json


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks (print numbers; -j for JSON)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  ltp bench xdp\n  ltp bench xdp -j --packets 50000\n")
    bsub = p.add_subparsers(dest="bench", metavar="BENCH")
    x = bsub.add_parser("xdp", help="ns per packet of the XDP DATA path vs a Python socket loop",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="examples:\n  ltp bench xdp -j\n\nJSON keys: xdp_ns_per_packet, "
                               "socket_ns_per_packet, speedup (and the raw figures)\n")
    x.add_argument("--packets", type=int, default=20000, help="DATA packets to time (default 20000)")
    add_json(x)
    x.set_defaults(func=cmd_xdp)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])


def cmd_xdp(args) -> None:
    if args.packets < 100:
        raise UsageError("--packets must be at least 100")
    need_root("ltp bench xdp")
    need_bcc()
    from ..dataplane import xdpbench
    quiet = wants_json(args)
    res = xdpbench.run(args.packets, progress=None if quiet else
                       (lambda m: print(f"... {m}", file=sys.stderr)))
    emit(args, res, lambda r: (
        f"XDP DATA path   {r['xdp_ns_per_packet']:10.1f} ns/packet  "
        f"(raw {r['xdp_raw_ns_per_packet']:.0f} - harness {r['harness_ns']:.0f})\n"
        f"socket loop     {r['socket_ns_per_packet']:10.1f} ns/packet  "
        f"({r['socket_packets']} packets)\n"
        f"speed-up        {r['speedup']:10.1f} x"))
