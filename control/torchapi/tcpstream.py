# SPDX-License-Identifier: Apache-2.0
"""A step's answer over the TCP links, streamed both ways (link_tcp.py).

Server: a step's answer is its rounds' sums side by side, each part final
once its round is gathered (server.py feeds it). Sent whole after the last
round, the answer waits for the uplink and the next step's uplink waits
for it. `TcpAnswerStream` writes the header at once and each final part as
it comes, on a thread of its own, to every worker's connection (its
direction out is free while the main thread reads the next round in).

Worker: it pushes its buckets before it takes the answer, so the parts
sent meanwhile would sit in its socket's receive buffer until that fills
(a few MB), and the server's stream would stall on it. `AnswerReader`
reads each expected answer on a thread of its own, into a buffer of its
own, from the moment the answer is expected (before the first push);
`pull` waits for it and copies it out.

Both keep the wire format of a whole answer (one header, then the body):
a server that sends answers whole and a worker that reads them in one
piece still speak to either side.
"""
from __future__ import annotations

import threading
from collections import deque

import numpy as np

from ...errors import CommError


class TcpAnswerStream:
    """Answer d (float32 buf) to the link's connections `idx`, in parts
    (feed, finish, abort, as transport/stream.AnswerStream)."""

    retry_whole = False   # a failed part is a broken connection: nothing to send again
    sign_s = 0.0          # TCP answers are not signed (the connections' hellos are MAC'd)

    def __init__(self, link, d: int, buf: np.ndarray, idx: list[int]):
        self.link, self.idx = link, idx
        self.body = memoryview(np.ascontiguousarray(buf)).cast("B")
        self.hdr = link.header(d, len(self.body))
        self.total = len(self.hdr) + len(self.body)
        self.sent = [0] * len(link.conns)        # bytes of header and body, per connection
        self.ready = len(self.hdr)               # what may go: the header at once
        self.done = 0                            # what every target has
        self.parts = 0
        self.error: BaseException | None = None
        self.closing = False
        self.cv = threading.Condition()
        self.thread = threading.Thread(target=self._run, name=f"ltpx-tcp-answer-{d}",
                                       daemon=True)
        self.thread.start()

    def feed(self, nelems: int) -> None:
        """buf[:nelems] is final."""
        with self.cv:
            self.ready = max(self.ready, len(self.hdr) + 4 * nelems)
            self.cv.notify()

    def _run(self) -> None:
        while True:
            with self.cv:
                while self.ready <= self.done and not self.closing:
                    self.cv.wait()
                if self.ready <= self.done or self.closing:
                    return
                hi = self.ready
            try:
                self._part(hi)
            except BaseException as e:   # finish() raises it on the caller's thread
                self.error = e
                return

    def _part(self, hi: int) -> None:
        self.link.send_upto(self.idx, self.hdr, self.body, self.sent, hi)
        self.done = hi
        self.parts += 1

    def finish(self) -> None:
        """The rest (buf is final now), once the parts before it are sent;
        raises the error that stopped the stream, if one did."""
        self._stop()
        if self.error is not None:
            raise self.error
        if self.done < self.total:
            self._part(self.total)

    def abort(self) -> None:
        self._stop()

    def _stop(self) -> None:
        with self.cv:
            self.closing = True
            self.cv.notify()
        self.thread.join()


class AnswerReader:
    """A worker's answers, read from `sock` on a thread of its own as each
    is expected (`expect`, in the server's order), each into a buffer of
    its own; `take` waits for one and hands its buffer over."""

    def __init__(self, sock, read_header, recv_into):
        self.sock, self.read_header, self.recv_into = sock, read_header, recv_into
        self.queue: deque[tuple[int, int]] = deque()     # (answer, bytes) to read, in order
        self.got: dict[int, np.ndarray | BaseException] = {}
        self.free: list[np.ndarray] = []                 # buffers taken back (take_back)
        self.cv = threading.Condition()
        self.closing = False
        self.thread = threading.Thread(target=self._run, name="ltpx-tcp-answers", daemon=True)
        self.thread.start()

    def expect(self, d: int, nbytes: int) -> None:
        with self.cv:
            self.queue.append((d, nbytes))
            self.cv.notify()

    def _buffer(self, nbytes: int) -> np.ndarray:
        with self.cv:
            for i, b in enumerate(self.free):
                if b.nbytes >= nbytes:
                    return self.free.pop(i)[:nbytes // 4]
        return np.empty(nbytes // 4, dtype=np.float32)

    def _run(self) -> None:
        while True:
            with self.cv:
                while not self.queue and not self.closing:
                    self.cv.wait()
                if self.closing:
                    return
                d, nbytes = self.queue[0]
            try:
                self.read_header(d, nbytes)
                buf = self._buffer(nbytes)
                self.recv_into(buf, nbytes)
                out: np.ndarray | BaseException = buf
            except BaseException as e:   # take() raises it for this answer and the rest
                out = e if isinstance(e, CommError) else CommError(f"answer {d}: {e}")
            with self.cv:
                self.queue.popleft()
                self.got[d] = out
                self.cv.notify_all()
                if isinstance(out, BaseException):
                    while self.queue:
                        self.got[self.queue.popleft()[0]] = out
                    return

    def take(self, d: int, timeout_s: float | None) -> np.ndarray:
        """Answer d's words (the caller gives the buffer back with take_back);
        timeout_s None: as long as the reader goes on (each of its reads has
        the socket's time limit)."""
        with self.cv:
            if not self.cv.wait_for(lambda: d in self.got or self.closing, timeout_s):
                raise CommError(f"answer {d}: nothing complete from the server within "
                                f"{timeout_s:g}s")
            if d not in self.got:
                raise CommError(f"answer {d}: the connection was closed")
            out = self.got.pop(d)
        if isinstance(out, BaseException):
            raise out
        return out

    def take_back(self, buf: np.ndarray) -> None:
        with self.cv:
            if len(self.free) < 2:
                self.free.append(buf if buf.base is None else buf.base)

    def close(self) -> None:
        """Stop the thread (the caller shuts the socket, which ends a read)."""
        with self.cv:
            self.closing = True
            self.cv.notify_all()
        self.thread.join(timeout=2.0)
