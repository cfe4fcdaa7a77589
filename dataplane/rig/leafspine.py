# SPDX-License-Identifier: Apache-2.0
"""The leaf-spine rig: leaf and spine routers in namespaces, jobs' hosts on the
leaves, every leaf-spine link shaped alike, per-link BPF counters and per-host
path pinning (pathpin.py, bpf/path_pin.c). This module builds, uses and
observes one (`LeafSpine`); its plan (names, addresses) is leafspine_plan.py,
its removal teardown.py. See docs/paths.md.

Topology (pyroute2 only)::

    lls-<rig>-j0ps  [ltp-j0ps 198.18.10.10] --veth-- [p-j0ps] br0 198.18.10.1  (lls-<rig>-l0)
    ...                                                     up0 198.19.0.1/30 == dn0 198.19.0.2 (lls-<rig>-s0)
                                                            up1 198.19.0.5/30 == dn0 198.19.0.6 (lls-<rig>-s1)
    lls-<rig>-j0w0  [ltp-j0w0 198.18.11.10] --veth-- [p-j0w0] br0 198.18.11.1  (lls-<rig>-l1)
                                                            up0 198.19.1.1/30 == dn1 198.19.1.2 (s0) ...

- Leaf i: bridge br0 with 198.18.(10+i).1/24 (the hosts' gateway), uplink
  up<k> to spine k with 198.19.i.(4k+1)/30; a multipath route per other
  leaf's /24 over every spine; forwarding on, net.ipv4.fib_multipath_hash_policy=1
  (L4 hash: the UDP source port picks the spine).
- Spine k: dn<i> toward leaf i with 198.19.i.(4k+2)/30, one route per leaf /24.
- Job j: PS on leaf 0, worker w on leaf 1 + w mod (leaves-1), so every job's
  push traffic crosses the spine layer in the same direction (contention).
- TBF (same rate, burst, limit) on egress of every up<k> and dn<i>: each
  direction of each leaf-spine link is one shaped link.
- link_count (tc) on egress of every up<k>/dn<i>; path_pin (tc) on egress of
  every host veth. Maps and programs pinned under /sys/fs/bpf/ltp-ls/<rig>/;
  the description in /run/ltp/leafspine/<rig>.json.
- Static neighbours everywhere (no ARP); IPv6 off.
"""
from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Sequence
from typing import Any

from .. import netns
from ..xdp import wire as W
from . import netlink, pathpin, tcprogs, teardown
from .base import Host, RigBase, RigError, saved_names
from .leafspine_plan import (BRIDGE, KIND_LEAF_UP, KIND_SPINE_DN, NS_PREFIX, PIN_ROOT,
                             STATE_DIR, LeafSpineConfig, Link, LsHost, find_namespaces,
                             gateway_mac, leaf_ns, pin_dir, plan, port_mac, spine_ns,
                             state_path)
from .traffic import reachable

__all__ = ["BRIDGE", "KIND_LEAF_UP", "KIND_SPINE_DN", "NS_PREFIX", "PIN_ROOT", "STATE_DIR",
           "Host", "JobView", "LeafSpine", "LeafSpineConfig", "Link", "LsHost", "RigError",
           "leaf_ns", "pin_dir", "plan", "reachable", "spine_ns", "state_path"]

_ROUTER_SYSCTLS = {"net.ipv4.ip_forward": "1",
                   "net.ipv4.fib_multipath_hash_policy": "1",   # L4 hash: sport picks the spine
                   "net.ipv4.conf.all.rp_filter": "0", "net.ipv4.conf.default.rp_filter": "0"}


class JobView:
    """The part of the rig one job sees, shaped like a star `Rig` for
    control.cluster.LtpCluster (config.mode/rate_bps/mtu, ps, workers)."""

    def __init__(self, ls: LeafSpine, job: int):
        self.job = job
        self.config = ls.config
        self.ps = next(h for h in ls.hosts if h.job == job and h.role == "ps")
        self.workers = [h for h in ls.hosts if h.job == job and h.role == "worker"]


class LeafSpine(RigBase):
    """A leaf-spine rig. `with LeafSpine(cfg) as ls:` builds and always removes
    it (exceptions, Ctrl-C, SIGTERM); `LeafSpine(cfg).up()` builds one that
    stays; `LeafSpine.attach(name)` reconnects; `down()` removes."""

    KIND = "leaf-spine rig"
    DOWN = "ltp paths down"

    def __init__(self, config: LeafSpineConfig | None = None, **kw: Any):
        super().__init__()
        self.config = config or LeafSpineConfig(**kw)
        self.hosts, self.links = plan(self.config)

    # ---- description
    @property
    def routers(self) -> list[str]:
        c = self.config
        return [leaf_ns(c.name, i) for i in range(c.leaves)] + \
               [spine_ns(c.name, k) for k in range(c.spines)]

    @property
    def namespaces(self) -> list[str]:
        return self.routers + [h.netns for h in self.hosts]

    @property
    def pins(self) -> dict[str, str]:
        d = pin_dir(self.name)
        return {"dir": d, **{k: f"{d}/{k}" for k in pathpin.PINS}}

    def job(self, j: int) -> JobView:
        if not 0 <= j < self.config.jobs:
            raise KeyError(f"no job {j} (rig {self.name} has {self.config.jobs} jobs)")
        return JobView(self, j)

    def host(self, key: str) -> LsHost:
        for h in self.hosts:
            if key in (h.name, h.netns, h.ip):
                return h
        raise KeyError(f"no host {key!r} in leaf-spine rig {self.name}")

    def link(self, label: str) -> Link:
        return next(lk for lk in self.links if lk.label == label)

    def _peer(self, lk: Link) -> Link:
        """The other end's direction of `lk` (the link out of its peer)."""
        return next(p for p in self.links if p.ip == lk.peer_ip)

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {"name": self.name, "topology": "leaf-spine", "config": c.to_dict(),
                "state": "up" if self._is_up else "building", "owner_pid": self.owner_pid,
                "routers": [{"netns": leaf_ns(c.name, i), "role": "leaf", "index": i,
                             "subnet": f"198.18.{10 + i}.0/24"} for i in range(c.leaves)]
                + [{"netns": spine_ns(c.name, k), "role": "spine", "index": k}
                   for k in range(c.spines)],
                "links": [{"link": lk.label, "netns": lk.netns, "ifname": lk.ifname,
                           "ip": lk.ip, "mac": lk.mac} for lk in self.links],
                "jobs": [{"job": j, "ps": self.job(j).ps.name,
                          "workers": [h.name for h in self.job(j).workers]}
                         for j in range(c.jobs)],
                "hosts": [h.to_dict() for h in self.hosts], "pins": self.pins}

    # ---- lifecycle (the rest is RigBase's)
    _KIND = "leaf-spine rig"
    _UP_HINT = "ltp rig up --topology leaf-spine"
    _CONFIG = LeafSpineConfig
    _state_path = staticmethod(state_path)
    _pin_dir = staticmethod(pin_dir)
    _found_namespaces = staticmethod(find_namespaces)

    @staticmethod
    def _remove(name: str, namespaces: Sequence[str] = ()) -> None:
        teardown.remove_leafspine(name)       # finds the namespaces by their names


    @staticmethod
    def names() -> list[str]:
        return sorted(saved_names(STATE_DIR))

    def _build(self) -> None:
        c = self.config
        self._save()                 # first: `down` finds a half-built rig
        for ns in self.namespaces:
            netns.create(ns)
            netlink.disable_ipv6(ns)
        for ns in self.routers:
            netlink.sysctl(ns, _ROUTER_SYSCTLS)
        for i in range(c.leaves):
            self._build_leaf(i)
        for lk in self.links:
            self._link_up(lk)
        for h in self.hosts:
            self._host_up(h)
        self._routes()
        pathpin.load(self.pins["dir"], [(lk.netns, lk.ifname) for lk in self.links],
                     [(h.netns, h.ifname) for h in self.hosts])
        if c.mode == "native":
            tcprogs.xdp_pass((h.port, leaf_ns(c.name, h.leaf)) for h in self.hosts)
        self._built()

    def _build_leaf(self, i: int) -> None:
        """Leaf i: bridge br0 (its hosts' gateway), a port per host, an uplink
        per spine (whose spine ends go straight into the spines' namespaces)."""
        c = self.config
        with netlink.iproute(leaf_ns(c.name, i)) as ipr:
            br = netlink.add_bridge(ipr, BRIDGE, address=gateway_mac(i))
            netlink.address_up(ipr, BRIDGE, f"198.18.{10 + i}.1", 24)
            for h in (h for h in self.hosts if h.leaf == i):
                idx = netlink.add_veth(ipr, h.port, mtu=c.mtu, peer=h.ifname, peer_ns=h.netns,
                                       peer_mac=h.mac, mac=port_mac(h))
                ipr.link("set", index=idx, master=br, state="up")
                netlink.no_udp_gso(leaf_ns(c.name, i), h.port)
                netlink.static_neighbour(ipr, br, h.ip, h.mac)
            for lk in (lk for lk in self.links if lk.kind == "L" and lk.a == i):
                peer = self._peer(lk)
                netlink.add_veth(ipr, lk.ifname, mtu=c.mtu, peer=peer.ifname,
                                 peer_ns=peer.netns, peer_mac=peer.mac, mac=lk.mac)

    def _link_up(self, lk: Link) -> None:
        """One end of a leaf-spine link: address, neighbour, TBF."""
        with netlink.iproute(lk.netns) as ipr:
            idx = netlink.address_up(ipr, lk.ifname, lk.ip, 30)
            netlink.static_neighbour(ipr, idx, lk.peer_ip, self._peer(lk).mac)
            netlink.add_tbf(ipr, idx, self.config)

    def _host_up(self, h: LsHost) -> None:
        with netlink.iproute(h.netns) as ipr:
            idx = netlink.address_up(ipr, h.ifname, h.ip, h.prefixlen)
            netlink.static_neighbour(ipr, idx, h.gateway, h.gateway_mac)
            for o in self.hosts:      # same-leaf neighbours: no ARP at all
                if o.leaf == h.leaf and o is not h:
                    netlink.static_neighbour(ipr, idx, o.ip, o.mac)
            ipr.route("add", dst="198.18.0.0/15", gateway=h.gateway)

    def _routes(self) -> None:
        """Each leaf reaches every other leaf's /24 over all spines (one
        multipath route); each spine reaches each leaf's /24 over its link."""
        c = self.config
        for i in range(c.leaves):
            with netlink.iproute(leaf_ns(c.name, i)) as ipr:
                ups = {lk.b: lk for lk in self.links if lk.kind == "L" and lk.a == i}
                hops = [{"gateway": ups[k].peer_ip, "oif": ipr.link_lookup(ifname=ups[k].ifname)[0]}
                        for k in sorted(ups)]
                for d in range(c.leaves):
                    if d == i:
                        continue
                    if len(hops) == 1:
                        ipr.route("add", dst=f"198.18.{10 + d}.0/24", gateway=hops[0]["gateway"])
                    else:
                        ipr.route("add", dst=f"198.18.{10 + d}.0/24", multipath=hops)
        for k in range(c.spines):
            with netlink.iproute(spine_ns(c.name, k)) as ipr:
                for lk in (lk for lk in self.links if lk.kind == "S" and lk.a == k):
                    ipr.route("add", dst=f"198.18.{10 + lk.b}.0/24", gateway=lk.peer_ip)

    # ---- maps (pinned: any process can use them)
    def link_counters(self) -> list[dict[str, Any]]:
        """Every (link, 5-tuple) the counters saw: link label, flow, bytes, packets."""
        return pathpin.link_counters(self._map_fd("link_bytes"))

    def reset_link_counters(self) -> None:
        pathpin.clear_link_counters(self._map_fd("link_bytes"))

    def pins_now(self) -> list[dict[str, Any]]:
        return pathpin.read_pins(self._map_fd("path_pins"))

    def set_pin(self, saddr: str, daddr: str, dport: int, sport: int, spine: int) -> None:
        pathpin.set_pin(self._map_fd("path_pins"), saddr, daddr, dport, sport, spine)

    def clear_pins(self) -> None:
        pathpin.clear_pins(self._map_fd("path_pins"))

    # ---- probing the leaves' hash
    def probe(self, src: LsHost, dst: LsHost, dport: int = W.PORT, ports: range | None = None,
              settle_s: float = 0.05) -> dict[int, int]:
        """source port -> spine for UDP src -> dst:dport, found by sending one
        datagram per candidate port and reading which uplink's counter saw
        it. The hash is seeded per leaf namespace, so this holds for this rig
        only. Pins of this (src, dst, dport) must be absent (they rewrite)."""
        socks = []
        try:
            with netns.inside(src.netns):
                for p in ports or range(20000, 20032):
                    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    try:
                        s.bind((src.ip, p))
                    except OSError:
                        s.close()
                        continue
                    socks.append((p, s))
            for _, s in socks:
                with contextlib.suppress(OSError):
                    s.sendto(b"ltp-path-probe", (dst.ip, dport))
        finally:
            for _, s in socks:
                s.close()
        time.sleep(settle_s)
        want = {p for p, _ in socks}
        return {e["sport"]: e["spine"] for e in self.link_counters()
                if e["kind"] == "L" and e["leaf"] == src.leaf and e["saddr"] == src.ip
                and e["daddr"] == dst.ip and e["dport"] == dport and e["sport"] in want}

    # ---- observation
    def tbf(self) -> list[dict[str, Any]]:
        """Bytes, packets and drops of the TBF on each link direction."""
        out = []
        for lk in self.links:
            with netlink.iproute(lk.netns) as ipr:
                st = netlink.tbf_stats(ipr, ipr.link_lookup(ifname=lk.ifname)[0])
            out.append({"link": lk.label, "present": st is not None,
                        **{k: (st or {}).get(k, 0) for k in ("bytes", "packets", "drops")}})
        return out

    def _observations(self) -> dict[str, Any]:
        # `ltp rig status`: RigBase.status adds these to the description
        return {"tbf": self.tbf}
