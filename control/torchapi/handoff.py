# SPDX-License-Identifier: Apache-2.0
"""The TCP transport's hop inside one process: a co-located trainer's worker
and the server beside it (colocate.py) meet in memory, not in a socket.

A `Pair` stands for the connection: `up` carries the worker's pieces to the
server, `down` the server's answers back. A `Slot` is a stream of pieces in
order: `give` lends a large piece and waits until it is taken, so `take`
copies it once into the taker's buffer (where a socket makes two copies and
crosses the kernel); a small one it copies and leaves, as a socket's buffer
would hold it (a few MB at most). `take` first checks that the piece is the
round or answer the taker expects and of its size, as the TCP header is
checked. A wait that outlasts the link's timeout, and a slot closed by
either side (its link closed), raise CommError, as a silent or closed
socket does.

Both links find the pair by the server's address and the worker's id
(`pair`); each tells its peer is in this process by `proc()`, which the
server publishes beside its port and the worker beside its address.
"""
from __future__ import annotations

import os
import threading
import time
import uuid
from collections import deque

import numpy as np

from ...errors import CommError
from .localsock import ns_id

_BOOT = uuid.uuid4().hex[:12]
_pairs: dict[tuple, Pair] = {}
_lock = threading.Lock()
POLL_S = 0.2     # a wait looks at its abort event this often
SMALL_BYTES = 1 << 20    # a piece smaller is copied and left (a socket's buffer)...
HOLD_BYTES = 4 << 20     # ...while the copies held stay within this


def proc() -> str:
    """This process, told apart from every other one (a forked child too)."""
    return f"{_BOOT}-{ns_id('pid')}-{os.getpid()}"


class _Piece:
    __slots__ = ("tag", "body", "owned", "done", "ok")

    def __init__(self, tag: int, body, owned: bool):
        self.tag, self.body, self.owned = tag, body, owned
        self.done = self.ok = False     # the taker is through with it; it copied it


class Slot:
    """Pieces in order from a giver to a taker, as a stream (module doc)."""

    def __init__(self, what: str):
        self.what = what
        self.cv = threading.Condition()
        self.q: deque[_Piece] = deque()
        self.held = 0            # bytes of the copies held (small pieces)
        self.closed: str | None = None

    def give(self, tag: int, body: memoryview, timeout_s: float,
             abort: threading.Event | None = None) -> None:
        """Hand `body` (bytes) over as `tag`. A small one is copied and
        left, as a socket's buffer holds it; a large one (or with HOLD_BYTES
        held) is lent, and this returns once the taker has copied it. A lent
        piece given up (closed, `abort`, timeout) is withdrawn, or, its copy
        under way, waited for: the caller's buffer is its own again."""
        with self.cv:
            if self.closed:
                raise CommError(f"{self.what}: {self.closed}")
            small = len(body) < SMALL_BYTES and self.held + len(body) <= HOLD_BYTES
            piece = _Piece(tag, bytes(body) if small else body, small)
            self.held += len(body) if small else 0
            self.q.append(piece)
            self.cv.notify_all()
            if small:
                return
            deadline = time.monotonic() + timeout_s
            while not piece.done and not self.closed and not (abort and abort.is_set()):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cv.wait(min(left, POLL_S))
            if piece.done and piece.ok:
                return
            if piece in self.q:
                self.q.remove(piece)      # never taken: no one reads it now
            else:
                while not piece.done:     # taken and being copied: let the copy end
                    self.cv.wait(POLL_S)
            why = self.closed or ("given up" if abort and abort.is_set() else
                                  f"not taken within {timeout_s:g}s")
            raise CommError(f"{self.what}: {tag} {why}")

    def peek(self) -> int | None:
        """The next piece's tag (None: none there)."""
        with self.cv:
            return self.q[0].tag if self.q else None

    def drop(self) -> None:
        """Let the next piece go untaken, as taken (a late piece the taker
        gave up on: its giver goes on, as a late packet's sender does)."""
        with self.cv:
            if self.q:
                piece = self.q.popleft()
                self.held -= len(piece.body) if piece.owned else 0
                piece.done = piece.ok = True
                self.cv.notify_all()

    def ready(self, wait_s: float) -> bool:
        """Whether a piece (or the end) is there to take within wait_s."""
        with self.cv:
            if not self.q and not self.closed:
                self.cv.wait(wait_s)
            return bool(self.q) or bool(self.closed)

    def take(self, tag: int, into: memoryview | list[memoryview], timeout_s: float,
             abort: threading.Event | None = None) -> None:
        """Copy the next piece, which must be `tag` of into's size, into `into`
        (or into a list of buffers in turn, their sizes added)."""
        parts = into if isinstance(into, list) else [into]
        size = sum(len(x) for x in parts)
        deadline = time.monotonic() + timeout_s
        with self.cv:
            while not self.q and not self.closed:
                if abort is not None and abort.is_set():
                    raise CommError(f"{self.what}: {tag} given up")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommError(f"{self.what}: nothing given within {timeout_s:g}s")
                self.cv.wait(min(left, POLL_S))
            if not self.q:
                raise CommError(f"{self.what}: {self.closed}")
            piece = self.q.popleft()
            self.held -= len(piece.body) if piece.owned else 0
        n = len(piece.body)
        if piece.tag != tag or n != size:
            self.close(f"{piece.tag} of {n} bytes given where {tag} of {size} was expected: "
                       "out of step")
            with self.cv:
                piece.done = True       # refused: its giver raises
                self.cv.notify_all()
            raise CommError(f"{self.what}: {self.closed}")
        ok = False
        try:
            body, at = np.frombuffer(piece.body, dtype=np.uint8), 0
            for x in parts:
                if len(x):
                    np.copyto(np.frombuffer(x, dtype=np.uint8), body[at:at + len(x)])
                    at += len(x)
            ok = True
        finally:
            with self.cv:
                piece.done, piece.ok = True, ok
                self.cv.notify_all()

    def close(self, why: str) -> None:
        with self.cv:
            if not self.closed:
                self.closed = why
            self.cv.notify_all()


class Pair:
    """A worker's connection to the server beside it, in memory."""

    def __init__(self, key: tuple):
        self.key = key
        self.up = Slot(f"worker {key[-1]}'s pieces to its co-located server")
        self.down = Slot(f"the co-located server's answers to worker {key[-1]}")

    def close(self, who: str) -> None:
        """Either side's end: the other's waits raise; the pair is forgotten."""
        for s in (self.up, self.down):
            s.close(f"{who} closed its end")
        with _lock:
            if _pairs.get(self.key) is self:
                del _pairs[self.key]


def pair(ip: str, port: int, worker: int) -> Pair:
    """The pair between the server at ip:port in this process and `worker`,
    made by whichever side comes first."""
    key = (ip, int(port), int(worker))
    with _lock:
        p = _pairs.get(key)
        if p is None:
            p = _pairs[key] = Pair(key)
        return p
