"""The test rig: a software switch in one network namespace, a parameter
server and N workers in namespaces of their own, a TBF bottleneck toward the
PS and a tc BPF loss injector (bpf/loss_tc.c).

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
import ctypes
import json
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from .. import clib, netns
from .base import RigBase, RigError, ShapedConfig, saved_names

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
MAX_RATE_BPS = 32 * 10**9  # TBF's 32-bit byte rate (pyroute2 sends no TCA_TBF_RATE64)
MIN_RATE_BPS = 64_000
LOSS_STATS = ("dropped", "passed", "other")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_]{0,11}$")
_NS_RE = re.compile(r"^ltp-([a-z0-9][a-z0-9_]{0,11})-(sw|ps|w\d+)$")

TC_EGRESS = 0xFFFFFFF3    # clsact egress hook (ffff:fff3)
NUD_NOARP = 0x40
NUD_PERMANENT = 0x80


# --------------------------------------------------------------------------- config

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
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ValueError(f"name: {self.name!r} must be 1-12 characters of a-z, 0-9, _ "
                             "(starting with a letter or digit)")
        if not isinstance(self.workers, int) or not 1 <= self.workers <= MAX_WORKERS:
            raise ValueError(f"workers: must be in 1..{MAX_WORKERS}, got {self.workers!r}")
        if not MIN_RATE_BPS <= self.rate_bps <= MAX_RATE_BPS:
            raise ValueError(f"rate: must be in {MIN_RATE_BPS // 1000}kbit..."
                             f"{MAX_RATE_BPS // 10**9}gbit, got {self.rate_bps} bit/s")
        frame = self.mtu + 14
        if not frame <= self.buffer_bytes <= 1 << 30:
            raise ValueError(f"buffer: must hold at least one frame ({frame} bytes) and at "
                             f"most 1 GiB, got {self.buffer_bytes} bytes")
        if self.burst_bytes is not None and not frame <= self.burst_bytes <= 1 << 30:
            raise ValueError(f"burst: must be at least one frame ({frame} bytes), "
                             f"got {self.burst_bytes}")
        if not isinstance(self.loss, (int, float)) or not 0.0 <= self.loss < 1.0:
            raise ValueError(f"loss: must be in [0, 1), got {self.loss!r}")
        if self.shape not in ("ps", "all"):
            raise ValueError(f"shape: must be ps or all, got {self.shape!r}")
        if self.loss_on not in ("ps", "all"):
            raise ValueError(f"loss_on: must be ps or all, got {self.loss_on!r}")
        if self.mode not in ("native", "skb"):
            raise ValueError(f"mode: must be native or skb, got {self.mode!r}")
        if not 1280 <= self.mtu <= 3500:
            raise ValueError(f"mtu: must be in 1280..3500 (native XDP on veth), got {self.mtu}")


@dataclass(frozen=True)
class Host:
    """One end host of the rig.

    name: "ps" or "w<i>"; role: "ps" or "worker"; index: worker id (-1 on the PS);
    netns: its namespace; ifname/mac/ip: its veth end; port: the switch-side
    veth (in the switch namespace) that leads to it."""

    name: str
    role: str
    index: int
    netns: str
    ifname: str
    ip: str
    mac: str
    port: str
    prefixlen: int = PREFIXLEN

    @property
    def cidr(self) -> str:
        return f"{self.ip}/{self.prefixlen}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_hosts(name: str, workers: int) -> list[Host]:
    """The hosts of rig `name`: the PS first, then workers w0..w(N-1)."""
    def mk(short: str, role: str, index: int, last: int) -> Host:
        return Host(name=short, role=role, index=index, netns=f"ltp-{name}-{short}",
                    ifname=f"ltp-{short}", ip=f"198.18.0.{last}",
                    mac=f"02:4c:54:00:00:{last:02x}", port=f"sw-{short}")
    hosts = [mk("ps", "ps", -1, 1)]
    hosts += [mk(f"w{i}", "worker", i, WORKER_BASE + i) for i in range(workers)]
    return hosts


def switch_ns(name: str) -> str:
    return f"ltp-{name}-sw"


def state_path(name: str) -> str:
    return os.path.join(STATE_DIR, f"{name}.json")


def pin_dir(name: str) -> str:
    return os.path.join(PIN_ROOT, name)


# --------------------------------------------------------------------------- BPF map access

class _Libbpf:
    """The rig's map access through dataplane.clib, with rig errors (works on
    pinned maps, so a process that did not load the program can use them)."""

    @staticmethod
    def ncpus() -> int:
        return clib.num_possible_cpus()

    @staticmethod
    def get(path: str) -> int:
        return clib.obj_get(path)

    @staticmethod
    def pin(fd: int, path: str) -> None:
        try:
            clib.obj_pin(fd, path)
        except OSError as e:
            raise RigError(f"{e.strerror} pinning {path} (is bpffs mounted on /sys/fs/bpf? "
                           "`ltp doctor --fix`)") from e

    @staticmethod
    def lookup(fd: int, key: int, value) -> None:
        try:
            clib.map_lookup(fd, key, value)
        except OSError as e:
            raise RigError(f"map lookup failed: {e.strerror}") from e

    @staticmethod
    def update(fd: int, key: int, value) -> None:
        try:
            clib.map_update(fd, key, value)
        except OSError as e:
            raise RigError(f"map update failed: {e.strerror}") from e


def _loss_threshold(p: float) -> int:
    return min(int(round(p * 2**32)), 2**32 - 1)


def _compile_loss_prog():
    """Compile bpf/loss_tc.c with bcc as a SCHED_CLS program: (bpf, fn)."""
    from ..xdp.loader import DataplaneError, compile_program
    try:
        return compile_program("loss_tc.c", "loss_tc", prog_type="SCHED_CLS")
    except DataplaneError as e:
        raise RigError(str(e)) from e


# --------------------------------------------------------------------------- the rig

@contextlib.contextmanager
def _ipr(ns: str):
    """An IPRoute whose netlink socket lives in namespace `ns`. Made with
    setns on this thread (netns.inside), not IPRoute(netns=...), which forks
    a helper per call and creates the namespace when it is missing."""
    from pyroute2 import IPRoute
    with netns.inside(ns):
        ipr = IPRoute()
    try:
        yield ipr
    finally:
        ipr.close()


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
        self.hosts: list[Host] = plan_hosts(config.name, config.workers)
        self.switch_ns = switch_ns(config.name)
        self.created: float | None = None

    # ---- description
    @property
    def ps(self) -> Host:
        return self.hosts[0]

    @property
    def workers(self) -> list[Host]:
        return self.hosts[1:]

    @property
    def shaped_ports(self) -> list[str]:
        return [h.port for h in self.hosts] if self.config.shape == "all" else [self.ps.port]

    @property
    def loss_ports(self) -> list[str]:
        return [h.port for h in self.hosts] if self.config.loss_on == "all" else [self.ps.port]

    @property
    def namespaces(self) -> list[str]:
        return [self.switch_ns] + [h.netns for h in self.hosts]

    @property
    def pins(self) -> dict[str, str]:
        d = pin_dir(self.name)
        return {"dir": d, "loss_cfg": f"{d}/loss_cfg", "loss_stats": f"{d}/loss_stats",
                "loss_prog": f"{d}/loss_prog"}

    def host(self, key: "Host | str | int") -> Host:
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
                "created": self.created, "switch_ns": self.switch_ns, "bridge": BRIDGE,
                "subnet": f"{SUBNET}/{PREFIXLEN}", "shaped_ports": self.shaped_ports,
                "loss_ports": self.loss_ports,
                "xdp_pass_ports": [h.port for h in self.hosts] if self.config.mode == "native" else [],
                "pins": self.pins, "state": "up" if self._is_up else "building",
                "owner_pid": self.owner_pid,
                "hosts": [h.to_dict() for h in self.hosts]}

    def __repr__(self) -> str:
        c = self.config
        return (f"Rig({c.name!r}, workers={c.workers}, rate={c.rate_bps}, buffer={c.buffer_bytes}, "
                f"loss={c.loss}, shape={c.shape}, mode={c.mode}, up={self._is_up})")

    # ---- lifecycle (the rest is RigBase's)
    _KIND = "rig"
    _UP_HINT = "ltp rig up"
    _CONFIG = RigConfig
    _state_path = staticmethod(state_path)
    _pin_dir = staticmethod(pin_dir)

    @staticmethod
    def _found_namespaces(name: str) -> list[str]:
        return _rig_namespaces().get(name, [])

    @staticmethod
    def _remove(name: str, namespaces: Sequence[str] = ()) -> None:
        _teardown(name, namespaces)

    @staticmethod
    def _exists_error(name: str) -> str:
        return (f"a rig named {name!r} exists already: use it (--name {name}), "
                f"pick another name, or `ltp rig down --name {name}`")

    @staticmethod
    def _incomplete_error(name: str, missing: list[str]) -> str:
        return (f"rig {name!r} is incomplete (missing namespaces: "
                f"{', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); "
                f"`ltp rig down --name {name}` removes what is left")

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
        from pyroute2 import IPRoute  # noqa: F401  (import errors surface early)
        cfg = self.config
        self.created = time.time()
        self._save()                     # first, so `down` finds a half-built rig
        for ns in self.namespaces:
            netns.create(ns)
            _disable_ipv6(ns)
        _switch_sysctls(self.switch_ns)
        with _ipr(self.switch_ns) as sw:
            sw.link("add", ifname=BRIDGE, kind="bridge", br_stp_state=0, br_forward_delay=0,
                    br_mcast_snooping=0)
            br = sw.link_lookup(ifname=BRIDGE)[0]
            for h in self.hosts:
                sw.link("add", ifname=h.port, kind="veth", mtu=cfg.mtu,
                        peer={"ifname": h.ifname, "net_ns_fd": h.netns, "address": h.mac,
                              "mtu": cfg.mtu})
                idx = sw.link_lookup(ifname=h.port)[0]
                sw.link("set", index=idx, master=br, state="up")
                # static FDB: frames to a host never flood, even before it talked
                sw.fdb("add", ifindex=idx, lladdr=h.mac, state=NUD_NOARP)
            sw.link("set", index=br, state="up")
            for h in self.hosts:
                self._host_up(h)
            ports = {h.port: sw.link_lookup(ifname=h.port)[0] for h in self.hosts}
            for port in self.shaped_ports:
                sw.tc("add", "tbf", index=ports[port], handle=0x10000,
                      rate=f"{cfg.rate_bps}bit", burst=cfg.burst, limit=cfg.buffer_bytes)
            self._load_loss([ports[p] for p in self.loss_ports], sw)
        if cfg.mode == "native":
            from ..xdp.loader import DataplaneError, attach_pass
            for h in self.hosts:
                try:
                    attach_pass(h.port, self.switch_ns, "native")
                except DataplaneError as e:
                    raise RigError(f"XDP_PASS on {h.port}: {e}") from e
        self._built()

    def has_broadcast(self) -> bool:
        """Does the PS's address carry the rig's broadcast address (rigs built
        before group sends existed do not: 198.18.0.255 is unicast there)?"""
        with _ipr(self.ps.netns) as ipr:
            return any(a.get_attr("IFA_BROADCAST") == BROADCAST
                       for a in ipr.get_addr(family=socket.AF_INET))

    def _host_up(self, h: Host) -> None:
        with _ipr(h.netns) as ipr:
            idx = ipr.link_lookup(ifname=h.ifname)[0]
            ipr.addr("add", index=idx, address=h.ip, prefixlen=h.prefixlen,
                     broadcast=BROADCAST)  # the PS's group sends (Endpoint.push group=)
            ipr.link("set", index=idx, state="up")
            # static neighbours: no ARP on the bottleneck, MACs known up front
            for other in self.hosts:
                if other is not h:
                    ipr.neigh("add", dst=other.ip, lladdr=other.mac, ifindex=idx,
                              state=NUD_PERMANENT)

    def _load_loss(self, ifindexes: list[int], sw) -> None:
        b, fn = _compile_loss_prog()
        try:
            pins = self.pins
            os.makedirs(pins["dir"], exist_ok=True)
            thr = ctypes.c_uint32(_loss_threshold(self.config.loss))
            _Libbpf.update(b[b"loss_cfg"].get_fd(), 0, thr)
            _Libbpf.pin(b[b"loss_cfg"].get_fd(), pins["loss_cfg"])
            _Libbpf.pin(b[b"loss_stats"].get_fd(), pins["loss_stats"])
            _Libbpf.pin(fn.fd, pins["loss_prog"])
            for idx in ifindexes:
                sw.tc("add", "clsact", index=idx)
                sw.tc("add-filter", "bpf", index=idx, handle=1, fd=fn.fd, name="loss_tc",
                      parent=TC_EGRESS, classid=1, direct_action=True)
        finally:
            b.cleanup()   # tc and the pins hold the program and maps from here on

    # ---- reconnecting
    @classmethod
    def attach(cls, name: str = DEFAULT_NAME) -> "Rig":
        """The existing rig `name`, from /run/ltp/rigs/<name>.json."""
        return super().attach(name)

    @classmethod
    def _read_state(cls, name: str) -> dict[str, Any]:
        try:
            return super()._read_state(name)
        except (OSError, ValueError) as e:
            raise RigError(f"cannot read {state_path(name)}: {e}") from e

    @staticmethod
    def names() -> list[str]:
        """Names of the rigs on this machine (state files and leftover namespaces)."""
        names = saved_names(STATE_DIR)
        names |= set(_rig_namespaces())
        with contextlib.suppress(FileNotFoundError):
            names |= {d for d in os.listdir(PIN_ROOT) if _NAME_RE.match(d)}
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
    def _argv(self, host: "Host | str | int", argv: Sequence[str]) -> list[str]:
        if isinstance(argv, str):
            raise TypeError("argv must be a list of strings, not one string")
        return ["ip", "netns", "exec", self.host(host).netns, *map(str, argv)]

    def exec(self, host: "Host | str | int", argv: Sequence[str], *, check: bool = False,
             capture: bool = True, timeout: float | None = None,
             input: str | None = None) -> subprocess.CompletedProcess:
        """Run argv in the host's namespace and wait (text output captured
        unless capture=False)."""
        return subprocess.run(self._argv(host, argv), check=check, timeout=timeout,
                              capture_output=capture, text=True, input=input)

    def spawn(self, host: "Host | str | int", argv: Sequence[str], **popen_kwargs: Any
              ) -> subprocess.Popen:
        """Start argv in the host's namespace (subprocess.Popen keywords pass through)."""
        return subprocess.Popen(self._argv(host, argv), **popen_kwargs)

    def socket(self, host: "Host | str | int", family: int = socket.AF_INET,
               type: int = socket.SOCK_DGRAM, proto: int = 0) -> socket.socket:
        """A socket created in the host's namespace (it stays there)."""
        with netns.inside(self.host(host).netns):
            return socket.socket(family, type, proto)

    # ---- loss injector
    def _fd(self, key: str) -> int:
        if key not in self._fds:
            try:
                self._fds[key] = _Libbpf.get(self.pins[key])
            except FileNotFoundError as e:
                raise RigError(f"rig {self.name}: loss injector map {self.pins[key]} is not "
                               f"pinned ({e.strerror}); is the rig up?") from None
        return self._fds[key]

    def set_loss(self, p: float) -> None:
        """Set the drop probability of IPv4 UDP/TCP packets, effective at once."""
        if not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise ValueError(f"loss: must be in [0, 1), got {p!r}")
        _Libbpf.update(self._fd("loss_cfg"), 0, ctypes.c_uint32(_loss_threshold(p)))
        if p != self.config.loss:
            self.config = RigConfig.from_dict({**asdict(self.config), "loss": float(p)})
            if os.path.exists(state_path(self.name)):
                self._save()

    def get_loss(self) -> float:
        """The drop probability the injector applies now (read from its map)."""
        v = ctypes.c_uint32()
        _Libbpf.lookup(self._fd("loss_cfg"), 0, v)
        return v.value / 2**32

    def loss_counters(self) -> dict[str, int]:
        """Packets (segments) the injector dropped and passed, and packets it
        does not judge ("other": ARP, ICMP, IPv6...), summed over CPUs."""
        ncpu = _Libbpf.ncpus()
        out = {}
        for i, key in enumerate(LOSS_STATS):
            vals = (ctypes.c_uint64 * ncpu)()
            _Libbpf.lookup(self._fd("loss_stats"), i, vals)
            out[key] = int(sum(vals))
        return out

    def reset_loss_counters(self) -> None:
        ncpu = _Libbpf.ncpus()
        for i in range(len(LOSS_STATS)):
            _Libbpf.update(self._fd("loss_stats"), i, (ctypes.c_uint64 * ncpu)())

    # ---- observation
    def bottleneck(self) -> list[dict[str, Any]]:
        """TBF settings and counters of each shaped port."""
        out = []
        with _ipr(self.switch_ns) as sw:
            for port in self.shaped_ports:
                idx = sw.link_lookup(ifname=port)
                q = None
                if idx:
                    q = next((q for q in sw.get_qdiscs(index=idx[0])
                              if q.get_attr("TCA_KIND") == "tbf"), None)
                entry: dict[str, Any] = {"port": port, "rate_bps": self.config.rate_bps,
                                         "buffer_bytes": self.config.buffer_bytes,
                                         "burst_bytes": self.config.burst, "present": q is not None}
                if q is not None:
                    st = q.get_attr("TCA_STATS") or {}
                    entry.update({k: int(st.get(k, 0)) for k in
                                  ("bytes", "packets", "overlimits", "backlog", "qlen")})
                    entry["drops"] = int(st.get("drop", 0))
                    parms = q.get_nested("TCA_OPTIONS", "TCA_TBF_PARMS") or {}
                    if parms:
                        entry["kernel_rate_bps"] = int(parms.get("rate", 0)) * 8
                        entry["kernel_limit_bytes"] = int(parms.get("limit", 0))
                out.append(entry)
        return out

    def link_stats(self, host: "Host | str | int") -> dict[str, int]:
        """rx/tx byte and packet counters of a host's veth."""
        h = self.host(host)
        with _ipr(h.netns) as ipr:
            link = ipr.get_links(ifname=h.ifname)[0]
        st = link.get_attr("IFLA_STATS64") or {}
        return {k: int(st.get(k, 0)) for k in
                ("rx_bytes", "rx_packets", "tx_bytes", "tx_packets", "rx_dropped", "tx_dropped")}

    def attachments(self) -> dict[str, Any]:
        """What is attached now: XDP programs and tc filters per switch port."""
        out: dict[str, Any] = {}
        with _ipr(self.switch_ns) as sw:
            for link in sw.get_links():
                name = link.get_attr("IFLA_IFNAME")
                if name in ("lo", BRIDGE):
                    continue
                xdp = link.get_attr("IFLA_XDP")
                prog = xdp.get_attr("IFLA_XDP_PROG_ID") if xdp else None
                filters = [f.get_attr("TCA_KIND") for f in
                           sw.get_filters(index=link["index"], parent=TC_EGRESS)
                           if f.get_attr("TCA_KIND")]
                out[name] = {"xdp_prog_id": prog, "egress_filters": filters}
        return out

    def status(self) -> dict[str, Any]:
        """Everything `ltp rig status` shows, as one dict."""
        d = self.to_dict()
        d["namespaces_present"] = all(netns.exists(ns) for ns in self.namespaces)
        try:
            d["bottleneck"] = self.bottleneck()
        except Exception as e:  # noqa: BLE001 - report, do not fail status
            d["bottleneck"] = {"error": str(e)}
        try:
            c = self.loss_counters()
            judged = c["dropped"] + c["passed"]
            d["loss_injector"] = {"loss": self.get_loss(), "ports": self.loss_ports, **c,
                                  "measured": c["dropped"] / judged if judged else None}
        except RigError as e:
            d["loss_injector"] = {"error": str(e)}
        return d


# --------------------------------------------------------------------------- helpers

def _sysctl(ns: str, items: dict[str, str], missing_ok: bool = False) -> None:
    """Set sysctls ("net.ipv4.ip_forward": "1") inside namespace `ns`;
    missing_ok: skip keys this kernel (or its loaded modules) does not have."""
    with netns.inside(ns):
        for key, val in items.items():
            try:
                with open("/proc/sys/" + key.replace(".", "/"), "w") as f:
                    f.write(val)
            except OSError:
                if not missing_ok:
                    raise


def _disable_ipv6(ns: str) -> None:
    """No IPv6 in the rig: no router solicitations, DAD or MLD noise."""
    _sysctl(ns, {f"net.ipv6.conf.{k}.disable_ipv6": "1" for k in ("all", "default")},
            missing_ok=True)


def _switch_sysctls(ns: str) -> None:
    """A switch forwards frames; it does not run the host's firewall. Where
    br_netfilter is loaded (container runtimes load it), every bridged frame
    would otherwise go through iptables hooks, a CPU cost per packet that a
    hardware switch does not have."""
    _sysctl(ns, {f"net.bridge.bridge-nf-call-{k}": "0"
                 for k in ("iptables", "ip6tables", "arptables")}, missing_ok=True)


def _rig_namespaces() -> dict[str, list[str]]:
    """Namespaces that look like a rig's, grouped by rig name; a group counts
    only if it has the switch namespace or a state file (other tools may use
    names like ltp-x-ps too)."""
    groups: dict[str, list[str]] = {}
    for ns in netns.listnetns():
        m = _NS_RE.match(ns)
        if m:
            groups.setdefault(m.group(1), []).append(ns)
    return {n: v for n, v in groups.items()
            if switch_ns(n) in v or os.path.exists(state_path(n))}


def _teardown(name: str, known_ns: Sequence[str] = ()) -> None:
    """Remove everything rig `name` may have: links in its switch namespace
    (deleting a veth end deletes its peer, the qdiscs, tc filters and XDP
    programs on both), its namespaces, pins and state file. Goes on past
    errors and raises one RigError listing them at the end."""
    errors: list[str] = []
    sw = switch_ns(name)
    if netns.exists(sw):
        try:
            with _ipr(sw) as ipr:
                for link in ipr.get_links():
                    if link.get_attr("IFLA_IFNAME") != "lo":
                        with contextlib.suppress(Exception):
                            ipr.link("del", index=link["index"])
        except Exception as e:  # noqa: BLE001
            errors.append(f"links in {sw}: {e}")
    spaces = set(known_ns) | set(_rig_namespaces().get(name, []))
    if sw in known_ns or os.path.exists(state_path(name)):
        spaces |= {ns for ns in netns.listnetns()
                   if (m := _NS_RE.match(ns)) and m.group(1) == name}
    errors += remove_all(sorted(spaces, key=lambda s: s != sw), pin_dir(name), state_path(name))
    if errors:
        raise RigError(f"tearing down rig {name!r}: " + "; ".join(errors))


def remove_all(namespaces: list[str], pins: str, state: str) -> list[str]:
    """Remove namespaces (their veths, qdiscs, tc and XDP programs go with
    them), every pin in the folder `pins`, and the state file; go on past
    errors and return them."""
    errors: list[str] = []
    for ns in namespaces:
        try:
            netns.remove(ns)
        except Exception as e:  # noqa: BLE001
            errors.append(f"namespace {ns}: {e}")
    if os.path.isdir(pins):
        for f in os.listdir(pins):
            try:
                os.unlink(os.path.join(pins, f))
            except OSError as e:
                errors.append(f"unpin {pins}/{f}: {e}")
        with contextlib.suppress(OSError):
            os.rmdir(pins)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(state)
    return errors


# --------------------------------------------------------------------------- rate check

_BLAST = r"""
import socket, sys, time
dst, port, size, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
buf = b"\x00" * size
addr = (dst, port)
end = time.monotonic() + secs
n = err = 0
send = s.sendto
while True:
    for _ in range(256):
        try:
            send(buf, addr)
            n += 1
        except OSError:
            err += 1
    if time.monotonic() >= end:
        break
print(n, err)
"""


def udp_blast(rig: Rig, senders: Sequence["Host | str | int"], dst: "Host | str | int",
              seconds: float, payload: int = 1472, port: int = 9) -> list[subprocess.Popen]:
    """Start one Python UDP sender per host in `senders`, each sending
    `payload`-byte datagrams to `dst` as fast as it can for `seconds`.
    Each process prints how many datagrams it sent and how many sends failed."""
    d = rig.host(dst)
    return [rig.spawn(s, [sys.executable, "-c", _BLAST, d.ip, str(port), str(payload),
                          str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      text=True) for s in senders]


def measure_rate(rig: Rig, seconds: float = 2.0, senders: int = 4, payload: int = 1472,
                 warmup: float = 0.4) -> dict[str, Any]:
    """Blast UDP from up to `senders` workers to the PS for `seconds`; the
    achieved bottleneck rate is the PS veth's received bytes (Ethernet frames,
    as TBF counts them) over a window that skips `warmup` at the start; the
    measured drop fraction comes from the loss injector's counters."""
    port = 9
    sink = rig.socket(rig.ps, socket.AF_INET, socket.SOCK_DGRAM)  # bound, never read: no ICMP
    procs: list[subprocess.Popen] = []
    try:
        sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sink.bind((rig.ps.ip, port))
        c0 = rig.loss_counters()
        q0 = rig.bottleneck()[0]
        procs = udp_blast(rig, rig.workers[:max(1, senders)], rig.ps, seconds, payload, port)
        time.sleep(warmup)
        s0, t0 = rig.link_stats(rig.ps), time.monotonic()
        time.sleep(max(0.2, seconds - warmup - 0.2))
        s1, t1 = rig.link_stats(rig.ps), time.monotonic()
        sent = send_errors = 0
        for p in procs:
            out, err = p.communicate(timeout=seconds + 10)
            if p.returncode != 0:
                raise RigError(f"UDP sender failed: {err.strip()[-300:]}")
            n, e = (int(x) for x in out.split())
            sent, send_errors = sent + n, send_errors + e
        c1 = rig.loss_counters()
        q1 = rig.bottleneck()[0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        sink.close()
    dropped = c1["dropped"] - c0["dropped"]
    passed = c1["passed"] - c0["passed"]
    rx = s1["rx_bytes"] - s0["rx_bytes"]
    rate = rx * 8 / (t1 - t0)
    return {"rate_requested_bps": rig.config.rate_bps, "rate_measured_bps": rate,
            "rate_ratio": rate / rig.config.rate_bps,
            "loss_requested": rig.get_loss(),
            "loss_measured": dropped / (dropped + passed) if dropped + passed else 0.0,
            "window_s": t1 - t0, "senders": len(procs), "datagrams_sent": sent,
            "send_errors": send_errors,
            "injector_dropped": dropped, "injector_passed": passed,
            "tbf_drops": q1.get("drops", 0) - q0.get("drops", 0),
            "payload_bytes": payload}
