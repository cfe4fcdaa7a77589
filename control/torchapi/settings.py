"""`lt.init()`'s settings: each from its keyword, else its environment variable
(what `ltp launch` sets, and what a torchrun user may export), else a default.

Importing this module needs neither torch nor numpy.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields

from ...errors import UsageError

TRANSPORTS = ("ltp", "tcp")
XDP_MODES = ("native", "skb")
DOWNLINKS = ("group", "unicast")
MAX_SERVERS = 8
COMPRESS = ("none", "uint8")      # codec.KINDS (that module needs numpy)
SENDERS = ("socket", "xdp")       # transport.endpoint.SENDERS

# keyword -> environment variable
ENV = {"transport": "LTP_TRANSPORT", "dev": "LTP_DEV", "ip": "LTP_IP",
       "xdp_mode": "LTP_XDP_MODE", "capacity": "LTP_CAPACITY", "mtu": "LTP_MTU",
       "group": "LTP_GROUP", "downlink": "LTP_DOWNLINK", "servers": "LTP_SERVERS",
       "netns": "LTP_NETNS", "store_netns": "LTP_STORE_NETNS", "timeout": "LTP_TIMEOUT",
       "cc": "LTP_CC", "job": "LTP_JOB", "tcp_port": "LTP_TCP_PORT",
       "bucket_mb": "LTP_BUCKET_MB", "compress": "LTP_COMPRESS",
       "error_feedback": "LTP_ERROR_FEEDBACK", "max_missed": "LTP_MAX_MISSED",
       "sender": "LTP_SENDER", "buffer": "LTP_BUFFER"}


@dataclass(frozen=True)
class Settings:
    """Where and how this rank talks (docs/training.md, "ltpx.torch")."""

    transport: str = "ltp"          # ltp | tcp (the same server over TCP, a baseline)
    dev: str | None = None          # the NIC that carries training traffic (XDP attaches here)
    ip: str | None = None           # this rank's IPv4 address on it (default: dev's)
    xdp_mode: str = "native"        # native | skb (drivers without native XDP)
    capacity: float = 1e9           # bit/s into the server: rate shares, Early Close deadlines
    mtu: int = 1500                 # path MTU: chunk size = MTU - 68, in float64 pairs
    group: str | None = None        # downlink group address (default: dev's broadcast address)
    downlink: str = "group"         # group | unicast: how answers reach the workers
    servers: int = 1                # ranks 0..servers-1 serve, each a slice (shards.py)
    netns: str | None = None        # this rank's network namespace (names its pins)
    store_netns: str | None = None  # open the store connection inside this namespace
    timeout: float = 300.0          # seconds any one wait may take
    cc: str = "cubic"               # TCP congestion control (transport tcp)
    job: int = 0x7472               # the LTP job cookie (every rank alike)
    tcp_port: int = 0               # the TCP server's port (0: any)
    bucket_mb: float = 4.0          # default gradient bucket size of DistributedOptimizer
    compress: str = "none"          # none | uint8: a step's gradients as 8-bit codes (codec.py)
    error_feedback: bool = True     # uint8: carry each rounding error into the next step
    max_missed: int = 3             # steps in a row a worker may deliver nothing before it is dropped
    sender: str = "socket"          # socket | xdp: how LTP DATA leaves (xdp: the ACK clock)
    # bytes the bottleneck toward a receiver queues: a receiver's credit for clocked
    # flows is this plus one BDP (0: transport.rate.CREDIT_BUFFER, 32 KiB)
    buffer: int = 0

    @classmethod
    def resolve(cls, options: dict) -> "Settings":
        """Keywords over environment over defaults; UsageError for an unknown or
        bad one, naming it and where it came from."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise UsageError(f"init(): unknown option {unknown[0]!r} (options: "
                             f"{', '.join(known)})")
        values = {}
        for name, f in known.items():
            if options.get(name) is not None:
                raw, where = options[name], f"init({name}=...)"
            elif os.environ.get(ENV[name]):
                raw, where = os.environ[ENV[name]], ENV[name]
            else:
                continue
            values[name] = _convert(name, f.type, raw, where)
        s = cls(**values)
        s.check()
        return s

    def check(self) -> None:
        def bad(name: str, why: str):
            raise UsageError(f"init(): {name} {why} (keyword {name}=, or {ENV[name]})")
        if self.transport not in TRANSPORTS:
            bad("transport", f"must be one of {', '.join(TRANSPORTS)}, got {self.transport!r}")
        if self.xdp_mode not in XDP_MODES:
            bad("xdp_mode", f"must be native or skb, got {self.xdp_mode!r}")
        if self.downlink not in DOWNLINKS:
            bad("downlink", f"must be group or unicast, got {self.downlink!r}")
        if not self.capacity > 0:
            bad("capacity", f"must be positive bit/s, got {self.capacity}")
        if not 576 <= self.mtu <= 9000:
            bad("mtu", f"must be in 576..9000, got {self.mtu}")
        if not 1 <= self.servers <= MAX_SERVERS:
            bad("servers", f"must be in 1..{MAX_SERVERS} (ranks 0..servers-1 serve, each a "
                f"slice of every bucket: shards.py), got {self.servers}")
        if not self.timeout > 0:
            bad("timeout", f"must be positive seconds, got {self.timeout}")
        if not self.bucket_mb > 0:
            bad("bucket_mb", f"must be positive, got {self.bucket_mb}")
        if self.max_missed < 1:
            bad("max_missed", f"must be at least 1, got {self.max_missed}")
        if self.compress not in COMPRESS:
            bad("compress", f"must be one of {', '.join(COMPRESS)}, got {self.compress!r}")
        if self.buffer < 0:
            bad("buffer", f"must be >= 0 bytes (0: the default), got {self.buffer}")
        if self.sender not in SENDERS:
            bad("sender", f"must be one of {', '.join(SENDERS)}, got {self.sender!r}")


def _convert(name: str, typ, raw, where: str):
    kind = str(typ)
    try:
        if kind == "bool":
            if str(raw).lower() in ("1", "true", "yes", "on"):
                return True
            if str(raw).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if "float" in kind:
            return float(raw)
        if "int" in kind:
            return int(raw, 0) if isinstance(raw, str) else int(raw)
        return str(raw)
    except (TypeError, ValueError):
        raise UsageError(f"{where}: cannot read {raw!r} as {kind.split()[0]} for {name}") from None
