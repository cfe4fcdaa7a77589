# SPDX-License-Identifier: Apache-2.0
"""An endpoint's UDP socket and its device's MAC: what it sends with, made
inside its namespace (endpoint.py)."""
from __future__ import annotations

import fcntl
import logging
import socket
import struct

from ...dataplane import netns
from ...errors import TransportError

log = logging.getLogger("ltpx.transport")
SIOCGIFHWADDR = 0x8927   # linux/sockios.h: a device's hardware address


def device_mac(sock: socket.socket, dev: str) -> str:
    """The MAC of `dev` in the namespace `sock` was created in (SIOCGIFHWADDR)."""
    info = fcntl.ioctl(sock.fileno(), SIOCGIFHWADDR, struct.pack("256s", dev.encode()[:15]))
    return info[18:24].hex(":")


def udp_socket(ip: str, ns: str | None, port: int, strict: bool) -> socket.socket:
    """The endpoint's socket, made inside its namespace, bound to its address
    and its LTP port: every frame it sends then comes from that port, so a
    peer's program ACKs it back to this endpoint's program (which, on a
    shared device, is found by that port). Where the port is taken
    (another process bound it without SO_REUSEADDR) a port of the kernel's
    choosing, unless `strict` (a shared endpoint: TransportError)."""
    with netns.inside(ns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((ip, port))
        except OSError as e:
            if strict:
                raise TransportError(f"UDP port {port} on {ip} is taken ({e.strerror}): a "
                                     "rank sharing a device needs a port of its own") from None
            log.warning("UDP port %d on %s is taken (%s): this endpoint sends from a port "
                        "of the kernel's choosing, which the ACKs of a peer on another LTP "
                        "port (a rank sharing a device) cannot reach", port, ip, e.strerror)
            sock.bind((ip, 0))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
        # Group sends: to a broadcast address, or to a multicast group out
        # of this host's device (no multicast route needed), one hop.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(ip))
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
    except BaseException:
        sock.close()
        raise
    return sock
