# SPDX-License-Identifier: Apache-2.0
"""The leaf-spine rig's BPF programs (bpf/path_pin.c) and their maps.

`link_count` on egress of every leaf uplink and spine downlink counts bytes
and packets per (link, 5-tuple) in `link_bytes`; `path_pin` on egress of
every host veth rewrites the UDP source port of a pinned flow (map
`path_pins`: (saddr, daddr, dport) -> sport), which steers the leaf's ECMP
hash onto the chosen spine. The ctypes structs mirror the C ones; addresses
and ports in them are in network order (`be32`, `be16`)."""
from __future__ import annotations

import ctypes
import socket
from collections.abc import Iterable
from typing import Any

from . import netlink, tcprogs
from .leafspine_plan import KIND_LEAF_UP, KIND_SPINE_DN, link_label
from ...errors import RigError

PINS = ("link_bytes", "path_pins", "link_prog", "pin_prog")  # file names in the pin folder


class LinkKey(ctypes.Structure):      # must match struct link_key in bpf/path_pin.c
    _fields_ = [("kind", ctypes.c_uint8), ("a", ctypes.c_uint8), ("b", ctypes.c_uint8),
                ("proto", ctypes.c_uint8), ("saddr", ctypes.c_uint32),   # network order
                ("daddr", ctypes.c_uint32), ("sport", ctypes.c_uint16),  # network order
                ("dport", ctypes.c_uint16)]


class LinkVal(ctypes.Structure):      # struct link_val
    _fields_ = [("bytes", ctypes.c_uint64), ("packets", ctypes.c_uint64)]


class PinKey(ctypes.Structure):       # struct pin_key
    _fields_ = [("saddr", ctypes.c_uint32), ("daddr", ctypes.c_uint32),
                ("dport", ctypes.c_uint16), ("pad", ctypes.c_uint16)]


class PinVal(ctypes.Structure):       # struct pin_val
    _fields_ = [("sport", ctypes.c_uint16), ("spine", ctypes.c_uint16),
                ("pad", ctypes.c_uint32), ("packets", ctypes.c_uint64)]


def be32(ip: str) -> int:
    """An IPv4 address as the u32 whose bytes in memory are in network order."""
    return int.from_bytes(socket.inet_aton(ip), "little")


def ip_of(be: int) -> str:
    """The inverse of be32."""
    return socket.inet_ntoa(be.to_bytes(4, "little"))


def be16(port: int) -> int:
    return socket.htons(port)


# --------------------------------------------------------------------------- loading

def load(pin_dir: str, links: Iterable[tuple[str, str]], hosts: Iterable[tuple[str, str]]
         ) -> None:
    """Compile path_pin.c, pin both maps and programs in `pin_dir`, attach
    link_count on each (namespace, device) of `links` and path_pin on each
    of `hosts`."""
    b, count_fn = tcprogs.compile_tc("path_pin.c", "link_count")
    try:
        try:
            pin_fn = b.load_func(b"path_pin", b.SCHED_CLS)
        except Exception as e:  # noqa: BLE001 - bcc raises a bare Exception
            raise RigError(f"loading path_pin (bpf/path_pin.c) failed: {e}") from e
        tcprogs.pin_all(pin_dir, dict(zip(PINS, (b[b"link_bytes"].get_fd(),
                                             b[b"path_pins"].get_fd(), count_fn.fd, pin_fn.fd))))
        for ports, fn, name in ((links, count_fn, "link_count"), (hosts, pin_fn, "path_pin")):
            for ns, dev in ports:
                with netlink.iproute(ns) as ipr:
                    netlink.attach_tc_egress(ipr, ipr.link_lookup(ifname=dev)[0], fn.fd, name)
    finally:
        b.cleanup()   # tc and the pins hold the programs and maps from here on


# --------------------------------------------------------------------------- the maps

def link_counters(fd: int) -> list[dict[str, Any]]:
    """Every (link, 5-tuple) in map link_bytes: link label, flow, bytes,
    packets, sorted by link and flow."""
    out = []
    for k, v in tcprogs.items(fd, LinkKey, LinkVal):
        kind = "L" if k.kind == KIND_LEAF_UP else "S" if k.kind == KIND_SPINE_DN else "?"
        out.append({"link": link_label(kind, k.a, k.b),
                    "kind": kind, "leaf": k.a if kind == "L" else k.b,
                    "spine": k.b if kind == "L" else k.a, "proto": k.proto,
                    "saddr": ip_of(k.saddr), "daddr": ip_of(k.daddr),
                    "sport": socket.ntohs(k.sport), "dport": socket.ntohs(k.dport),
                    "bytes": int(v.bytes), "packets": int(v.packets)})
    return sorted(out, key=lambda e: (e["link"], e["saddr"], e["daddr"], e["sport"]))


def clear_link_counters(fd: int) -> None:
    tcprogs.clear(fd, LinkKey, LinkVal)


def read_pins(fd: int) -> list[dict[str, Any]]:
    """Every pin in map path_pins, sorted by flow."""
    return sorted(({"saddr": ip_of(k.saddr), "daddr": ip_of(k.daddr),
                    "dport": socket.ntohs(k.dport), "sport": socket.ntohs(v.sport),
                    "spine": int(v.spine), "packets": int(v.packets)}
                   for k, v in tcprogs.items(fd, PinKey, PinVal)),
                  key=lambda e: (e["saddr"], e["daddr"], e["dport"]))


def set_pin(fd: int, saddr: str, daddr: str, dport: int, sport: int, spine: int) -> None:
    """UDP saddr -> daddr:dport leaves its host with source port `sport`
    (`spine`: the spine that port hashes to, for the record; 0xFFFF when no
    spine was chosen, as in control.pathplan.ecmp_draw)."""
    tcprogs.update(fd, PinKey(be32(saddr), be32(daddr), be16(dport), 0),
               PinVal(be16(sport), spine, 0, 0))


def clear_pins(fd: int) -> None:
    tcprogs.clear(fd, PinKey, PinVal)
