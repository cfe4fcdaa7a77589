# SPDX-License-Identifier: Apache-2.0
"""A TCP server's accept of its workers, each known by the hello it sends first; strays are ignored.

A listening socket is open to whoever reaches it: a port scan, a health
check, another job's worker, a forger. `accept_workers` takes connections
until every expected worker has said a valid hello, reading all hellos at
once (a connection that stays silent holds nobody up), and closes and
counts (`Accepted.strays`) every connection whose hello is short, silent
for `hello_s`, not a valid id, or an id already taken. Used by the TCP
transport's server (torchapi/link_tcp.py, whose hello carries a MAC under
the worker's own hello key, over the run's id: trust/hello.py, so a hello
recorded in an earlier run is a stray in a later one) and the TCP incast
bench's PS agent (bench/tcp.py). Torch-free.
"""
from __future__ import annotations

import logging
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("ltpx.accept")

# A worker's hello can come late on a lossy path: TCP re-sends its segment
# after 1, 2, 4, 8 ... s, so at 30 % loss on every port (51 % each way) a 5 s
# limit turned away real workers of `ltp train --transport tcp`.
HELLO_S = 60.0
MAX_PENDING = 64      # connections still to say their hello, at most
LOGGED = 3            # strays logged one by one; the rest are counted in one line


@dataclass
class Accepted:
    """What accept_workers took: worker id -> connection, and the strays it closed."""

    conns: dict[int, socket.socket] = field(default_factory=dict)
    strays: int = 0


class _Hellos:
    """The connections accept_workers waits on for their hello, and what
    it took (`out`)."""

    def __init__(self, listeners: list[socket.socket], size: int,
                 parse: Callable[[bytes], int | None]):
        self.size, self.parse, self.out = size, parse, Accepted()
        self.total = 0      # strays in all (`out` may be taken and renewed: Doorway)
        self.sel = selectors.DefaultSelector()
        self.pending: dict[socket.socket, list] = {}      # conn -> [bytes so far, since]
        for ls in listeners:
            self.sel.register(ls, selectors.EVENT_READ)

    def stray(self, c: socket.socket, why: str) -> None:
        self.out.strays += 1
        self.total += 1
        if self.total <= LOGGED:
            log.warning("a connection from %s was not a worker (%s): closed", _peer(c), why)
        self.pending.pop(c, None)
        self.sel.unregister(c)
        c.close()

    def add(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        if len(self.pending) >= MAX_PENDING:
            self.make_room()
        self.pending[conn] = [b"", time.monotonic()]
        self.sel.register(conn, selectors.EVENT_READ)

    def hear(self, c: socket.socket) -> None:
        """Read what c has sent; a whole hello makes it a worker's."""
        got = self.pending[c][0]
        try:
            data = c.recv(self.size - len(got))
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.stray(c, "closed before its hello")
            return
        got = self.pending[c][0] = got + data
        if len(got) < self.size:
            return
        wid = self.parse(got)
        if wid is None or wid in self.out.conns:
            self.stray(c, "bad hello" if wid is None else f"worker {wid} is connected")
            return
        self.pending.pop(c)
        self.sel.unregister(c)
        c.setblocking(True)
        self.out.conns[wid] = c

    def make_room(self) -> None:
        """What every waiting connection sent is read; then the oldest that
        has sent nothing goes (else the oldest)."""
        for c in list(self.pending):
            self.hear(c)
        if len(self.pending) >= MAX_PENDING:
            silent = [c for c, (got, _) in self.pending.items() if not got]
            self.stray((silent or list(self.pending))[0], f"{MAX_PENDING} newer connections wait")

    def step(self, listeners: list[socket.socket], wait_s: float) -> bool:
        """One wait of at most wait_s: a new connection accepted, or what a
        waiting one sent read. False: nothing was ready."""
        ready = self.sel.select(wait_s)
        for key, _ in ready:
            c = key.fileobj
            if c in listeners:
                try:
                    conn, _ = c.accept()
                except OSError:
                    continue
                self.add(conn)
            elif c in self.pending:
                self.hear(c)
        return bool(ready)

    def expire(self, hello_s: float) -> None:
        now = time.monotonic()
        for c in [c for c, (_, t) in self.pending.items() if now - t > hello_s]:
            self.stray(c, f"no hello in {hello_s:g}s")

    def close(self) -> None:
        self.out.strays += len(self.pending)   # still saying nothing when the workers were in
        self.total += len(self.pending)
        for c in list(self.pending):
            self.sel.unregister(c)
            c.close()
        self.sel.close()
        if self.total > LOGGED:
            log.warning("%d connections in all were not workers (closed); the first %d are "
                        "logged above", self.total, LOGGED)


def accept_workers(ls: socket.socket | list[socket.socket], need: int, size: int,
                   parse: Callable[[bytes], int | None], timeout_s: float,
                   hello_s: float = HELLO_S) -> Accepted:
    """Connections until `need` workers said a hello of `size` bytes that
    parse() turns into a worker id (None: not one), or timeout_s passed
    (then fewer: the caller says what is missing). Returned connections are
    blocking, as accepted. A connection that says nothing is closed after
    hello_s, or when MAX_PENDING newer ones wait too: what every waiting
    connection has sent is read first, and the oldest that has sent
    nothing goes (a worker whose hello is on its way is never the one), so
    waiting on it holds up no other connection. The first LOGGED strays are
    logged each, the rest in one line at the end. `ls`: a listening socket,
    or several (e.g. TCP and a Unix socket for workers on this host)."""
    listeners = ls if isinstance(ls, list) else [ls]
    for one in listeners:
        one.setblocking(False)
    h = _Hellos(listeners, size, parse)
    end = time.monotonic() + timeout_s
    try:
        while len(h.out.conns) < need and time.monotonic() < end:
            h.step(listeners, 0.2)
            h.expire(hello_s)
    finally:
        h.close()
        for one in listeners:
            one.setblocking(True)
    return h.out


class Doorway:
    """A listening socket's connections taken mid-job (a restarted worker's),
    each known by its hello as in accept_workers, without ever waiting on
    one: `poll` accepts what is there and reads what each has sent so far,
    keeping the rest for the next poll, so a silent stray holds nothing up
    (it is closed after hello_s, or when MAX_PENDING newer ones wait)."""

    def __init__(self, ls: socket.socket, size: int, parse: Callable[[bytes], int | None],
                 hello_s: float = HELLO_S):
        ls.setblocking(False)
        self.ls, self.hello_s = ls, hello_s
        self.h = _Hellos([ls], size, parse)

    @property
    def pending(self) -> int:
        """Connections whose hello is not whole yet."""
        return len(self.h.pending)

    def poll(self, wait_s: float = 0.0) -> Accepted:
        """The workers' connections whose hello came since the last poll, and
        the strays closed since. wait_s > 0: while some hello is still
        coming, wait for it that long at most."""
        end = time.monotonic() + wait_s
        for _ in range(4 * MAX_PENDING):     # a flood of connections cannot keep it here
            if self.h.step([self.ls], 0):
                continue
            if not self.h.pending or time.monotonic() >= end:
                break
            self.h.step([self.ls], 0.05)
        self.h.expire(self.hello_s)
        out, self.h.out = self.h.out, Accepted()
        return out

    def close(self) -> None:
        self.h.close()


def _peer(c: socket.socket) -> str:
    if c.family == socket.AF_UNIX:
        return "this host's Unix socket"
    try:
        host, port = c.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"
