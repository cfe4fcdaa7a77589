# SPDX-License-Identifier: Apache-2.0
"""The star rig: a software switch in one network namespace, a parameter
server and N workers in namespaces of their own, a TBF bottleneck toward the
PS and a tc BPF loss injector (lossinject.py, bpf/loss_tc.c). This module builds,
uses and observes one (`Rig`). What a rig is on paper (config, hosts, names)
is star_plan.py, its removal teardown.py, the rate and loss check
traffic.py; their public names are re-exported here, where callers take them.

Topology (built with pyroute2 only; see docs/rig.md)::

    ltp-<rig>-ps  [ltp-ps 198.18.0.1] ---veth--- [sw-ps] \\
    ltp-<rig>-w0  [ltp-w0 198.18.0.10] --veth--- [sw-w0] -- br0  (ltp-<rig>-sw)
    ...                                                    /
    ltp-<rig>-wN  [ltp-wN 198.18.0.(10+N)] ----- [sw-wN]

Egress of sw-ps (and of every port with shape="all") carries TBF (rate,
burst, buffer = TBF limit); egress of sw-ps (every port with loss_on="all")
carries the loss injector, attached with clsact + cls_bpf direct-action
before the TBF. The injector's maps and program are pinned under
/sys/fs/bpf/ltp-rig/<rig>/ and the rig's description is saved as JSON in
/run/ltp/rigs/<rig>.json, so a rig outlives the process that built it and
another process can `Rig.attach(name)` to read counters, set the loss, run
commands in it, or tear it down.

    >>> with Rig(RigConfig(name="t", workers=4)) as rig:    # doctest: +SKIP
    ...     rig.exec("w0", ["ping", "-c1", rig.ps.ip])
    ...     rig.set_loss(0.01)
    ...     rig.loss_counters()
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from .. import netns
from . import lossinject, netlink, tcprogs, teardown
from .base import RigBase, RigError, saved_names
from .netlink import NUD_NOARP, NUD_PERMANENT, TC_EGRESS
from .star_plan import (BRIDGE, BROADCAST, DEFAULT_NAME, MAX_RATE_BPS, MAX_SERVERS,
                        MAX_WORKERS, MIN_RATE_BPS, NAME_RE, PIN_ROOT, PREFIXLEN, PS_IP, STATE_DIR,
                        SUBNET, WORKER_BASE, Host, RigConfig, namespaces_by_rig, node_links,
                        pin_dir, plan_hosts, state_path, switch_ns)
from .teardown import remove_all
from .traffic import measure_rate, udp_blast

LOSS_STATS = lossinject.STATS

__all__ = ["BRIDGE", "BROADCAST", "DEFAULT_NAME", "LOSS_STATS", "MAX_RATE_BPS", "MAX_SERVERS",
           "MAX_WORKERS",
           "MIN_RATE_BPS", "NUD_NOARP", "NUD_PERMANENT", "PIN_ROOT", "PREFIXLEN", "PS_IP",
           "STATE_DIR", "SUBNET", "TC_EGRESS", "WORKER_BASE", "Host", "Rig", "RigConfig",
           "RigError", "measure_rate", "pin_dir", "plan_hosts", "remove_all", "state_path",
           "switch_ns", "udp_blast"]

HostKey = Host | str | int   # a Host, short name ("ps", "w3"), worker index, namespace or IP


class Rig(RigBase):
    """A named rig. `with Rig(cfg) as rig:` builds it and always tears it
    down (also on exceptions, Ctrl-C and SIGTERM); `Rig(cfg).up()` builds one
    that stays (the CLI's `ltp rig up`); `Rig.attach(name)` reconnects to an
    existing one (leaving a `with` block does not tear an attached rig down;
    call `down()` for that)."""

    def __init__(self, config: RigConfig | None = None, **kwargs: Any):
        if config is None:
            config = RigConfig(**kwargs)
        elif kwargs:
            raise TypeError("pass a RigConfig or keyword arguments, not both")
        super().__init__()
        self.config = config
        self.hosts: list[Host] = plan_hosts(config.name, config.workers, config.servers)
        self.switch_ns = switch_ns(config.name)
        self.created: float | None = None

    # ---- description
    @property
    def ps(self) -> Host:
        return self.hosts[0]

    @property
    def servers(self) -> list[Host]:
        """The server hosts: ps, then ps1, ps2, ... (RigConfig.servers)."""
        return [h for h in self.hosts if h.role == "ps"]

    @property
    def workers(self) -> list[Host]:
        return [h for h in self.hosts if h.role == "worker"]

    def _ports(self, which: str) -> list[str]:
        """Switch ports a per-port option ("ps" or "all") applies to: every
        server's, or every port."""
        if which == "all":
            return [h.port for h in self.hosts]
        return [h.port for h in self.servers]

    def node_devices(self, k: int) -> list[Host]:
        """The hosts and devices on node k (RigConfig.nodes)."""
        return [h for h in self.hosts if self.config.node_of(h) == k]

    @property
    def shaped_ports(self) -> list[str]:
        """What carries a TBF: ports of their own, then each node's two links."""
        nodes = range(self.config.nodes)
        linked = {h.port for k in nodes for h in self.node_devices(k)}
        return [p for p in self._ports(self.config.shape) if p not in linked] \
            + [link for k in nodes for link in node_links(k)]

    @property
    def loss_ports(self) -> list[str]:
        return self._ports(self.config.loss_on)

    @property
    def namespaces(self) -> list[str]:
        return [self.switch_ns] + [h.netns for h in self.hosts]

    @property
    def pins(self) -> dict[str, str]:
        d = pin_dir(self.name)
        return {"dir": d, **{k: f"{d}/{k}" for k in lossinject.PINS}}

    def host(self, key: HostKey) -> Host:
        """A host by Host, short name ("ps", "w3"), worker index, namespace or IP."""
        if isinstance(key, Host):
            return key
        if isinstance(key, int) and not isinstance(key, bool):
            if 0 <= key < len(self.workers):
                return self.workers[key]
            raise KeyError(f"no worker {key} (rig {self.name} has {len(self.workers)} workers)")
        for h in self.hosts:
            if key in (h.name, h.netns, h.ip):
                return h
        names = ", ".join(h.name for h in self.hosts[:4]) + (", ..." if len(self.hosts) > 4 else "")
        raise KeyError(f"no host {key!r} in rig {self.name} (hosts: {names})")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": 1, "config": self.config.to_dict(),
                "nodes": [[h.name for h in self.node_devices(k)]
                          for k in range(self.config.nodes)],
                "created": self.created, "switch_ns": self.switch_ns, "bridge": BRIDGE,
                "subnet": f"{SUBNET}/{PREFIXLEN}", "shaped_ports": self.shaped_ports,
                "loss_ports": self.loss_ports,
                "xdp_pass_ports": ([h.port for h in self.hosts]
                                   if self.config.mode == "native" else []),
                "pins": self.pins, "state": "up" if self._is_up else "building",
                "owner_pid": self.owner_pid,
                "hosts": [h.to_dict() for h in self.hosts]}

    def __repr__(self) -> str:
        c = self.config
        return (f"Rig({c.name!r}, workers={c.workers}, servers={c.servers}, nodes={c.nodes}, "
                f"colocate={c.colocate}, rate={c.rate_bps}, "
                f"buffer={c.buffer_bytes}, "
                f"loss={c.loss}, shape={c.shape}, mode={c.mode}, up={self._is_up})")

    # ---- lifecycle (the rest is RigBase's)
    _KIND = "rig"
    _UP_HINT = "ltp rig up"
    _CONFIG = RigConfig
    _state_path = staticmethod(state_path)
    _pin_dir = staticmethod(pin_dir)
    _remove = staticmethod(teardown.remove_star)

    @staticmethod
    def _found_namespaces(name: str) -> list[str]:
        return namespaces_by_rig().get(name, [])


    def _restore(self, state: dict[str, Any]) -> None:
        super()._restore(state)
        self.created = state.get("created")

    @classmethod
    def _saved_namespaces(cls, name: str) -> list[str]:
        with contextlib.suppress(Exception):
            with open(state_path(name)) as f:
                st = json.load(f)
            return [st["switch_ns"]] + [h["netns"] for h in st["hosts"]]
        return []

    def _build(self) -> None:
        from pyroute2 import IPRoute  # noqa: F401, PLC0415 (0.15 s to import; only what touches links)
        self.created = time.time()
        self._save()                     # first, so `down` finds a half-built rig
        for ns in self.namespaces:
            netns.create(ns)
            netlink.disable_ipv6(ns)
        # A switch forwards frames; it does not run the host's firewall. Where
        # br_netfilter is loaded (container runtimes load it), every bridged
        # frame would otherwise go through iptables hooks, a CPU cost per
        # packet that a hardware switch does not have.
        netlink.sysctl(self.switch_ns, {f"net.bridge.bridge-nf-call-{k}": "0"
                                        for k in ("iptables", "ip6tables", "arptables")},
                       missing_ok=True)
        self._build_switch()
        if self.config.mode == "native":
            tcprogs.xdp_pass((h.port, self.switch_ns) for h in self.hosts)
        self._built()

    def _build_switch(self) -> None:
        """The bridge and its ports, the hosts' ends, TBF and the loss injector."""
        cfg = self.config
        with netlink.iproute(self.switch_ns) as sw:
            br = netlink.add_bridge(sw, BRIDGE)
            ports = {}
            for h in self.hosts:
                idx = ports[h.port] = netlink.add_veth(sw, h.port, mtu=cfg.mtu, peer=h.ifname,
                                                       peer_ns=h.netns, peer_mac=h.mac)
                sw.link("set", index=idx, master=br, state="up")
                netlink.no_udp_gso(self.switch_ns, h.port)
                # static FDB: frames to a host never flood, even before it talked
                sw.fdb("add", ifindex=idx, lladdr=h.mac, state=NUD_NOARP)
            sw.link("set", index=br, state="up")
            for h in self.hosts:
                self._host_up(h)
            for port in self.shaped_ports:
                if port in ports:      # a node's links are shaped in _build_nodes
                    netlink.add_tbf(sw, ports[port], cfg)
            lossinject.load(sw, [ports[p] for p in self.loss_ports], self.pins["dir"], cfg.loss)
            self._build_nodes(sw, ports)
            for h in self.servers:     # the servers' group answers reach the workers only
                netlink.no_broadcast(sw, ports[h.port])

    def _build_nodes(self, sw, ports: dict[str, int]) -> None:
        """Each node's link: an IFB each way, shaped, that its devices' ports
        send and receive through (netlink.redirect_through)."""
        for k in range(self.config.nodes):
            down, up = (netlink.add_ifb(sw, name, self.config) for name in node_links(k))
            devices = self.node_devices(k)
            for h in devices:
                netlink.redirect_through(sw, ports[h.port], down, up, [d.ip for d in devices])

    def _host_up(self, h: Host) -> None:
        with netlink.iproute(h.netns) as ipr:
            # the broadcast address: the PS's group sends (Endpoint.push group=)
            idx = netlink.address_up(ipr, h.ifname, h.ip, h.prefixlen, broadcast=BROADCAST)
            for other in self.hosts:   # MACs known up front: no ARP on the bottleneck
                if other is not h:
                    netlink.static_neighbour(ipr, idx, other.ip, other.mac)

    def has_broadcast(self) -> bool:
        """Does the PS's address carry the rig's broadcast address (rigs built
        before group sends existed do not: 198.18.0.255 is unicast there)?"""
        with netlink.iproute(self.ps.netns) as ipr:
            return any(a.get_attr("IFA_BROADCAST") == BROADCAST
                       for a in ipr.get_addr(family=socket.AF_INET))

    # ---- reconnecting
    @classmethod
    def attach(cls, name: str = DEFAULT_NAME) -> Rig:
        """The existing rig `name`, from /run/ltp/rigs/<name>.json."""
        return super().attach(name)

    @classmethod
    def _read_state(cls, name: str) -> dict[str, Any]:
        try:
            return super()._read_state(name)
        except (OSError, ValueError) as e:
            raise RigError(f"cannot read {state_path(name)}: {e}") from e

    @staticmethod
    def _saved() -> set[str]:
        return saved_names(STATE_DIR)

    @staticmethod
    def names() -> list[str]:
        """Names of the rigs on this machine (state files and leftover namespaces)."""
        names = saved_names(STATE_DIR)
        names |= set(namespaces_by_rig())
        with contextlib.suppress(FileNotFoundError):
            names |= {d for d in os.listdir(PIN_ROOT) if NAME_RE.match(d)}
        return sorted(names)

    @staticmethod
    def down_all(force: bool = False) -> list[str]:
        """Tear down every rig and return their names. Rigs that a live
        process owns (being built, or inside a `with Rig(...)` block: another
        user's test run) are left alone unless `force`."""
        removed = []
        for n in Rig.names():
            if force or Rig.owner(n) is None:
                Rig.destroy(n)
                removed.append(n)
        return removed

    # ---- using it
    def argv(self, host: HostKey, argv: Sequence[str]) -> list[str]:
        """The command line that runs `argv` inside `host`'s namespace."""
        if isinstance(argv, str):
            raise TypeError("argv must be a list of strings, not one string")
        return ["ip", "netns", "exec", self.host(host).netns, *map(str, argv)]

    def exec(self, host: HostKey, argv: Sequence[str], *, check: bool = False,
             capture: bool = True, timeout: float | None = None,
             input: str | None = None) -> subprocess.CompletedProcess:
        """Run argv in the host's namespace and wait (text output captured
        unless capture=False)."""
        return subprocess.run(self.argv(host, argv), check=check, timeout=timeout,
                              capture_output=capture, text=True, input=input)

    def spawn(self, host: HostKey, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen:
        """Start argv in the host's namespace (subprocess.Popen keywords pass through)."""
        return subprocess.Popen(self.argv(host, argv), **popen_kwargs)

    def socket(self, host: HostKey, family: int = socket.AF_INET,
               type: int = socket.SOCK_DGRAM, proto: int = 0) -> socket.socket:
        """A socket created in the host's namespace (it stays there)."""
        with netns.inside(self.host(host).netns):
            return socket.socket(family, type, proto)

    # ---- loss injector (its pinned maps: any process can use them)
    def set_loss(self, p: float) -> None:
        """Set the drop probability of IPv4 UDP/TCP packets, effective at once."""
        lossinject.write(self._map_fd("loss_cfg"), lossinject.check(p))
        if p != self.config.loss:
            self.config = dataclasses.replace(self.config, loss=float(p))
            if os.path.exists(state_path(self.name)):
                self._save()

    def get_loss(self) -> float:
        """The drop probability the injector applies now (read from its map)."""
        return lossinject.read(self._map_fd("loss_cfg"))

    def loss_counters(self) -> dict[str, int]:
        """Packets (segments) the injector dropped and passed, and packets it
        does not judge ("other": ARP, ICMP, IPv6...), summed over CPUs."""
        return lossinject.counters(self._map_fd("loss_stats"))

    def reset_loss_counters(self) -> None:
        lossinject.reset(self._map_fd("loss_stats"))

    # ---- observation
    def bottleneck(self) -> list[dict[str, Any]]:
        """TBF settings and counters of each shaped port."""
        out = []
        with netlink.iproute(self.switch_ns) as sw:
            for port in self.shaped_ports:
                idx = sw.link_lookup(ifname=port)
                stats = netlink.tbf_stats(sw, idx[0]) if idx else None
                out.append({"port": port, "rate_bps": self.config.rate_bps,
                            "buffer_bytes": self.config.buffer_bytes,
                            "burst_bytes": self.config.burst, "present": stats is not None,
                            **(stats or {})})
        return out

    def link_stats(self, host: HostKey) -> dict[str, int]:
        """rx/tx byte and packet counters of a host's veth."""
        h = self.host(host)
        with netlink.iproute(h.netns) as ipr:
            link = ipr.get_links(ifname=h.ifname)[0]
        st = link.get_attr("IFLA_STATS64") or {}
        return {k: int(st.get(k, 0)) for k in
                ("rx_bytes", "rx_packets", "tx_bytes", "tx_packets", "rx_dropped", "tx_dropped")}

    def drops(self) -> dict[str, int]:
        """Packets the rig's path dropped so far, wherever it counts them: the
        shaped ports' TBF queues ("tbf") and every veth's rx/tx drops in the
        rig's namespaces ("veth": a full XDP ring, a full backlog), and the
        loss injector's ("injected")."""
        tbf = sum(int(b.get("drops", 0)) for b in self.bottleneck())
        veth = 0
        for ns in self.namespaces:
            with netlink.iproute(ns) as ipr:
                for link in ipr.get_links():
                    st = link.get_attr("IFLA_STATS64") or {}
                    veth += int(st.get("rx_dropped", 0)) + int(st.get("tx_dropped", 0))
        return {"tbf": tbf, "veth": veth, "injected": self.loss_counters()["dropped"]}

    def attachments(self) -> dict[str, Any]:
        """What is attached now: XDP programs and tc filters per switch port."""
        out: dict[str, Any] = {}
        with netlink.iproute(self.switch_ns) as sw:
            for link in sw.get_links():
                name = link.get_attr("IFLA_IFNAME")
                if name in ("lo", BRIDGE):
                    continue
                xdp = link.get_attr("IFLA_XDP")
                out[name] = {"xdp_prog_id": xdp.get_attr("IFLA_XDP_PROG_ID") if xdp else None,
                             "egress_filters": netlink.egress_filters(sw, link["index"])}
        return out

    def loss_status(self) -> dict[str, Any]:
        """The injector's probability, ports and counters, and the drop
        fraction they show (None before it judged a packet)."""
        c = self.loss_counters()
        judged = c["dropped"] + c["passed"]
        return {"loss": self.get_loss(), "ports": self.loss_ports, **c,
                "measured": c["dropped"] / judged if judged else None}

    def _observations(self) -> dict[str, Any]:
        # `ltp rig status`: RigBase.status adds these to the description
        return {"bottleneck": self.bottleneck, "loss_injector": self.loss_status}
