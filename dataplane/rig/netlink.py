# SPDX-License-Identifier: Apache-2.0
"""The rigs' netlink plumbing (pyroute2): an IPRoute inside a namespace,
sysctls, bridges, veths, addresses, static neighbours, TBF, and tc programs
on egress. Both rigs build from these pieces; nothing here knows a rig's
layout."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from .. import netns
from ...errors import RigError

TC_EGRESS = 0xFFFFFFF3    # clsact egress hook (ffff:fff3)
TC_INGRESS = 0xFFFFFFF2   # clsact ingress hook (ffff:fff2)
ETH_P_ALL, ETH_P_IP = 0x0003, 0x0800
PRIO_LOCAL = 1            # a shared link's filters: a node's own frames first (left alone) ...
PRIO_LINK = 0xC001        # ... its redirect after the loss injector (auto prio 0xC000)
NUD_NOARP = 0x40
NUD_PERMANENT = 0x80
TBF_HANDLE = 0x10000      # 1:


@contextlib.contextmanager
def iproute(ns: str) -> Iterator[Any]:
    """An IPRoute whose netlink socket lives in namespace `ns`. Made with
    setns on this thread (netns.inside), not IPRoute(netns=...), which forks
    a helper per call and creates the namespace when it is missing."""
    from pyroute2 import IPRoute  # noqa: PLC0415 (0.15 s to import; only what touches links)
    with netns.inside(ns):
        ipr = IPRoute()
    try:
        yield ipr
    finally:
        ipr.close()


def sysctl(ns: str, items: dict[str, str], missing_ok: bool = False) -> None:
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


def disable_ipv6(ns: str) -> None:
    """No IPv6 in a rig: no router solicitations, DAD or MLD noise."""
    sysctl(ns, {f"net.ipv6.conf.{k}.disable_ipv6": "1" for k in ("all", "default")},
           missing_ok=True)


# --------------------------------------------------------------------------- links

def add_bridge(ipr, name: str, address: str | None = None) -> int:
    """A bridge that forwards at once (no STP, no forwarding delay) and floods
    multicast like a plain switch (no snooping); returns its ifindex (down)."""
    extra = {"address": address} if address else {}
    ipr.link("add", ifname=name, kind="bridge", br_stp_state=0, br_forward_delay=0,
             br_mcast_snooping=0, **extra)
    return ipr.link_lookup(ifname=name)[0]


def add_veth(ipr, ifname: str, *, mtu: int, peer: str, peer_ns: str, peer_mac: str,
             mac: str | None = None) -> int:
    """A veth pair: `ifname` stays here, `peer` goes straight into namespace
    `peer_ns` (so it never appears in this one); returns the ifindex of `ifname`."""
    extra = {"address": mac} if mac else {}
    ipr.link("add", ifname=ifname, kind="veth", mtu=mtu, **extra,
             peer={"ifname": peer, "net_ns_fd": peer_ns, "address": peer_mac, "mtu": mtu})
    return ipr.link_lookup(ifname=ifname)[0]


def no_udp_gso(ns: str, ifname: str) -> None:
    """Turn off UDP segmentation offload on `ifname`: a UDP GSO batch leaving
    through it is cut into its datagrams here, as a NIC would before the
    wire. Switch ports facing hosts need it: a veth otherwise hands the whole
    batch to the host, whose generic-mode (skb) XDP program sees one
    oversized frame. (With a native-mode program the kernel already clears
    the feature on the peer.) TCP segmentation offload stays on."""
    _features_off(ns, ifname, "tx-udp-segmentation")


def whole_checksums(ns: str, ifname: str) -> None:
    """Turn off checksum offload on `ifname`: a frame leaving through it
    with its UDP sum unfinished (a socket's, left to offload) gets the whole
    sum here, as a NIC writes it before the wire. On a switch port facing a
    host, the host's XDP program then sees frames as a real NIC hands them
    over, whose checksums it can verify (Endpoint(verify_csum=True))."""
    _features_off(ns, ifname, "tx-checksum-ip-generic")


def _features_off(ns: str, ifname: str, *names: str) -> None:
    from pyroute2.ethtool import Ethtool  # noqa: PLC0415 (0.15 s to import; only what touches links)
    with netns.inside(ns):
        et = Ethtool()
        try:
            feats = et.get_features(ifname)
            for name in names:
                feats.features[name].enable = False
            et.set_features(ifname, feats)
        finally:
            et.close()


def address_up(ipr, ifname: str, ip: str, prefixlen: int, **addr: Any) -> int:
    """Give `ifname` the address ip/prefixlen (extra keywords go to the
    address, e.g. broadcast=), bring it up; returns its ifindex."""
    idx = ipr.link_lookup(ifname=ifname)[0]
    ipr.addr("add", index=idx, address=ip, prefixlen=prefixlen, **addr)
    ipr.link("set", index=idx, state="up")
    return idx


def static_neighbour(ipr, index: int, ip: str, mac: str) -> None:
    """A permanent neighbour entry: no ARP round on a shaped link, and MACs
    known before the first packet."""
    ipr.neigh("add", dst=ip, lladdr=mac, ifindex=index, state=NUD_PERMANENT)


# --------------------------------------------------------------------------- tc

def add_tbf(ipr, index: int, cfg: Any) -> None:
    """TBF on egress of `index` with cfg.rate_bps, cfg.burst, cfg.buffer_bytes
    (a rig config: base.ShapedConfig)."""
    ipr.tc("add", "tbf", index=index, handle=TBF_HANDLE, rate=f"{cfg.rate_bps}bit",
           burst=cfg.burst, limit=cfg.buffer_bytes)


def tbf_stats(ipr, index: int) -> dict[str, int] | None:
    """Counters of the TBF on `index` (bytes, packets, overlimits, backlog,
    qlen, drops; the kernel's rate and limit when it reports them), or None
    when there is no TBF."""
    q = next((q for q in ipr.get_qdiscs(index=index) if q.get_attr("TCA_KIND") == "tbf"), None)
    if q is None:
        return None
    st = q.get_attr("TCA_STATS") or {}
    out = {k: int(st.get(k, 0)) for k in ("bytes", "packets", "overlimits", "backlog", "qlen")}
    out["drops"] = int(st.get("drop", 0))
    parms = q.get_nested("TCA_OPTIONS", "TCA_TBF_PARMS") or {}
    if parms:
        out["kernel_rate_bps"] = int(parms.get("rate", 0)) * 8
        out["kernel_limit_bytes"] = int(parms.get("limit", 0))
    return out


def attach_tc_egress(ipr, index: int, fd: int, name: str) -> None:
    """The SCHED_CLS program `fd` on egress of `index` (clsact + cls_bpf,
    direct action: the program's return value is the verdict)."""
    ipr.tc("add", "clsact", index=index)
    ipr.tc("add-filter", "bpf", index=index, handle=1, fd=fd, name=name,
           parent=TC_EGRESS, classid=1, direct_action=True)


def add_ifb(ipr, name: str, cfg: Any) -> int:
    """An IFB device `name`, up, with TBF at cfg's rate: a shared link (what
    several ports' frames are redirected through, `redirect_through`)."""
    try:
        ipr.link("add", ifname=name, kind="ifb", mtu=cfg.mtu)
    except Exception as e:    # pyroute2's NetlinkError: no IFB in this kernel (CONFIG_IFB)
        raise RigError(f"cannot make IFB device {name} for a node's shared link ({e}); a rig "
                       "with nodes needs the kernel's ifb driver (CONFIG_IFB, `modprobe ifb`)"
                       ) from None
    idx = ipr.link_lookup(ifname=name)[0]
    ipr.link("set", index=idx, state="up")
    add_tbf(ipr, idx, cfg)
    return idx


def redirect_through(ipr, index: int, down: int, up: int, local_ips: list[str]) -> None:
    """Port `index`'s frames through a shared link: what leaves it (to its
    host) through IFB `down`, what comes in from its host through IFB `up`,
    except frames from (egress) or to (ingress) an address in `local_ips`,
    which stay on the node. The egress redirect runs after the loss
    injector's filter (which goes on to the next filter for a frame it keeps:
    bpf/loss_tc.c)."""
    with contextlib.suppress(Exception):    # the loss injector may have added it
        ipr.tc("add", "clsact", index=index)
    for parent, field, ifb in ((TC_EGRESS, 12, down), (TC_INGRESS, 16, up)):
        for ip in local_ips:   # u32 keys: value/mask+offset into the IP header (src 12, dst 16)
            hexip = "0x" + "".join(f"{int(o):02x}" for o in ip.split("."))
            ipr.tc("add-filter", "u32", index=index, parent=parent, protocol=ETH_P_IP,
                   prio=PRIO_LOCAL, target=0x10001, keys=[f"{hexip}/0xffffffff+{field}"])
        ipr.tc("add-filter", "u32", index=index, parent=parent, protocol=ETH_P_ALL,
               prio=PRIO_LINK, target=0x10001, keys=["0x0/0x0+0"],
               action={"kind": "mirred", "direction": "egress", "action": "redirect",
                       "ifindex": ifb})


def no_broadcast(ipr, index: int) -> None:
    """The bridge floods no broadcast out of port `index`: its host is in no
    group (the servers' group answers are the rig's broadcasts), as a switch
    that snoops multicast sends a group's frames only to its members' ports.
    Neighbours are static on the rig, so no ARP needs it."""
    ipr.brport("set", index=index, bcast_flood=0)


def egress_filters(ipr, index: int) -> list[str]:
    """Kinds of the tc filters on egress of `index` ("bpf", ...)."""
    return [f.get_attr("TCA_KIND") for f in ipr.get_filters(index=index, parent=TC_EGRESS)
            if f.get_attr("TCA_KIND")]
