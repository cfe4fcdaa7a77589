# SPDX-License-Identifier: Apache-2.0
"""A step's answer over the TCP transport, sent in parts as its rounds are
summed (link_tcp.TcpServerLink.stream; the LTP links' is transport/stream.py).

The answer to a step of several rounds is its rounds' sums side by side,
written in round order: the part that answers round i is final once round i
is summed, while the workers still push round i+1. Sent whole after the last
round, the answer's bytes (the whole gradient, to every worker) wait for the
step's last push, and a worker reads them only then. A `TcpAnswerStream`
writes each part as it becomes final, on a thread of its own: the same
header and the same bytes in the same order as a whole `send`, so a worker
reads it as before, and one that reads early (exchange.py: a worker whose
answer buffer is known when its op starts) has most of it by the end of its
last push. A worker in the server's own process takes the parts one by one
(handoff.py).

Over TCP a stream cannot fall back to sending the answer whole: part of it
is already in the workers' streams. A part that fails ends the server with
the error (LtpError, not a TransportError server.py would answer by sending
the answer again).
"""
from __future__ import annotations

import threading

import numpy as np

from ...errors import LtpError

JOIN_S = 5.0    # an aborted stream's thread is waited for this long


class TcpAnswerStream:
    """Answer d (`buf`, float32, final when `finish` is called) to every worker
    of `link`, part by part: `feed`, `finish`, `abort` (transport/stream.py's
    calls). `send(first, lo, hi)` writes bytes [lo, hi) of buf (with the
    header before them when `first`) to every worker and returns once each
    has them."""

    sign_s = 0.0     # no signature over TCP: the connection is the worker's (hello)

    def __init__(self, d: int, buf: np.ndarray, send):
        self.d, self.n, self.send = d, len(buf), send
        self.ready = self.sent = 0       # elements final; elements sent
        self.parts = 0
        self.error: BaseException | None = None
        self.closing = self.aborted = False
        self.cv = threading.Condition()
        self.thread = threading.Thread(target=self._run, name=f"ltpx-tcp-answer-{d}",
                                       daemon=True)
        self.thread.start()

    def feed(self, nelems: int) -> None:
        """buf[:nelems] is final: send what of it is not sent yet."""
        with self.cv:
            self.ready = max(self.ready, min(nelems, self.n))
            self.cv.notify()

    def _run(self) -> None:
        while True:
            with self.cv:
                while self.ready <= self.sent and not self.closing:
                    self.cv.wait()
                if self.aborted or (self.ready <= self.sent and self.sent > 0):
                    return
                lo, hi = self.sent, self.ready
            try:
                self.send(lo == 0, lo * 4, hi * 4)
            except BaseException as e:    # finish() raises it on the server's thread
                self.error = e
                return
            with self.cv:
                self.sent = hi
                self.parts += 1
                if hi == self.n:
                    return

    def finish(self) -> None:
        """The whole answer is final: send the rest; raise what a part met."""
        with self.cv:
            self.ready, self.closing = self.n, True
            self.cv.notify()
        self.thread.join()
        if self.error is not None:
            raise LtpError(f"answer {self.d}'s stream to the workers failed after "
                           f"{self.sent * 4} of {self.n * 4} bytes: {self.error}") from self.error

    def abort(self) -> None:
        """The op failed: stop after the part under way."""
        with self.cv:
            self.aborted = self.closing = True
            self.cv.notify()
        self.thread.join(JOIN_S)
