"""The leaf-spine rig: leaf and spine routers in namespaces, jobs' hosts on the
leaves, every leaf-spine link shaped alike, per-link BPF counters and per-host
path pinning (bpf/path_pin.c). See docs/paths.md.

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
import ctypes
import os
import re
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import clib, netns
from ..xdp import wire as W
from .star import TC_EGRESS, NUD_PERMANENT, Host, RigError, _disable_ipv6, _ipr, _sysctl
from .base import RigBase, ShapedConfig, saved_names

STATE_DIR = "/run/ltp/leafspine"
PIN_ROOT = "/sys/fs/bpf/ltp-ls"
NS_PREFIX = "lls"
BRIDGE = "br0"
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_]{0,11}$")
KIND_LEAF_UP, KIND_SPINE_DN = 0x4C, 0x53     # bpf/path_pin.c LINK_KIND_*


class _LinkKey(ctypes.Structure):      # must match struct link_key in bpf/path_pin.c
    _fields_ = [("kind", ctypes.c_uint8), ("a", ctypes.c_uint8), ("b", ctypes.c_uint8),
                ("proto", ctypes.c_uint8), ("saddr", ctypes.c_uint32),   # network order
                ("daddr", ctypes.c_uint32), ("sport", ctypes.c_uint16),  # network order
                ("dport", ctypes.c_uint16)]


class _LinkVal(ctypes.Structure):      # struct link_val
    _fields_ = [("bytes", ctypes.c_uint64), ("packets", ctypes.c_uint64)]


class _PinKey(ctypes.Structure):       # struct pin_key
    _fields_ = [("saddr", ctypes.c_uint32), ("daddr", ctypes.c_uint32),
                ("dport", ctypes.c_uint16), ("pad", ctypes.c_uint16)]


class _PinVal(ctypes.Structure):       # struct pin_val
    _fields_ = [("sport", ctypes.c_uint16), ("spine", ctypes.c_uint16),
                ("pad", ctypes.c_uint32), ("packets", ctypes.c_uint64)]


def _be32(ip: str) -> int:
    return int.from_bytes(socket.inet_aton(ip), "little")   # in-memory network order


def _ip(be: int) -> str:
    return socket.inet_ntoa(be.to_bytes(4, "little"))


def _be16(port: int) -> int:
    return socket.htons(port)


# --------------------------------------------------------------------------- config / plan

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
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ValueError(f"name: {self.name!r} must be 1-12 characters of a-z, 0-9, _")
        for key, lo, hi in (("leaves", 2, 16), ("spines", 1, 16), ("jobs", 1, 8),
                            ("workers", 1, 16)):
            v = getattr(self, key)
            if not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"{key}: must be in {lo}..{hi}, got {v!r}")
        if not 64_000 <= self.rate_bps <= 32 * 10**9:
            raise ValueError(f"rate: must be in 64kbit..32gbit, got {self.rate_bps}")
        if not self.mtu + 14 <= self.buffer_bytes <= 1 << 30:
            raise ValueError(f"buffer: must be in {self.mtu + 14}..1GiB, got {self.buffer_bytes}")
        if self.mode not in ("native", "skb"):
            raise ValueError(f"mode: must be native or skb, got {self.mode!r}")



@dataclass(frozen=True)
class LsHost(Host):
    """A host of the leaf-spine rig (a rig.Host plus its job, leaf and gateway)."""

    job: int = 0
    leaf: int = 0
    gateway: str = ""
    gateway_mac: str = ""


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
        return f"l{self.a}>s{self.b}" if self.kind == "L" else f"s{self.a}>l{self.b}"

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


def _mac(*b: int) -> str:
    return ":".join(f"{x:02x}" for x in (0x02, 0x4C, *b))


def plan(cfg: LeafSpineConfig) -> tuple[list[LsHost], list[Link]]:
    """Hosts (job by job: PS, then workers) and links of the rig."""
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
                                ip=f"198.18.{10 + leaf}.{10 + n}", mac=_mac(0x48, leaf, n, 0),
                                port=f"p-{s}", job=j, leaf=leaf,
                                gateway=f"198.18.{10 + leaf}.1", gateway_mac=_mac(0x47, leaf, 0, 1)))
    links: list[Link] = []
    for i in range(cfg.leaves):
        for k in range(cfg.spines):
            links.append(Link("L", i, k, leaf_ns(cfg.name, i), f"up{k}",
                              _mac(KIND_LEAF_UP, i, k, 1), f"198.19.{i}.{4 * k + 1}",
                              f"198.19.{i}.{4 * k + 2}"))
            links.append(Link("S", k, i, spine_ns(cfg.name, k), f"dn{i}",
                              _mac(KIND_SPINE_DN, k, i, 2), f"198.19.{i}.{4 * k + 2}",
                              f"198.19.{i}.{4 * k + 1}"))
    return hosts, links


class JobView:
    """The part of the rig one job sees, shaped like a star `Rig` for
    control.cluster.LtpCluster (config.mode/rate_bps/mtu, ps, workers)."""

    def __init__(self, ls: "LeafSpine", job: int):
        self.job = job
        self.config = ls.config
        self.ps = next(h for h in ls.hosts if h.job == job and h.role == "ps")
        self.workers = [h for h in ls.hosts if h.job == job and h.role == "worker"]


# --------------------------------------------------------------------------- libbpf access

class _Bpf:
    """The leaf-spine rig's map access through dataplane.clib, with rig errors."""

    @staticmethod
    def get(path: str) -> int:
        try:
            return clib.obj_get(path)
        except OSError as e:
            raise RigError(f"{path} is not pinned: is the leaf-spine rig up? "
                           "(`ltp rig up --topology leaf-spine`)") from e

    @staticmethod
    def pin(fd: int, path: str) -> None:
        try:
            clib.obj_pin(fd, path)
        except OSError as e:
            raise RigError(f"pinning {path} failed: {e.strerror} (`ltp doctor --fix`)") from e

    @staticmethod
    def items(fd: int, ktype, vtype) -> list:
        return clib.map_items(fd, ktype, vtype)

    @staticmethod
    def update(fd: int, key, val) -> None:
        try:
            clib.map_update(fd, key, val)
        except OSError as e:
            raise RigError(f"map update failed: {e.strerror}") from e

    @classmethod
    def clear(cls, fd: int, ktype) -> None:
        vtype = _LinkVal if ktype is _LinkKey else _PinVal
        for k, _ in clib.map_items(fd, ktype, vtype):
            with contextlib.suppress(OSError):
                clib.map_delete(fd, k)


# --------------------------------------------------------------------------- the rig

class LeafSpine(RigBase):
    """A leaf-spine rig. `with LeafSpine(cfg) as ls:` builds and always removes
    it (exceptions, Ctrl-C, SIGTERM); `LeafSpine(cfg).up()` builds one that
    stays; `LeafSpine.attach(name)` reconnects; `down()` removes."""

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
        return {"dir": d, **{k: f"{d}/{k}" for k in
                             ("link_bytes", "path_pins", "link_prog", "pin_prog")}}

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

    @staticmethod
    def _found_namespaces(name: str) -> list[str]:
        return _namespaces(name)

    @staticmethod
    def _remove(name: str, namespaces: Sequence[str] = ()) -> None:
        _teardown(name)       # finds the namespaces by their names

    @staticmethod
    def _exists_error(name: str) -> str:
        return (f"a leaf-spine rig named {name!r} exists already: pick another "
                f"name or `ltp paths down --name {name}`")

    @staticmethod
    def _incomplete_error(name: str, missing: list[str]) -> str:
        return (f"leaf-spine rig {name!r} is incomplete (missing {missing[0]}...); "
                f"`ltp paths down --name {name}` removes what is left")

    def _build(self) -> None:
        c = self.config
        self._save()                 # first: `down` finds a half-built rig
        for ns in self.namespaces:
            netns.create(ns)
            _disable_ipv6(ns)
        for ns in self.routers:
            _sysctl(ns, {"net.ipv4.ip_forward": "1", "net.ipv4.fib_multipath_hash_policy": "1",
                         "net.ipv4.conf.all.rp_filter": "0",
                         "net.ipv4.conf.default.rp_filter": "0"})
        # leaf side: bridge + host ports + uplinks (spine ends go straight to their namespace)
        for i in range(c.leaves):
            with _ipr(leaf_ns(c.name, i)) as ipr:
                ipr.link("add", ifname=BRIDGE, kind="bridge", br_stp_state=0,
                         br_forward_delay=0, br_mcast_snooping=0, address=_mac(0x47, i, 0, 1))
                br = ipr.link_lookup(ifname=BRIDGE)[0]
                ipr.addr("add", index=br, address=f"198.18.{10 + i}.1", prefixlen=24)
                ipr.link("set", index=br, state="up")
                for h in (h for h in self.hosts if h.leaf == i):
                    ipr.link("add", ifname=h.port, kind="veth", mtu=c.mtu,
                             address=_mac(0x50, i, int(h.ip.split(".")[3]), 0),
                             peer={"ifname": h.ifname, "net_ns_fd": h.netns, "address": h.mac,
                                   "mtu": c.mtu})
                    idx = ipr.link_lookup(ifname=h.port)[0]
                    ipr.link("set", index=idx, master=br, state="up")
                    ipr.neigh("add", dst=h.ip, lladdr=h.mac, ifindex=br, state=NUD_PERMANENT)
                for lk in (lk for lk in self.links if lk.kind == "L" and lk.a == i):
                    peer = next(p for p in self.links if p.kind == "S" and p.a == lk.b
                                and p.b == i)
                    ipr.link("add", ifname=lk.ifname, kind="veth", mtu=c.mtu, address=lk.mac,
                             peer={"ifname": peer.ifname, "net_ns_fd": peer.netns,
                                   "address": peer.mac, "mtu": c.mtu})
        for lk in self.links:       # addresses, neighbours, TBF on both ends
            with _ipr(lk.netns) as ipr:
                idx = ipr.link_lookup(ifname=lk.ifname)[0]
                ipr.addr("add", index=idx, address=lk.ip, prefixlen=30)
                ipr.link("set", index=idx, state="up")
                peer_mac = next(p.mac for p in self.links if p.ip == lk.peer_ip)
                ipr.neigh("add", dst=lk.peer_ip, lladdr=peer_mac, ifindex=idx,
                          state=NUD_PERMANENT)
                ipr.tc("add", "tbf", index=idx, handle=0x10000, rate=f"{c.rate_bps}bit",
                       burst=c.burst, limit=c.buffer_bytes)
        for h in self.hosts:
            with _ipr(h.netns) as ipr:
                idx = ipr.link_lookup(ifname=h.ifname)[0]
                ipr.addr("add", index=idx, address=h.ip, prefixlen=24)
                ipr.link("set", index=idx, state="up")
                ipr.neigh("add", dst=h.gateway, lladdr=h.gateway_mac, ifindex=idx,
                          state=NUD_PERMANENT)
                for o in self.hosts:      # same-leaf neighbours: no ARP at all
                    if o.leaf == h.leaf and o is not h:
                        ipr.neigh("add", dst=o.ip, lladdr=o.mac, ifindex=idx,
                                  state=NUD_PERMANENT)
                ipr.route("add", dst="198.18.0.0/15", gateway=h.gateway)
        self._routes()
        self._load_bpf()
        if c.mode == "native":
            from ..xdp.loader import DataplaneError, attach_pass
            for h in self.hosts:
                try:
                    attach_pass(h.port, leaf_ns(c.name, h.leaf), "native")
                except DataplaneError as e:
                    raise RigError(f"XDP_PASS on {h.port}: {e}") from e
        self._built()

    def _routes(self) -> None:
        c = self.config
        for i in range(c.leaves):
            with _ipr(leaf_ns(c.name, i)) as ipr:
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
            with _ipr(spine_ns(c.name, k)) as ipr:
                for lk in (lk for lk in self.links if lk.kind == "S" and lk.a == k):
                    ipr.route("add", dst=f"198.18.{10 + lk.b}.0/24", gateway=lk.peer_ip)

    def _load_bpf(self) -> None:
        from ..xdp.loader import DataplaneError, compile_program
        try:
            b, count_fn = compile_program("path_pin.c", "link_count", prog_type="SCHED_CLS")
            pin_fn = b.load_func(b"path_pin", b.SCHED_CLS)
        except DataplaneError as e:
            raise RigError(str(e)) from e
        try:
            p = self.pins
            os.makedirs(p["dir"], exist_ok=True)
            _Bpf.pin(b[b"link_bytes"].get_fd(), p["link_bytes"])
            _Bpf.pin(b[b"path_pins"].get_fd(), p["path_pins"])
            _Bpf.pin(count_fn.fd, p["link_prog"])
            _Bpf.pin(pin_fn.fd, p["pin_prog"])
            for lk in self.links:
                self._tc_attach(lk.netns, lk.ifname, count_fn.fd, "link_count")
            for h in self.hosts:
                self._tc_attach(h.netns, h.ifname, pin_fn.fd, "path_pin")
        finally:
            b.cleanup()

    @staticmethod
    def _tc_attach(ns: str, ifname: str, fd: int, name: str) -> None:
        with _ipr(ns) as ipr:
            idx = ipr.link_lookup(ifname=ifname)[0]
            ipr.tc("add", "clsact", index=idx)
            ipr.tc("add-filter", "bpf", index=idx, handle=1, fd=fd, name=name,
                   parent=TC_EGRESS, classid=1, direct_action=True)

    @staticmethod
    def names() -> list[str]:
        return sorted(saved_names(STATE_DIR))

    # ---- maps
    def _fd(self, key: str) -> int:
        if key not in self._fds:
            self._fds[key] = _Bpf.get(self.pins[key])
        return self._fds[key]

    def link_counters(self) -> list[dict[str, Any]]:
        """Every (link, 5-tuple) the counters saw: link label, flow, bytes, packets."""
        out = []
        for k, v in _Bpf.items(self._fd("link_bytes"), _LinkKey, _LinkVal):
            kind = "L" if k.kind == KIND_LEAF_UP else "S" if k.kind == KIND_SPINE_DN else "?"
            out.append({"link": f"l{k.a}>s{k.b}" if kind == "L" else f"s{k.a}>l{k.b}",
                        "kind": kind, "leaf": k.a if kind == "L" else k.b,
                        "spine": k.b if kind == "L" else k.a, "proto": k.proto,
                        "saddr": _ip(k.saddr), "daddr": _ip(k.daddr),
                        "sport": socket.ntohs(k.sport), "dport": socket.ntohs(k.dport),
                        "bytes": int(v.bytes), "packets": int(v.packets)})
        return sorted(out, key=lambda e: (e["link"], e["saddr"], e["daddr"], e["sport"]))

    def reset_link_counters(self) -> None:
        _Bpf.clear(self._fd("link_bytes"), _LinkKey)

    def pins_now(self) -> list[dict[str, Any]]:
        return sorted(({"saddr": _ip(k.saddr), "daddr": _ip(k.daddr),
                        "dport": socket.ntohs(k.dport), "sport": socket.ntohs(v.sport),
                        "spine": int(v.spine), "packets": int(v.packets)}
                       for k, v in _Bpf.items(self._fd("path_pins"), _PinKey, _PinVal)),
                      key=lambda e: (e["saddr"], e["daddr"], e["dport"]))

    def set_pin(self, saddr: str, daddr: str, dport: int, sport: int, spine: int) -> None:
        _Bpf.update(self._fd("path_pins"), _PinKey(_be32(saddr), _be32(daddr), _be16(dport), 0),
                    _PinVal(_be16(sport), spine, 0, 0))

    def clear_pins(self) -> None:
        _Bpf.clear(self._fd("path_pins"), _PinKey)

    # ---- probing the leaves' hash
    def probe(self, src: LsHost, dst: LsHost, dport: int = W.PORT, ports: range | None = None,
              settle_s: float = 0.05) -> dict[int, int]:
        """source port -> spine for UDP src -> dst:dport, found by sending one
        datagram per candidate port and reading which uplink's counter saw
        it. The hash is seeded per leaf namespace, so this holds for this rig
        only. Pins of this (src, dst, dport) must be absent (they rewrite)."""
        ports = ports or range(20000, 20032)
        socks = []
        try:
            with netns.inside(src.netns):
                for p in ports:
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
        out: dict[int, int] = {}
        for e in self.link_counters():
            if (e["kind"] == "L" and e["leaf"] == src.leaf and e["saddr"] == src.ip
                    and e["daddr"] == dst.ip and e["dport"] == dport and e["sport"] in want):
                out[e["sport"]] = e["spine"]
        return out

    # ---- observation
    def tbf(self) -> list[dict[str, Any]]:
        out = []
        for lk in self.links:
            with _ipr(lk.netns) as ipr:
                idx = ipr.link_lookup(ifname=lk.ifname)[0]
                q = next((q for q in ipr.get_qdiscs(index=idx)
                          if q.get_attr("TCA_KIND") == "tbf"), None)
            st = (q.get_attr("TCA_STATS") or {}) if q is not None else {}
            out.append({"link": lk.label, "present": q is not None,
                        "bytes": int(st.get("bytes", 0)), "packets": int(st.get("packets", 0)),
                        "drops": int(st.get("drop", 0))})
        return out

    def status(self) -> dict[str, Any]:
        d = self.to_dict()
        d["namespaces_present"] = all(netns.exists(ns) for ns in self.namespaces)
        try:
            d["tbf"] = self.tbf()
        except Exception as e:  # noqa: BLE001 - report, do not fail status
            d["tbf"] = {"error": str(e)}
        return d


def _namespaces(name: str) -> list[str]:
    pre = f"{NS_PREFIX}-{name}-"
    return [ns for ns in netns.listnetns() if ns.startswith(pre)
            and re.match(r"^(l\d+|s\d+|j\d+(ps|w\d+))$", ns[len(pre):])]


def _teardown(name: str) -> None:
    """Remove rig `name`: namespaces (their veths, qdiscs, tc and XDP programs
    go with them), pins and state file. Goes on past errors, reports all."""
    from .star import remove_all
    errors = remove_all(_namespaces(name), pin_dir(name), state_path(name))
    if errors:
        raise RigError(f"tearing down leaf-spine rig {name!r}: " + "; ".join(errors))



def reachable(ls: LeafSpine, src: LsHost, dst: LsHost, port: int = 9999,
              timeout_s: float = 1.0) -> bool:
    """Does a UDP datagram from src reach a socket on dst (through the routers)?"""
    with netns.inside(dst.netns):
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with netns.inside(src.netns):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind((dst.ip, port))
        rx.settimeout(timeout_s)
        tx.sendto(b"ltp-reach " + src.ip.encode(), (dst.ip, port))
        data, addr = rx.recvfrom(256)
        return addr[0] == src.ip
    except OSError:
        return False
    finally:
        rx.close()
        tx.close()
