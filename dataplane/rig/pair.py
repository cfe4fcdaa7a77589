# SPDX-License-Identifier: Apache-2.0
"""The smallest rig: two namespaces joined by one veth pair.

Used by `ltp demo`, `ltp bench xdp` and the namespace tests. Addresses come
from 198.18.0.0/15 and neither namespace has a route out. Everything this
creates is removed on exit, also when the body raises.
"""
from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass

from .. import netns
from .netlink import iproute
from ..xdp.loader import detach
from ..xdp.loader import attach_fd
from ..xdp.loader import attach_pass


@dataclass
class End:
    ns: str
    dev: str
    ip: str
    mac: str = ""


class VethPair:
    """Namespaces `<prefix>-a` and `<prefix>-b`, veth `a0` <-> `b0`.

    >>> with VethPair("ltp-demo") as pair:                   # doctest: +SKIP
    ...     sock = pair.udp_socket(pair.a)
    """

    def __init__(self, prefix: str | None = None, mtu: int = 1500):
        self.prefix = prefix or f"ltp-p{os.getpid()}"
        self.a = End(f"{self.prefix}-a", "a0", "198.18.250.1")
        self.b = End(f"{self.prefix}-b", "b0", "198.18.250.2")
        self.mtu = mtu
        self._attached: list[tuple[str, str, str]] = []

    def __enter__(self) -> VethPair:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> None:
        for end in (self.a, self.b):
            netns.remove(end.ns)
            netns.create(end.ns)
        with iproute(self.a.ns) as ipr:
            ipr.link("add", ifname=self.a.dev, kind="veth",
                     peer={"ifname": self.b.dev, "net_ns_fd": self.b.ns})
        for end in (self.a, self.b):
            with iproute(end.ns) as ipr:
                idx = ipr.link_lookup(ifname=end.dev)[0]
                ipr.link("set", index=idx, mtu=self.mtu)
                ipr.addr("add", index=idx, address=end.ip, prefixlen=24)
                ipr.link("set", index=idx, state="up")
                end.mac = ipr.get_links(idx)[0].get_attr("IFLA_ADDRESS")
        # Static neighbours: no ARP round before the first packet.
        for here, there in ((self.a, self.b), (self.b, self.a)):
            with iproute(here.ns) as ipr:
                idx = ipr.link_lookup(ifname=here.dev)[0]
                ipr.neigh("replace", dst=there.ip, lladdr=there.mac, ifindex=idx,
                          state="permanent")

    def down(self) -> None:
        for dev, ns, mode in self._attached:
            with contextlib.suppress(Exception):   # the namespace removal below detaches too
                detach(dev, ns, mode)
        self._attached = []
        for end in (self.a, self.b):
            netns.remove(end.ns)

    def attach(self, dataplane_or_fd, end: End, mode: str = "native") -> None:
        """Attach an XDP program (Dataplane or prog fd) on `end`'s device."""
        fd = dataplane_or_fd if isinstance(dataplane_or_fd, int) else dataplane_or_fd.prog_fd
        attach_fd(fd, end.dev, end.ns, mode)
        self._attached.append((end.dev, end.ns, mode))

    def attach_pass(self, end: End, mode: str = "native") -> None:
        attach_pass(end.dev, end.ns, mode)
        self._attached.append((end.dev, end.ns, mode))

    def udp_socket(self, end: End, port: int = 0) -> socket.socket:
        """A UDP socket living in `end`'s namespace, bound to its address."""
        with netns.inside(end.ns):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((end.ip, port))
        return s
