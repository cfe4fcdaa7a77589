# SPDX-License-Identifier: Apache-2.0
"""The leaf-spine rig on paper: its config (`LeafSpineConfig`), its hosts
(`LsHost`) and links (`Link`) with every name and address (`plan`), the
names of its namespaces, and where its state file and pins live. Pure:
nothing here needs root or touches the machine beyond listing namespaces.

Addresses: leaf i serves 198.18.(10+i).0/24 (gateway .1, hosts from .10);
the link between leaf i and spine k is 198.19.i.(4k)/30 (leaf .1, spine .2).
MACs are 02:4c:<kind>:...; the kind byte of a leaf's uplink and a spine's
downlink is how bpf/path_pin.c tells the link a packet leaves on."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .. import netns
from .base import Host, ShapedConfig

STATE_DIR = "/run/ltp/leafspine"
PIN_ROOT = "/sys/fs/bpf/ltp-ls"
NS_PREFIX = "lls"
BRIDGE = "br0"
KIND_LEAF_UP, KIND_SPINE_DN = 0x4C, 0x53     # bpf/path_pin.c LINK_KIND_*
MAC_HOST, MAC_GATEWAY, MAC_PORT = 0x48, 0x47, 0x50
_NS_TAIL = re.compile(r"^(l\d+|s\d+|j\d+(ps|w\d+))$")


@dataclass(frozen=True)
class LeafSpineConfig(ShapedConfig):
    """name: rig name (namespaces lls-<name>-*); leaves 2..16, spines 1..16,
    jobs 1..8, workers per job 1..16; rate/buffer/burst of every leaf-spine
    link (TBF); mode: native puts XDP_PASS on the leaf ports toward hosts."""

    name: str = "ls"
    leaves: int = 2
    spines: int = 2
    jobs: int = 2
    workers: int = 2
    rate_bps: int = 200_000_000
    buffer_bytes: int = 60_000
    burst_bytes: int | None = None
    mode: str = "native"
    mtu: int = 1500

    def __post_init__(self) -> None:
        self.check_shaping()
        for key, lo, hi in (("leaves", 2, 16), ("spines", 1, 16), ("jobs", 1, 8),
                            ("workers", 1, 16)):
            v = getattr(self, key)
            if not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"{key}: must be in {lo}..{hi}, got {v!r}")


@dataclass(frozen=True)
class LsHost(Host):
    """A host of the leaf-spine rig (a base.Host plus its job, leaf and gateway)."""

    job: int = 0
    leaf: int = 0
    gateway: str = ""
    gateway_mac: str = ""


def link_label(kind: str, a: int, b: int) -> str:
    """("L", leaf, spine) -> "l<leaf>>s<spine>"; ("S", spine, leaf) -> "s<spine>>l<leaf>"."""
    return f"l{a}>s{b}" if kind == "L" else f"s{a}>l{b}"


@dataclass(frozen=True)
class Link:
    """One direction of a leaf-spine link: ("L", leaf, spine) leaves a leaf's
    uplink up<spine>; ("S", spine, leaf) leaves a spine's dn<leaf>."""

    kind: str
    a: int
    b: int
    netns: str
    ifname: str
    mac: str
    ip: str
    peer_ip: str

    @property
    def id(self) -> tuple:
        return (self.kind, self.a, self.b)

    @property
    def label(self) -> str:
        return link_label(self.kind, self.a, self.b)

    @property
    def leaf(self) -> int:
        return self.a if self.kind == "L" else self.b

    @property
    def spine(self) -> int:
        return self.b if self.kind == "L" else self.a


def leaf_ns(name: str, i: int) -> str:
    return f"{NS_PREFIX}-{name}-l{i}"


def spine_ns(name: str, k: int) -> str:
    return f"{NS_PREFIX}-{name}-s{k}"


def state_path(name: str) -> str:
    return os.path.join(STATE_DIR, f"{name}.json")


def pin_dir(name: str) -> str:
    return os.path.join(PIN_ROOT, name)


def mac(*b: int) -> str:
    """02:4c:b0:b1:b2:b3 (locally administered)."""
    return ":".join(f"{x:02x}" for x in (0x02, 0x4C, *b))


def gateway_mac(leaf: int) -> str:
    """The MAC of leaf `leaf`'s bridge, its hosts' gateway."""
    return mac(MAC_GATEWAY, leaf, 0, 1)


def port_mac(host: LsHost) -> str:
    """The MAC of the leaf's port toward `host`."""
    return mac(MAC_PORT, host.leaf, int(host.ip.split(".")[3]), 0)


def plan(cfg: LeafSpineConfig) -> tuple[list[LsHost], list[Link]]:
    """Hosts (job by job: PS, then workers) and links of the rig. Job j's PS
    is on leaf 0, its worker w on leaf 1 + w mod (leaves - 1)."""
    hosts: list[LsHost] = []
    per_leaf = [0] * cfg.leaves
    for j in range(cfg.jobs):
        members = [("ps", -1, 0)] + [(f"w{w}", w, 1 + w % (cfg.leaves - 1))
                                     for w in range(cfg.workers)]
        for short, idx, leaf in members:
            n = per_leaf[leaf]
            per_leaf[leaf] += 1
            s = f"j{j}{short}"
            hosts.append(LsHost(name=s, role="ps" if idx < 0 else "worker", index=idx,
                                netns=f"{NS_PREFIX}-{cfg.name}-{s}", ifname=f"ltp-{s}",
                                ip=f"198.18.{10 + leaf}.{10 + n}", mac=mac(MAC_HOST, leaf, n, 0),
                                port=f"p-{s}", job=j, leaf=leaf,
                                gateway=f"198.18.{10 + leaf}.1", gateway_mac=gateway_mac(leaf)))
    links: list[Link] = []
    for i in range(cfg.leaves):
        for k in range(cfg.spines):
            links.append(Link("L", i, k, leaf_ns(cfg.name, i), f"up{k}",
                              mac(KIND_LEAF_UP, i, k, 1), f"198.19.{i}.{4 * k + 1}",
                              f"198.19.{i}.{4 * k + 2}"))
            links.append(Link("S", k, i, spine_ns(cfg.name, k), f"dn{i}",
                              mac(KIND_SPINE_DN, k, i, 2), f"198.19.{i}.{4 * k + 2}",
                              f"198.19.{i}.{4 * k + 1}"))
    return hosts, links


def find_namespaces(name: str) -> list[str]:
    """The namespaces of leaf-spine rig `name` on this machine now."""
    pre = f"{NS_PREFIX}-{name}-"
    return [ns for ns in netns.listnetns()
            if ns.startswith(pre) and _NS_TAIL.match(ns[len(pre):])]
