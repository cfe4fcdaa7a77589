# SPDX-License-Identifier: Apache-2.0
"""The TCP server link's workers that go and come back (link_tcp.py).

A worker that dies ends its connection: reading it meets EOF or a reset
(`Gone`), and the server marks it gone (`TcpServerLink.lose`). A worker
restarted into the running job (`ltp train --restart`, `ltp launch
--max-restarts`) connects again and says its hello, as at the start.
Each op's `ensure` (`take_back`) parks what came on the server's listening
socket, open for the whole job, by its hello (`accept.Doorway`: it never
waits on a connection, so a silent stray holds no op up), a newer
connection of a worker replacing an older one;
then it puts in place the connection of each worker the server admitted
again at the op before (`readmit`, the step that took its join ticket):
its first op is this one, so no round or answer of an op before reaches
it. A parked connection found closed is dropped. The join itself (the
ticket, the donor's state, the admission) goes through the store as over
LTP (server.py, elastic.py).

Limits: a joiner whose donor dies before handing its state over is in its
first op's rounds but sends nothing, so that op's read waits out the
link's timeout; a joiner whose hello is not whole HELLO_WAIT_S into its
first op (heavy loss) stays gone until it restarts again."""
from __future__ import annotations

import logging
import socket

from ...dataplane.tcp_cc import set_cc
from ...errors import CommError
from ..accept import Doorway
from ..trust.hello import MAC_HELLO, mac_parser

log = logging.getLogger("ltpx.torch.tcp")
HELLO_WAIT_S = 2.0   # a joiner's hello begun but not whole at its first op: waited for this long


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
    key), parked by worker until the server takes them."""

    def __init__(self, ls: socket.socket, ids: list[int], key, cc: str):
        self.door, self.cc = Doorway(ls, MAC_HELLO.size, mac_parser(ids, key)), cc
        self.parked: dict[int, socket.socket] = {}   # worker -> a connection it made again

    def poll(self, wait_s: float = 0.0) -> int:
        """Park the connections whose hello came (never waiting, unless
        wait_s > 0 while a hello is on its way); a worker's newer connection
        replaces its older one (a worker restarted twice). The strays closed."""
        got = self.door.poll(wait_s)
        for w, c in got.conns.items():
            old = self.parked.pop(w, None)
            if old is not None:
                old.close()
            self.parked[w] = c
        return got.strays

    def take(self, w: int) -> socket.socket | None:
        """Worker w's parked connection, made ready, if it is still open."""
        c = self.parked.pop(w, None)
        if c is None:
            return None
        try:
            c.setblocking(False)
            if c.recv(1, socket.MSG_PEEK) == b"":     # that process died too
                c.close()
                return None
        except BlockingIOError:
            pass          # open, nothing sent yet: as a joiner's is before its first op
        except OSError:
            c.close()
            return None
        try:
            return tune(c, self.cc)
        except OSError:
            c.close()
            return None

    def close(self) -> None:
        for c in self.parked.values():
            c.close()
        self.parked = {}
        self.door.close()


class GoneAndBack:
    """TcpServerLink's workers that go (`lose`) and come back (`readmit`):
    its `gone` and `joining` sets, `conns`, `back` (a TakeBack), `ids` and
    `strays`."""

    def readmit(self, w: int) -> None:
        self.joining.add(w)

    def take_back(self) -> None:
        """At an op's start (`ensure`): new connections parked, and each
        worker admitted again since the last op (`readmit`: its first op is
        this one) read from its own from now on. One that made none stays
        gone: its rows filled, no answer (its pull times out, and it is
        dropped after max_missed steps). A gone worker's old connection is
        closed here (its peer's end was: left open, it sat in CLOSE_WAIT
        until the job's end)."""
        for i in self.gone:
            if self.conns[i] is not None:
                self.conns[i].close()
        if self.back is None:
            return
        self.strays += self.back.poll()
        for i in sorted(self.joining):
            if i not in self.back.parked and self.back.door.pending:   # its hello on its way?
                self.strays += self.back.poll(HELLO_WAIT_S)
            c = self.back.take(i)
            if c is None:    # not gone: a live worker back on its old connection
                if i in self.gone:
                    log.warning("ltpx.torch server: worker %d was admitted again, but no new "
                                "connection of it is open: it stays gone", self.ids[i])
                continue
            self.conns[i].close()
            self.conns[i] = c
            self.gone.discard(i)
            log.info("ltpx.torch server: worker %d connected again: read from its new "
                     "connection from this op on", self.ids[i])
        self.joining.clear()

    def lose(self, i: int, what: str, why: str) -> None:
        """Worker i's connection ended in `what` (a round, an answer): it is gone."""
        if i not in self.gone:
            self.gone.add(i)
            log.warning("ltpx.torch server: worker %d's connection ended in %s (%s): its "
                        "rows are filled until it is dropped, and it gets no answers",
                        self.ids[i], what, why)
