# SPDX-License-Identifier: Apache-2.0
"""What the kernel says about a loaded ltp_xdp program: the ids, names and
sizes of its objects (opened by pin or by kernel id), the XDP program a
device carries now, and the BPF link that holds it there.

The maps' sizes tell slots, chunks, chunk size and banks, so
`geometry_from_fds` rebuilds the geometry a program was compiled with even
when its record is gone.
"""
from __future__ import annotations

import contextlib
import os
import struct
from typing import Any
from collections.abc import Iterator

from .. import clib, netns
from ...errors import RegistryError
from .maps import MAP_NAMES, Geometry
from .wire import PORT

# pyroute2's names for IFLA_XDP_ATTACHED, and our mode names
_XDP_ATTACHED = {"xdp": "native", "xdpgeneric": "skb", "xdpoffload": "hw", "xdpmulti": "multi",
                 1: "native", 2: "skb", 3: "hw", 4: "multi"}


def _info(fd: int) -> bytes:
    try:
        return clib.obj_info(fd)
    except OSError as e:
        raise RegistryError(f"reading BPF object info: {e.strerror}") from e


def _name(raw: bytes, offset: int) -> str:
    """A BPF_OBJ_NAME_LEN (16-byte, NUL-padded) name inside an info struct."""
    return raw[offset:offset + 16].split(b"\0", 1)[0].decode(errors="replace")


def prog_id(fd: int) -> int:
    """Kernel id of the program `fd` (struct bpf_prog_info.id)."""
    return struct.unpack_from("<II", _info(fd))[1]


def prog_name(pid: int) -> str | None:
    """The name of the loaded program with kernel id `pid` (bpf_prog_info.name,
    offset 64: bcc names a program after its function), None if it is gone."""
    try:
        fd = clib.prog_fd_by_id(pid)
    except OSError:
        return None
    try:
        return _name(_info(fd), 64)
    finally:
        os.close(fd)


def map_info(fd: int) -> dict[str, Any]:
    """type, id, key_size, value_size, max_entries, flags and name of the map `fd`."""
    raw = _info(fd)
    keys = ("type", "id", "key_size", "value_size", "max_entries", "flags")
    return {**dict(zip(keys, struct.unpack_from("<6I", raw))), "name": _name(raw, 24)}


def link_info(fd: int) -> dict[str, int]:
    """type, id, prog_id of the link `fd`, and for an XDP link its ifindex
    (struct bpf_link_info: the union starts at offset 16)."""
    raw = _info(fd)
    kind, lid, pid = struct.unpack_from("<3I", raw)
    return {"type": kind, "id": lid, "prog_id": pid,
            "ifindex": struct.unpack_from("<I", raw, 16)[0] if kind == clib.BPF_LINK_TYPE_XDP
            else 0}


def xdp_link(prog: int, ifindex: int) -> int | None:
    """Id of the XDP link that holds program `prog` on device `ifindex`, None
    when the program was attached without one (netlink). An XDP link's info
    has no namespace, so the program id and ifindex together pick it."""
    for lid in clib.link_ids():
        try:
            fd = clib.link_fd_by_id(lid)
        except OSError:
            continue                    # gone meanwhile
        try:
            info = link_info(fd)
        finally:
            os.close(fd)
        if info["type"] == clib.BPF_LINK_TYPE_XDP and info["prog_id"] == prog \
                and info["ifindex"] == ifindex:
            return lid
    return None


def open_map_ids(map_ids: dict[str, int]) -> dict[str, int]:
    """fds of the maps a record names by kernel id, checked by name so a
    recycled id is never taken for ours. RegistryError names the first one
    that is gone; no fd stays open on failure."""
    fds: dict[str, int] = {}
    try:
        for name in MAP_NAMES:
            mid = map_ids.get(name)
            if not mid:
                raise RegistryError(f"map {name} has no id in the record")
            try:
                fds[name] = fd = clib.map_fd_by_id(mid)
            except OSError:
                raise RegistryError(f"map {name} (id {mid}) is gone") from None
            if map_info(fd)["name"] != name[:15]:
                raise RegistryError(f"map id {mid} is no longer {name}")
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return fds


@contextlib.contextmanager
def _pinned(path: str) -> Iterator[int]:
    fd = clib.obj_get(path)
    try:
        yield fd
    finally:
        os.close(fd)


def pinned_prog_id(directory: str) -> int | None:
    try:
        with _pinned(os.path.join(directory, "prog")) as fd:
            return prog_id(fd)
    except (FileNotFoundError, RegistryError):
        return None


def pinned_maps(directory: str) -> list[str]:
    """Names in MAP_NAMES that are pinned in `directory`."""
    return [n for n in MAP_NAMES if os.path.exists(os.path.join(directory, n))]


def geometry_from_pins(directory: str, port: int = PORT) -> Geometry:
    """The geometry the pinned maps were compiled with (the port is not in any
    map size, so it comes from the caller)."""
    try:
        with _pinned(os.path.join(directory, "ltp_stats")) as st, \
                _pinned(os.path.join(directory, "ltp_banks")) as bk, \
                _pinned(os.path.join(directory, "ltp_mem")) as mem:
            return geometry_from_fds({"ltp_stats": st, "ltp_banks": bk, "ltp_mem": mem}, port)
    except FileNotFoundError as e:
        raise RegistryError(f"{directory}: maps are not pinned ({e.strerror}); "
                            "`ltp status` shows what is loaded") from None


def geometry_from_fds(fds: dict[str, int], port: int = PORT) -> Geometry:
    """The geometry of a program's maps (by fd: ltp_stats, ltp_banks, ltp_mem)."""
    slots = map_info(fds["ltp_stats"])["max_entries"]
    banks = map_info(fds["ltp_banks"])["max_entries"]
    mem = map_info(fds["ltp_mem"])
    return Geometry(slots=slots, max_chunks=mem["max_entries"] // (banks * slots),
                    chunk_bytes=mem["value_size"], banks=banks, port=port)


def xdp_on(dev: str, ns: str | None) -> dict[str, Any] | None:
    """{"prog_id", "mode"} of the XDP program on `dev` in `ns`, None if there
    is none. Raises RegistryError when the namespace or device is missing."""
    return attachment(dev, ns)[1]


# Device kinds whose frames come from sockets on this host: the kernel leaves
# a UDP checksum unfinished for offload there (CHECKSUM_PARTIAL), so a frame
# reaches XDP with only the pseudo-header's sum in its checksum field.
LOCAL_KINDS = frozenset({"veth", "netkit", "macvlan", "macvtap", "ipvlan", "ipvtap", "bridge"})
_IFF_LOOPBACK = 0x8


def csum_complete(dev: str, ns: str | None) -> bool:
    """Whether frames reaching `dev` in `ns` carry whole UDP checksums, so
    the XDP program can verify them: yes for a NIC (the sending host's NIC
    or stack finished each sum) and devices stacked on NICs (a VLAN, a
    bond); no for loopback and LOCAL_KINDS, whose frames come from local
    sockets with the sum left to offload. RegistryError as `attachment`."""
    link = _link(dev, ns)[1]
    if link["flags"] & _IFF_LOOPBACK:
        return False
    info = link.get_attr("IFLA_LINKINFO")
    kind = info.get_attr("IFLA_INFO_KIND") if info else None
    return kind not in LOCAL_KINDS


def mtu(dev: str, ns: str | None) -> int | None:
    """`dev`'s MTU in `ns`; None where it cannot be read (a veth refuses
    native XDP by its peer's MTU, which the rigs keep equal to its own)."""
    from pyroute2.netlink.exceptions import NetlinkError  # noqa: PLC0415 (as _link's)
    try:
        return int(_link(dev, ns)[1].get_attr("IFLA_MTU"))
    except (RegistryError, OSError, TypeError, NetlinkError):
        return None


def _link(dev: str, ns: str | None):
    """(ifindex, pyroute2's link message) of `dev` in `ns`; RegistryError
    naming what is missing."""
    from pyroute2 import IPRoute  # noqa: PLC0415 (0.15 s to import; only what touches links)
    if ns and not netns.exists(ns):
        raise RegistryError(f"no network namespace {ns!r} (`ip netns list` shows them)")
    with netns.inside(ns):
        ipr = IPRoute()
    try:
        idx = ipr.link_lookup(ifname=dev)
        if not idx:
            raise RegistryError(f"no device {dev!r} in "
                                f"{'the host namespace' if not ns else 'namespace ' + ns} (`"
                                + (f"ip netns exec {ns} " if ns else "")
                                + "ip -br link` lists them)")
        link = ipr.get_links(idx[0])[0]
    finally:
        ipr.close()
    return idx[0], link


def attachment(dev: str, ns: str | None) -> tuple[int, dict[str, Any] | None]:
    """(ifindex of `dev` in `ns`, what `xdp_on` says of it)."""
    ifindex, link = _link(dev, ns)
    xdp = link.get_attr("IFLA_XDP")
    pid = xdp.get_attr("IFLA_XDP_PROG_ID") if xdp else None
    if not pid:
        return ifindex, None
    return ifindex, {"prog_id": int(pid),
                    "mode": _XDP_ATTACHED.get(xdp.get_attr("IFLA_XDP_ATTACHED"), "?")}


def describe(att: dict[str, Any]) -> str:
    """An attached program as an error names it: id, name and mode."""
    name = prog_name(att["prog_id"])
    return f"XDP program id {att['prog_id']}" + (f" {name!r}" if name else "") + \
        f" ({att['mode']})"
