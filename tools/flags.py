# SPDX-License-Identifier: Apache-2.0
"""The flags more than one `ltp` command takes, each defined once: its
default, its help text and the check of its value.

A command that needs another default for a reason passes it (and says why
where it calls); the help text is built here, so the wording is the same
everywhere. `unset=True` leaves the parsed value None when the flag is not
given (the command must tell "not given" from the default; e.g. `rig
incast-tcp` on an existing rig), while the help still names the default.
Nothing here imports the dataplane at parser build, so `ltp -h` stays fast.
"""
from __future__ import annotations

import argparse
import re

from ..dataplane.xdp.headers import defines
from ..control.settings_table import MAX_SERVERS
from .common import UsageError, parse_rate, parse_size
from ..dataplane.rig.base import MAX_RATE_BPS, MIN_RATE_BPS

# The LTP port, read from bpf/ltp_wire.h: dataplane.xdp.wire would import scapy.
PORT = defines("ltp_wire.h")["LTP_PORT"]
MAX_WORKERS = 64          # mirrors dataplane.rig.star.MAX_WORKERS (kept import-free for --help)
DEFAULT_RIG = "default"


def _help(text: str, default: str, note: str = "") -> str:
    return f"{text} (default {default}{'; ' + note if note else ''})"


# --------------------------------------------------------------------------- XDP programs

def add_port(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=PORT, help=f"LTP UDP port (default {PORT})")


def check_port(port: int) -> int:
    if not 1 <= port <= 65535:
        raise UsageError(f"--port: must be in 1..65535, got {port}")
    return port


NETNS_HELP = {
    "target": "network namespace of DEV (default: this one)",
    "filter": "only this namespace ('host': the machine's own)",
    "either": "namespace of DEV, or the only namespace shown",
}


def add_netns(p: argparse.ArgumentParser, use: str = "target") -> None:
    """--netns: the namespace of DEV ("target"), the one namespace a listing
    shows ("filter"), or DEV's when DEV is given and the filter when not
    ("either")."""
    p.add_argument("--netns", metavar="NS", help=NETNS_HELP[use])


def add_xdp_mode(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=("native", "skb"), default="native",
                   help="XDP attach mode (default native)")


# --------------------------------------------------------------------------- rigs

RIG_NAME_HELP = {
    "new": f"rig name, a-z 0-9 _ up to 12 characters (default {DEFAULT_RIG})",
    "existing": f"rig name (default: the only rig, or '{DEFAULT_RIG}')",
    "leaf-spine": "leaf-spine rig name (default: the only one)",
    "run": "run on this rig; if no rig has that name, build one called NAME for the run "
           "(default: a fresh temporary rig)",
}


def add_rig_name(p, use: str = "existing") -> None:
    """--name of a rig to build ("new"), to use ("existing", "leaf-spine"),
    or to use or build for one run ("run"). `p` may be a mutually exclusive group."""
    p.add_argument("--name", default=DEFAULT_RIG if use == "new" else None,
                   help=RIG_NAME_HELP[use])


def add_workers(p: argparse.ArgumentParser, default: int, *, most: int = MAX_WORKERS,
                note: str = "", unset: bool = False) -> None:
    p.add_argument("--workers", type=int, default=None if unset else default,
                   help=_help(f"number of workers, 1..{most}", str(default), note))


def add_rate(p: argparse.ArgumentParser, default: str = "1gbit", *, note: str = "",
             unset: bool = False) -> None:
    p.add_argument("--rate", default=None if unset else default,
                   help=_help("bottleneck rate, e.g. 1gbit, 100mbit", default, note))


def add_buffer(p: argparse.ArgumentParser, default: str = "30kb", *, note: str = "",
               unset: bool = False) -> None:
    p.add_argument("--buffer", default=None if unset else default,
                   help=_help("bottleneck queue in bytes (TBF limit), e.g. 30kb, 64KiB",
                              default, note))


def add_shape(p: argparse.ArgumentParser, workers: int, *, unset: bool = False) -> None:
    """--workers, --rate, --buffer and --burst of a star rig."""
    add_workers(p, workers, unset=unset)
    add_rate(p, unset=unset)
    add_buffer(p, unset=unset)
    p.add_argument("--burst", default=None,
                   help="TBF bucket in bytes (default: max(2 frames, 80 us at the rate))")


def add_loss(p: argparse.ArgumentParser, default: str = "0", *, note: str = "",
             unset: bool = False) -> None:
    p.add_argument("--loss", default=None if unset else default,
                   help=_help("drop probability of the loss injector (IPv4 UDP/TCP only), "
                              "in [0, 1)", default, note))


def add_switch_mode(p: argparse.ArgumentParser, default: str = "native", *, note: str = "",
                    unset: bool = False) -> None:
    p.add_argument("--mode", choices=("native", "skb"), default=None if unset else default,
                   help=_help("native: XDP_PASS on the switch-side veths so hosts can run "
                              "native XDP with XDP_TX; skb: no XDP on the switch (generic XDP "
                              "on hosts)", default, note))


def add_size(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--size", default=default,
                   help=_help("bytes per worker per round", default))


# --------------------------------------------------------------------------- value checks

def check_name(name: str | None, flag: str = "--name") -> str | None:
    if name is not None and not re.match(r"^[a-z0-9][a-z0-9_]{0,11}$", name):
        raise UsageError(f"{flag}: {name!r} must be 1-12 characters of a-z, 0-9, _")
    return name


def check_workers(n: int | None, most: int = MAX_WORKERS) -> int | None:
    if n is not None and not 1 <= n <= most:
        raise UsageError(f"--workers: must be in 1..{most}, got {n}")
    return n


def check_loss(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        p = float(text)
    except ValueError:
        p = -1.0
    if not 0.0 <= p < 1.0:
        raise UsageError(f"--loss: must be a probability in [0, 1), got {text!r}")
    return p


def check_rate(text: str | None, flag: str = "--rate") -> int | None:
    """A rate flag's value in bit/s, within what TBF can shape."""
    if text is None:
        return None
    bps = parse_rate(text, flag)
    if not MIN_RATE_BPS <= bps <= MAX_RATE_BPS:
        raise UsageError(f"{flag}: must be in 64kbit..32gbit, got {text!r}")
    return bps


def check_bytes(text: str | None, flag: str, least: int = 1514) -> int | None:
    """A queue or bucket size in bytes: at least one frame, at most 1 GiB."""
    if text is None:
        return None
    n = parse_size(text, flag)
    if not least <= n <= 1 << 30:
        raise UsageError(f"{flag}: must be in {least} bytes (one 1500-byte-MTU frame)..1GiB, "
                         f"got {text!r}")
    return n


def check_colocate(args: argparse.Namespace) -> None:
    """--colocate (`ltp launch`, `ltp train`): a server beside every worker,
    so --servers is left out or equals --workers, and the workers fit the
    servers' cap; sets args.servers to the workers."""
    if args.servers not in (1, args.workers):
        raise UsageError(f"--colocate runs one server beside every worker ({args.workers}); "
                         f"leave out --servers {args.servers}")
    if args.workers > MAX_SERVERS:
        raise UsageError(f"--colocate: a job has at most {MAX_SERVERS} servers, one beside "
                         f"each of {args.workers} workers would be more")
    args.servers = args.workers
