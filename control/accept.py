# SPDX-License-Identifier: Apache-2.0
"""A TCP server's accept of its workers, each known by the hello it sends first; strays are ignored.

A listening socket is open to whoever reaches it: a port scan, a health
check, another job's worker, a forger. `accept_workers` takes connections
until every expected worker has said a valid hello, reading all hellos at
once (a connection that stays silent holds nobody up), and closes and
counts (`Accepted.strays`) every connection whose hello is short, silent
for `hello_s`, not a valid id, or an id already taken. Used by the TCP
transport's server (torchapi/link_tcp.py, whose hello carries a MAC under
the worker's own hello key, over the run's id: `HelloKey`, `mac_hello`, so
a hello recorded in an earlier run is a stray in a later one) and the TCP
incast bench's PS agent (bench/tcp.py). Torch-free.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import selectors
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

log = logging.getLogger("ltpx.accept")

# A worker's hello can come late on a lossy path: TCP re-sends its segment
# after 1, 2, 4, 8 ... s, so at 30 % loss on every port (51 % each way) a 5 s
# limit turned away real workers of `ltp train --transport tcp`.
HELLO_S = 60.0
MAX_PENDING = 64      # connections still to say their hello, at most
LOGGED = 3            # strays logged one by one; the rest are counted in one line
MAC_HELLO = struct.Struct(">I32s")    # worker id, HMAC-SHA256 of the run under its hello key


@dataclass
class Accepted:
    """What accept_workers took: worker id -> connection, and the strays it closed."""

    conns: dict[int, socket.socket] = field(default_factory=dict)
    strays: int = 0


class HelloKey(NamedTuple):
    """What a TCP hello is made and checked with, in run `run`: the job's
    hello key (worker None: it says and checks any worker's hello), or one
    worker's own (`worker_key`, as its member key file holds it,
    control/jobkey.py: that worker's hello and no other's)."""

    key: bytes
    worker: int | None = None
    run: bytes = b""

    def __repr__(self) -> str:      # no key material in a log line
        return f"HelloKey(worker={self.worker}, run={self.run!r})"


def worker_key(key: bytes, wid: int) -> bytes:
    """Worker wid's own hello key under the job's hello key."""
    return hmac.new(key, b"ltpx-tcp-hello/%d" % wid, hashlib.sha256).digest()


def mac_hello(wid: int, key: HelloKey | None) -> bytes:
    """A worker's hello: its id and a MAC of the run's id under its own hello
    key (zeros without a key; with a worker's own key, ValueError for
    another id)."""
    if key is None:
        return MAC_HELLO.pack(wid, bytes(32))
    if key.worker is None:
        own = worker_key(key.key, wid)
    elif wid != key.worker:
        raise ValueError(f"worker {key.worker}'s hello key cannot say worker {wid}'s hello")
    else:
        own = key.key
    mac = hmac.new(own, b"ltpx-tcp-hello-run\0" + key.run, hashlib.sha256).digest()
    return MAC_HELLO.pack(wid, mac)


def mac_parser(ids, key: HelloKey | None) -> Callable[[bytes], int | None]:
    """parse() for accept_workers: the id of a hello whose MAC verifies."""
    ids = set(ids)

    def parse(raw: bytes) -> int | None:
        wid, mac = MAC_HELLO.unpack(raw)
        if wid not in ids or not hmac.compare_digest(mac, mac_hello(wid, key)[4:]):
            return None
        return wid
    return parse


def accept_workers(ls: socket.socket, need: int, size: int, parse: Callable[[bytes], int | None],
                   timeout_s: float, hello_s: float = HELLO_S) -> Accepted:
    """Connections until `need` workers said a hello of `size` bytes that
    parse() turns into a worker id (None: not one), or timeout_s passed
    (then fewer: the caller says what is missing). Returned connections are
    blocking, as accepted. A connection that says nothing is closed after
    hello_s, or when MAX_PENDING newer ones wait too: what every waiting
    connection has sent is read first, and the oldest that has sent
    nothing goes (a worker whose hello is on its way is never the one), so
    waiting on it holds up no other connection. The first LOGGED strays are
    logged each, the rest in one line at the end."""
    out = Accepted()
    sel = selectors.DefaultSelector()
    pending: dict[socket.socket, list] = {}      # conn -> [bytes so far, since]
    ls.setblocking(False)
    sel.register(ls, selectors.EVENT_READ)
    end = time.monotonic() + timeout_s

    def stray(c: socket.socket, why: str) -> None:
        out.strays += 1
        if out.strays <= LOGGED:
            log.warning("a connection from %s was not a worker (%s): closed", _peer(c), why)
        pending.pop(c, None)
        sel.unregister(c)
        c.close()

    def hear(c: socket.socket) -> None:
        """Read what c has sent; a whole hello makes it a worker's."""
        try:
            data = c.recv(size - len(pending[c][0]))
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            stray(c, "closed before its hello")
            return
        pending[c][0] += data
        if len(pending[c][0]) < size:
            return
        wid = parse(pending[c][0])
        if wid is None or wid in out.conns:
            stray(c, "bad hello" if wid is None else f"worker {wid} is connected")
            return
        pending.pop(c)
        sel.unregister(c)
        c.setblocking(True)
        out.conns[wid] = c

    def make_room() -> None:
        for c in list(pending):
            hear(c)
        if len(pending) >= MAX_PENDING:
            silent = [c for c, (got, _) in pending.items() if not got]
            stray((silent or list(pending))[0], f"{MAX_PENDING} newer connections wait")
    try:
        while len(out.conns) < need and time.monotonic() < end:
            for key, _ in sel.select(0.2):
                c = key.fileobj
                if c is ls:
                    try:
                        conn, _ = ls.accept()
                    except OSError:
                        continue
                    conn.setblocking(False)
                    if len(pending) >= MAX_PENDING:
                        make_room()
                    pending[conn] = [b"", time.monotonic()]
                    sel.register(conn, selectors.EVENT_READ)
                elif c in pending:
                    hear(c)
            now = time.monotonic()
            for c in [c for c, (_, t) in pending.items() if now - t > hello_s]:
                stray(c, f"no hello in {hello_s:g}s")
    finally:
        out.strays += len(pending)     # still saying nothing when the workers were all in
        for c in list(pending):
            sel.unregister(c)
            c.close()
        sel.close()
        ls.setblocking(True)
        if out.strays > LOGGED:
            log.warning("%d connections in all were not workers (closed); the first %d are "
                        "logged above", out.strays, LOGGED)
    return out


def _peer(c: socket.socket) -> str:
    try:
        host, port = c.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"
