# SPDX-License-Identifier: Apache-2.0
"""A worker and its LTP server on one host, in two processes: the server's
Unix socket as a stream of pieces up and answers down (link_ltp_near.py
uses it). A piece is the TCP transport's header and body; each direction is
a socket object of its own (a dup), with its own timeout, so a server's late
piece is read and let go while its answer goes the other way. A stream cut
short or out of step ends the channel: every later give and take raises,
naming why (`closed`), and the peer sees the socket closed."""
from __future__ import annotations

import select
import socket

from ...errors import CommError
from .link_tcp_worker import HDR, TCP_MAGIC, iov, recv_all, recv_exact

HEAD_S = 10.0    # a piece's header, once readable, is read within this; its body once begun


class SockEnd:
    """One direction of a worker's Unix socket to its server, as a Slot's
    give and take: a piece is the TCP transport's header and body."""

    def __init__(self, channel: SockChannel, sock: socket.socket, what: str):
        self.channel, self.sock, self.what = channel, sock, what
        self.head: tuple[int, int] | None = None    # a header read ahead (peek): tag, size

    def check(self) -> None:
        if self.channel.closed:
            raise CommError(f"{self.what}: {self.channel.closed}")

    def give(self, tag: int, body: memoryview, timeout_s: float, abort=None) -> None:
        self.check()
        hdr, sent = HDR.pack(TCP_MAGIC, tag, len(body)), 0
        self.sock.settimeout(timeout_s)
        try:
            while sent < len(hdr) + len(body):
                sent += self.sock.sendmsg(iov(hdr, body, sent))
        except OSError as e:     # a frame cut short: nothing after it could be read in step
            self.channel.end(f"{tag} cut short: {e or type(e).__name__}")
            raise CommError(f"{self.what}: {self.channel.closed}") from e

    def ready(self, wait_s: float) -> bool:
        """Whether a piece (or the end) is there to take within wait_s."""
        self.check()
        return self.head is not None or bool(select.select([self.sock], [], [], wait_s)[0])

    def peek(self, timeout_s: float = HEAD_S, tag: int | None = None) -> int | None:
        """The next piece's tag, its header read (call once ready; `tag`: the
        one a take waits for, for its error)."""
        self.check()
        if self.head is None:
            self.sock.settimeout(timeout_s)
            try:
                magic, got, size = HDR.unpack(recv_exact(self.sock, HDR.size))
            except (OSError, CommError) as e:
                self.channel.end(f"{'a header' if tag is None else tag}: "
                                 f"{e or type(e).__name__}")
                raise CommError(f"{self.what}: {self.channel.closed}") from e
            if magic != TCP_MAGIC:
                self.channel.end(f"a header of magic {magic:#x}: out of step")
                self.check()
            self.head = (got, size)
        return self.head[0]

    def drop(self) -> None:
        """Read the next piece (peeked) and let it go."""
        _, size = self.head
        scratch, left = memoryview(bytearray(min(size, 1 << 20) or 1)), size
        try:
            while left:
                k = min(left, len(scratch))
                recv_all(self.sock, scratch[:k], "closed by the peer")
                left -= k
        except (OSError, CommError) as e:
            self.channel.end(f"a late piece: {e or type(e).__name__}")
            raise CommError(f"{self.what}: {self.channel.closed}") from e
        self.head = None

    def take(self, tag: int, into: memoryview, timeout_s: float, abort=None) -> None:
        self.check()
        self.sock.settimeout(timeout_s)
        try:
            if self.head is None:
                self.peek(timeout_s, tag)
            (got, size), self.head = self.head, None
            if got != tag or size != len(into):
                self.channel.end(f"{got} of {size} bytes given where {tag} of {len(into)} "
                                 "was expected: out of step")
                self.check()
            recv_all(self.sock, into.cast("B"), "closed by the peer")
        except (OSError, CommError) as e:   # the stream is out of step from here on
            self.channel.end(f"{tag}: {e or type(e).__name__}")
            raise CommError(f"{self.what}: {self.channel.closed}") from e


class SockChannel:
    """A worker and its server on one host, in two processes: its Unix socket."""

    def __init__(self, sock: socket.socket, worker: int):
        self.sock, self.closed = sock, ""
        # a socket object a direction (one file): each its own timeout, as a
        # server's late piece is let go while its answer is given (_drain)
        self.up = SockEnd(self, sock, f"worker {worker}'s pieces to the server on its host")
        self.down = SockEnd(self, sock.dup(),
                            f"the server's answers to worker {worker} on its host")

    def close(self, who: str) -> None:
        """Either side's end (as handoff.Pair.close)."""
        self.end(f"{who} closed its end")

    def end(self, why: str) -> None:
        """The channel's end, or a stream out of step: every later give and
        take raises, naming why, and the peer's see the socket closed."""
        if self.closed:
            return
        self.closed = why
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.down.sock.close()
