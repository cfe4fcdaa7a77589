# SPDX-License-Identifier: Apache-2.0
"""The TCP server link's workers that go and come back (link_tcp.py).

A worker that dies ends its connection: reading it meets EOF or a reset
(`Gone`), and the server marks it gone (`TcpServerLink.lose`). A worker
restarted into the running job (`ltp train --restart`, `ltp launch
--max-restarts`) connects again and says its hello, as at the start.
`TakeBack` accepts such connections between ops: the server's listening
socket stays open for the whole job, and each op's `ensure` asks what waits
on it (`accept.accept_waiting`: at once when nothing does). A hello whose
worker is gone puts the new connection in its place; one whose worker is
not yet known gone (restarted before the server read the old connection's
end) waits, parked, until it is. The join itself (the ticket, the donor's
state, admission in a step's report) goes through the store as over LTP
(server.py, elastic.py): by the op that first includes the joiner, its
connection is in place."""
from __future__ import annotations

import logging
import socket

from ...dataplane.tcp_cc import set_cc
from ...errors import CommError
from ..accept import accept_waiting
from ..trust.hello import MAC_HELLO, mac_parser

log = logging.getLogger("ltpx.torch.tcp")


class Gone(CommError):
    """Worker connection i ended (EOF or reset): the worker died."""

    def __init__(self, i: int, why: str):
        super().__init__(why)
        self.i = i


def whole(r: int, ids: list[int]) -> CommError:
    return CommError(f"round {r} must be whole, and worker(s) {ids} closed their connection")


def tune(c: socket.socket, cc: str) -> socket.socket:
    """A worker's accepted connection as the server reads and writes it:
    its congestion control and no Nagle over TCP, non-blocking."""
    if c.family != socket.AF_UNIX:
        set_cc(c, cc)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.setblocking(False)
    return c


class TakeBack:
    """Restarted workers' new connections on the server's listening socket
    `ls`, each known by its hello (ids: the workers, key: the hellos' MAC
    key)."""

    def __init__(self, ls: socket.socket, ids: list[int], key, cc: str):
        self.ls, self.parse, self.cc = ls, mac_parser(ids, key), cc
        self.parked: dict[int, socket.socket] = {}   # worker -> a connection it made again

    def take(self, want: set[int]) -> tuple[dict[int, socket.socket], int]:
        """(worker -> its new connection, for those of `want` that connected
        again; the strays closed meanwhile)."""
        got = accept_waiting(self.ls, MAC_HELLO.size, self.parse)
        for w, c in got.conns.items():
            old = self.parked.pop(w, None)
            if old is not None:      # it connected again since: the newer one is it
                old.close()
            self.parked[w] = c
        back = {w: tune(self.parked.pop(w), self.cc) for w in sorted(want & set(self.parked))}
        for w in back:
            log.info("ltpx.torch server: worker %d connected again: its new connection "
                     "is read from its first round on", w)
        return back, got.strays

    def close(self) -> None:
        for c in self.parked.values():
            c.close()
        self.parked = {}


class GoneAndBack:
    """TcpServerLink's workers that go (`lose`) and come back (`readmit`):
    its `gone` and `joining` sets, `conns`, `back` (a TakeBack) and `ids`."""

    def readmit(self, w: int) -> None:
        self.joining.add(w)

    def _take_back(self, workers: list[int]) -> None:
        """Before a round: a worker admitted again (`readmit`) that connected
        again (restarted) is read from its new connection (link_tcp_back.py)."""
        want = self.joining.intersection(workers)
        if not want or self.back is None:
            return
        back, strays = self.back.take(want)
        self.strays += strays
        for i, c in back.items():
            self.conns[i].close()
            self.conns[i] = c
            self.gone.discard(i)
        for i in want - set(back):
            log.warning("ltpx.torch server: worker %d was admitted again, but made no new "
                        "connection: its old one is read", self.ids[i])
        self.joining -= want

    def lose(self, i: int, r: int, why: str) -> None:
        """Worker i's connection ended in round (or answer) r: it is gone."""
        if i not in self.gone:
            self.gone.add(i)
            log.warning("ltpx.torch server: worker %d's connection ended at %d (%s): its "
                        "rows are filled until it is dropped, and it gets no answers",
                        self.ids[i], r, why)
