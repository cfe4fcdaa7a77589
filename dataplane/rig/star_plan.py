# SPDX-License-Identifier: Apache-2.0
"""The star rig on paper: its config (`RigConfig`), its hosts and their
addresses (`plan_hosts`), the names of its namespaces, and where its state
file and pins live. Pure: nothing here needs root or touches the machine
beyond listing namespaces.

Every rig is one L2 segment (bridge br0) on 198.18.0.0/24: server i is host
"ps<i>" (server 0 is "ps") at .(1 + i), worker j is .(10 + j), and .255 is
the broadcast address the bridge floods (the servers' group sends). Every
host has one device: a sharded worker reaches its S servers through it, its
flows to each in rounds of their own (control/transport/roundspace.py), as
a host with one NIC does.

A rig with `nodes` K > 0 groups its workers into K nodes, as a cluster's
machines hold several GPUs behind one NIC: worker j is on node
j // (workers / K), and with `colocate` server s is on worker s's node (a
server beside every worker, servers = workers). Every host keeps a device
of its own (a rank's XDP program owns its device; on real hosts a VF or a
macvlan of the node's NIC), but a node's devices share one link: the
switch redirects what goes to them and what comes from them through the
node's two IFB devices, each shaped to the rate (`node_links`), so the
node's traffic together meets one TBF each way. Frames between two devices
of one node skip the link (a NIC's embedded switch turns them round: no
wire, no loss)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .. import netns
from . import lossinject
from .base import MAX_RATE_BPS, MIN_RATE_BPS, NAME_RE, Host, ShapedConfig

STATE_DIR = "/run/ltp/rigs"
PIN_ROOT = "/sys/fs/bpf/ltp-rig"
SUBNET = "198.18.0.0"
PREFIXLEN = 24
PS_IP = "198.18.0.1"
BROADCAST = "198.18.0.255"  # every host of the rig's /24 (the bridge floods it)
WORKER_BASE = 10          # worker i has 198.18.0.(10 + i)
MAX_WORKERS = 64
MAX_SERVERS = 8           # 198.18.0.1 .. 198.18.0.8
DEFAULT_NAME = "default"
BRIDGE = "br0"
NS_RE = re.compile(r"^ltp-([a-z0-9][a-z0-9_]{0,11})-(sw|ps\d*|w\d+)$")

__all__ = ["BRIDGE", "BROADCAST", "DEFAULT_NAME", "MAX_RATE_BPS", "MAX_SERVERS", "MAX_WORKERS",
           "MIN_RATE_BPS", "NAME_RE", "NS_RE", "PIN_ROOT", "PREFIXLEN", "PS_IP",
           "STATE_DIR", "SUBNET", "WORKER_BASE", "Host", "RigConfig", "namespaces_by_rig",
           "pin_dir", "plan_hosts", "node_links", "server_of", "state_path",
           "switch_ns"]


@dataclass(frozen=True)
class RigConfig(ShapedConfig):
    """What to build. Sizes in bytes, rates in bits per second.

    name: rig name, [a-z0-9_], at most 12 characters (namespaces ltp-<name>-*).
    workers: 1..64 worker hosts.
    servers: 1..8 server hosts (ps, ps1, ...) on the rig's one segment (module
      docstring).
    rate_bps, buffer_bytes: TBF rate and queue (TBF `limit`) of each shaped port.
    burst_bytes: TBF bucket; None picks max(2 frames, 80 us at the rate).
    loss: drop probability of IPv4 UDP/TCP packets, in [0, 1).
    shape: "ps" shapes only the switch port toward the PS, "all" every port.
    loss_on: "ps" or "all": ports that carry the loss injector.
    mode: "native" puts an XDP_PASS program on the switch-side veths so a host's
      native-mode XDP_TX is delivered; "skb" leaves them bare (generic XDP).
    nodes: 0, every host on a link of its own; K, the workers in K nodes of
      workers / K, each node's devices sharing one link shaped each way (the
      module docstring); needs shape "all".
    colocate: server s on worker s's node (servers = workers; needs nodes).
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
    servers: int = 1
    nodes: int = 0
    colocate: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the field when a value is out of range."""
        self.check_shaping()
        if not isinstance(self.workers, int) or not 1 <= self.workers <= MAX_WORKERS:
            raise ValueError(f"workers: must be in 1..{MAX_WORKERS}, got {self.workers!r}")
        if not isinstance(self.servers, int) or not 1 <= self.servers <= MAX_SERVERS:
            raise ValueError(f"servers: must be in 1..{MAX_SERVERS}, got {self.servers!r}")
        lossinject.check(self.loss)
        for key in ("shape", "loss_on"):
            if getattr(self, key) not in ("ps", "all"):
                raise ValueError(f"{key}: must be ps or all, got {getattr(self, key)!r}")
        self.check_nodes()

    def check_nodes(self) -> None:
        """nodes divides workers, and shapes every link; colocate pairs every worker with a server."""
        if not isinstance(self.nodes, int) or not 0 <= self.nodes <= self.workers \
                or self.nodes and self.workers % self.nodes:
            raise ValueError(f"nodes: must divide workers ({self.workers}) into nodes of equal "
                             f"size, got {self.nodes!r}")
        if self.nodes and self.shape != "all":
            raise ValueError("nodes: a node's link is shaped, so every link is: shape must be all")
        if self.colocate and (not self.nodes or self.servers != self.workers):
            raise ValueError(f"colocate: a server beside every worker needs nodes and servers = "
                             f"workers ({self.workers}), got nodes {self.nodes}, servers "
                             f"{self.servers}")

    def node_of(self, h: Host) -> int | None:
        """The node host or device `h` is on, or None (a link of its own)."""
        if not self.nodes or h.role == "ps" and not self.colocate:
            return None
        index = server_of(h) if h.role == "ps" else h.index   # server s beside worker s
        return index // (self.workers // self.nodes)


def _host(rig: str, short: str, role: str, index: int, last: int) -> Host:
    return Host(name=short, role=role, index=index, netns=f"ltp-{rig}-{short}",
                ifname=f"ltp-{short}", ip=f"198.18.0.{last}",
                mac=f"02:4c:54:00:00:{last:02x}", port=f"sw-{short}",
                prefixlen=PREFIXLEN)


def plan_hosts(name: str, workers: int, servers: int = 1) -> list[Host]:
    """The hosts of rig `name`: the servers first (ps, ps1, ...), then
    workers w0..w(N-1)."""
    hosts = [_host(name, "ps" if i == 0 else f"ps{i}", "ps", -1, 1 + i) for i in range(servers)]
    hosts += [_host(name, f"w{i}", "worker", i, WORKER_BASE + i) for i in range(workers)]
    return hosts


def node_links(k: int) -> tuple[str, str]:
    """The IFB devices (in the switch namespace) of node k's link: what goes
    to the node, what comes from it."""
    return f"n{k}-down", f"n{k}-up"


def server_of(h: Host) -> int:
    """Which server a server host is (server i is 198.18.0.(1 + i))."""
    return int(h.ip.rsplit(".", 1)[1]) - 1


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
