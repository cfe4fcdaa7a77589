"""The star rig on paper: its config (`RigConfig`), its hosts and their
addresses (`plan_hosts`), the names of its namespaces, and where its state
file and pins live. Pure: nothing here needs root or touches the machine
beyond listing namespaces.

Every rig uses 198.18.0.0/24: the PS is .1, worker i is .(10 + i), .255 is
the broadcast address the bridge floods (the PS's group sends)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .. import netns
from . import loss
from .base import MAX_RATE_BPS, MIN_RATE_BPS, NAME_RE, Host, ShapedConfig

STATE_DIR = "/run/ltp/rigs"
PIN_ROOT = "/sys/fs/bpf/ltp-rig"
SUBNET = "198.18.0.0"
PREFIXLEN = 24
PS_IP = "198.18.0.1"
BROADCAST = "198.18.0.255"  # every host of the rig's /24 (the bridge floods it)
WORKER_BASE = 10          # worker i has 198.18.0.(10 + i)
MAX_WORKERS = 64
DEFAULT_NAME = "default"
BRIDGE = "br0"
NS_RE = re.compile(r"^ltp-([a-z0-9][a-z0-9_]{0,11})-(sw|ps|w\d+)$")

__all__ = ["BRIDGE", "BROADCAST", "DEFAULT_NAME", "MAX_RATE_BPS", "MAX_WORKERS",
           "MIN_RATE_BPS", "NAME_RE", "NS_RE", "PIN_ROOT", "PREFIXLEN", "PS_IP",
           "STATE_DIR", "SUBNET", "WORKER_BASE", "Host", "RigConfig", "namespaces_by_rig",
           "pin_dir", "plan_hosts", "state_path", "switch_ns"]


@dataclass(frozen=True)
class RigConfig(ShapedConfig):
    """What to build. Sizes in bytes, rates in bits per second.

    name: rig name, [a-z0-9_], at most 12 characters (namespaces ltp-<name>-*).
    workers: 1..64 worker hosts.
    rate_bps, buffer_bytes: TBF rate and queue (TBF `limit`) of each shaped port.
    burst_bytes: TBF bucket; None picks max(2 frames, 80 us at the rate).
    loss: drop probability of IPv4 UDP/TCP packets, in [0, 1).
    shape: "ps" shapes only the switch port toward the PS, "all" every port.
    loss_on: "ps" or "all": ports that carry the loss injector.
    mode: "native" puts an XDP_PASS program on the switch-side veths so a host's
      native-mode XDP_TX is delivered; "skb" leaves them bare (generic XDP).
    """

    name: str = DEFAULT_NAME
    workers: int = 4
    rate_bps: int = 10**9
    buffer_bytes: int = 30_000
    burst_bytes: int | None = None
    loss: float = 0.0
    shape: str = "ps"
    loss_on: str = "ps"
    mode: str = "native"
    mtu: int = 1500

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the field when a value is out of range."""
        self.check_shaping()
        if not isinstance(self.workers, int) or not 1 <= self.workers <= MAX_WORKERS:
            raise ValueError(f"workers: must be in 1..{MAX_WORKERS}, got {self.workers!r}")
        loss.check(self.loss)
        for key in ("shape", "loss_on"):
            if getattr(self, key) not in ("ps", "all"):
                raise ValueError(f"{key}: must be ps or all, got {getattr(self, key)!r}")


def plan_hosts(name: str, workers: int) -> list[Host]:
    """The hosts of rig `name`: the PS first, then workers w0..w(N-1)."""
    def mk(short: str, role: str, index: int, last: int) -> Host:
        return Host(name=short, role=role, index=index, netns=f"ltp-{name}-{short}",
                    ifname=f"ltp-{short}", ip=f"198.18.0.{last}",
                    mac=f"02:4c:54:00:00:{last:02x}", port=f"sw-{short}", prefixlen=PREFIXLEN)
    hosts = [mk("ps", "ps", -1, 1)]
    hosts += [mk(f"w{i}", "worker", i, WORKER_BASE + i) for i in range(workers)]
    return hosts


def switch_ns(name: str) -> str:
    return f"ltp-{name}-sw"


def state_path(name: str) -> str:
    return os.path.join(STATE_DIR, f"{name}.json")


def pin_dir(name: str) -> str:
    return os.path.join(PIN_ROOT, name)


def namespaces_by_rig() -> dict[str, list[str]]:
    """Namespaces that look like a star rig's, grouped by rig name; a group
    counts only if it has the switch namespace or a state file (other tools
    may use names like ltp-x-ps too)."""
    groups: dict[str, list[str]] = {}
    for ns in netns.listnetns():
        m = NS_RE.match(ns)
        if m:
            groups.setdefault(m.group(1), []).append(ns)
    return {n: v for n, v in groups.items()
            if switch_ns(n) in v or os.path.exists(state_path(n))}
