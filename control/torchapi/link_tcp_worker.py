# SPDX-License-Identifier: Apache-2.0
"""The TCP transport's worker link (link_tcp.py has the server's, and says
what travels): one connection to the server, by TCP, by the server's Unix
socket where it is on this host (localsock.py), or in memory where it is in
this process (handoff.py: a co-located trainer's own server)."""
from __future__ import annotations

import contextlib
import socket
import struct
import time

import numpy as np

from ...dataplane.tcp_cc import set_cc
from ...dataplane.xdp.wire import chunk_bytes_for
from ...errors import CommError
from .. import settings_table
from ..trust.hello import mac_hello
from .handoff import Pair, pair as handoff_pair, proc
from .codec import WorkerCodec, check_peer, piece_feedback
from .host import rank_host
from .links import WorkerLink
from .localsock import connect_local
from .settings import Settings

TCP_MAGIC = 0x4C545054            # "LTPT"
HDR = struct.Struct(">III")       # magic, round, payload bytes


class TcpWorkerLink(WorkerLink):
    name = "tcp"
    opens = False

    def __init__(self, s: Settings, worker: int, workers: int, key: bytes | None = None):
        self.id, self.cc, self.timeout_s = worker, s.cc, s.timeout
        self.host = rank_host(s.netns, s.node)   # a server on it is reached by its Unix socket
        self.local = False
        self.key = key     # the hello's MAC key (jobkey.hello_key); from a member file its own MAC
        self.sock: socket.socket | None = None
        self.pair: Pair | None = None    # a server in this process: no socket
        self.compress, self.chunk_bytes = s.compress, chunk_bytes_for(s.mtu)
        self.codec = WorkerCodec(self.chunk_bytes, piece_feedback(s))   # a step's wire: its op's
        self.wire = np.empty(0, dtype=np.float32)   # a compressed answer's words
        self.spread = np.empty(0, dtype=np.float32)   # ... decoded, for pull_parts

    def address(self) -> dict:
        return {"proc": proc()}

    def connect(self, server: dict) -> None:
        check_peer(self.compress, self.chunk_bytes, server)
        if settings_table.env("tcp_local") and server.get("proc") == proc():
            self.pair = handoff_pair(server["ip"], server["port"], self.id)
            self.local = True      # the server beside it, in this process (colocate.py)
            return
        self.sock = connect_local(server, self.host, self.timeout_s) \
            if settings_table.env("tcp_local") else None
        if self.sock is None:
            self.sock = self.connect_tcp(server)
        self.local = self.sock.family == socket.AF_UNIX   # by the server's Unix socket
        self.sock.sendall(mac_hello(self.id, self.key))

    def connect_tcp(self, server: dict) -> socket.socket:
        deadline = time.monotonic() + self.timeout_s
        while True:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            set_cc(s, self.cc)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(self.timeout_s)
            try:
                s.connect((server["ip"], int(server["port"])))
                break
            except OSError as e:
                s.close()
                if time.monotonic() > deadline:
                    raise CommError(f"cannot connect to the server at {server['ip']}:"
                                    f"{server['port']}: {e}") from e
                time.sleep(0.05)
        return s

    def ensure(self, nelems: int) -> bool:
        return False

    def expect_wire(self, d: int, n: int, wire: str) -> None:
        """Answer d starts with n elements in `wire` (a step's aggregate)."""
        self.codec.expect(d, n, wire)

    def expect(self, d: int, nelems: int, tolerant: bool = False) -> None:
        pass

    def push(self, r: int, buf: np.ndarray, reliable: bool, answer: int | None = None,
             at: int = 0, wire: str = "none") -> bool:
        if not reliable:   # compressed, buf is left holding the rounding error
            buf = self.codec.piece(buf, wire)
        body = memoryview(np.ascontiguousarray(buf)).cast("B")
        if self.pair is not None:
            self.pair.up.give(r, body, self.timeout_s)
            return False
        hdr = HDR.pack(TCP_MAGIC, r, len(body))
        total, sent = len(hdr) + len(body), 0
        with self.silent(f"round {r}'s piece"):
            while sent < total:
                sent += self.sock.sendmsg(iov(hdr, body, sent))
        return False

    def pull(self, d: int, out: np.ndarray) -> None:
        into = out
        compressed = self.codec.compressed(d)
        if compressed:   # the words on the wire, decoded into out below
            words = self.codec.wire_elems(d, len(out))
            if len(self.wire) < words:
                self.wire = np.empty(words, dtype=np.float32)
            into = self.wire[:words]
        if self.pair is not None:
            self.take(d, [memoryview(into).cast("B")])
            if compressed:
                self.codec.decode(d, into, out)
            return
        with self.silent(f"answer {d}"):
            magic, rnd, nbytes = HDR.unpack(recv_exact(self.sock, HDR.size))
            if magic != TCP_MAGIC or rnd != d or nbytes != into.nbytes:
                raise CommError(f"the server sent answer {rnd} ({nbytes} bytes); expected {d} "
                                f"({into.nbytes} bytes)")
            self.recv_into(into, nbytes)
        if compressed:
            self.codec.decode(d, into, out)

    scatters = True

    def pull_parts(self, d: int, parts: list[np.ndarray]) -> None:
        total = sum(x.size for x in parts)
        if self.codec.compressed(d):   # its words decoded whole, then spread
            if len(self.spread) < total:
                self.spread = np.empty(total, dtype=np.float32)
            self.pull(d, self.spread[:total])
            at = 0
            for x in parts:
                x[:] = self.spread[at:at + x.size]
                at += x.size
            return
        if self.pair is not None:
            self.take(d, [memoryview(x).cast("B") for x in parts])
            return
        with self.silent(f"answer {d}"):
            magic, rnd, nbytes = HDR.unpack(recv_exact(self.sock, HDR.size))
            if magic != TCP_MAGIC or rnd != d or nbytes != total * 4:
                raise CommError(f"the server sent answer {rnd} ({nbytes} bytes); expected {d} "
                                f"({total * 4} bytes)")
            for x in parts:
                self.recv_into(x, x.nbytes)

    @contextlib.contextmanager
    def silent(self, what: str):
        """A socket wait past the link's timeout as the CommError it is."""
        try:
            yield
        except TimeoutError as e:
            raise CommError(f"worker {self.id}: {what}: the server's connection moved no byte "
                            f"for {self.timeout_s:g}s (LTP_TIMEOUT)") from e

    def take(self, d: int, parts: list[memoryview]) -> None:
        """Answer d from the server beside it, one piece (none when empty:
        the server gives no empty answer)."""
        if sum(len(x) for x in parts):
            self.pair.down.take(d, parts, self.timeout_s)

    def recv_into(self, into: np.ndarray, nbytes: int) -> None:
        recv_all(self.sock, memoryview(into).cast("B")[:nbytes],
                 "the server closed the connection")

    def close(self) -> None:
        if self.pair is not None:
            self.pair.close(f"worker {self.id}")
            self.pair = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def recv_all(sock: socket.socket, view: memoryview,
             closed: str = "connection closed by the peer") -> None:
    """Fill `view` (bytes) from sock; CommError(closed) if the stream ends first."""
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if k == 0:
            raise CommError(closed)
        got += k


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    recv_all(sock, memoryview(buf))
    return bytes(buf)


def iov(hdr: bytes, body: memoryview, sent: int) -> list:
    """What is left to send of header + body after `sent` bytes, as sendmsg buffers."""
    return [hdr[sent:], body] if sent < len(hdr) else [body[sent - len(hdr):]]
