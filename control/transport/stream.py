# SPDX-License-Identifier: Apache-2.0
"""A reliable round sent in parts as its buffer fills: the server's answer
to a step, streamed while the step's later rounds still come in.

A step's answer is its rounds' sums side by side, written in round order:
the part that answers round i is final once round i is gathered, while the
workers still push round i+1. Sent whole after the last round, the answer
waits for the uplink and the uplink then waits for it: the server's port
carries the step's bytes in, then the answer out, one after the other. An
`AnswerStream` sends each part as it becomes final (`feed`), on a thread
of its own, so the answer goes out through the port's other direction
while the next rounds come in, and only the last part (and the step's
report, `finish`) waits for the last round.

It is one push of one round (one `tx_start`, one set of ACK bits, the
group address once for every worker): each part restricts the push to the
chunks wholly inside the final prefix that no part sent yet, and runs it
until every target has them (re-sends included). A worker takes the parts
as any reliable round, in any order, and its round completes with the
last; what a worker reads from the early parts' arrival is that the
uplink rounds they answer are over (stream.answered_from).

With a signer, the signature's SHA-256 pieces are taken as the parts
become final (signing.StreamSigner), so the last part waits only for the
hash of what came after the last whole piece.

A part that fails (a target silent for the push's time limit) stops the
stream: `finish` raises the error, and the caller sends the answer whole
again as it would have without a stream.
"""
from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from .results import Peer


class AnswerStream:
    """Round `round_` of `buf` (float32, final when `finish` is called) to
    `to`, reliably, part by part (see the module docstring). `signer`, a
    signing.StreamSigner: the last SIG_ELEMS elements of buf are its
    signature of the rest, written by `finish`."""

    def __init__(self, ep, round_: int, buf: np.ndarray, to: list[Peer], *,
                 group: tuple[str, int] | None, timeout_s: float, signer=None,
                 share: float = 1.0):
        self.push = ep.prepare_push(
            round_, buf, to, reliable=True, timeout_s=timeout_s, group=group,
            options=dataclasses.replace(ep.sender.options, sender="socket"))
        self.buf, self.signer, self.share = buf, signer, share
        self.planned = list(self.push.order)      # the round's chunk order, every chunk
        self.ce, self.nch = self.push.layout.chunk_elems, self.push.layout.nchunks
        self.body = self.nch if signer is None else signer.n // self.ce   # chunks before the sig
        self.ready = self.sent = 0                # chunks final; chunks a part took
        self.parts = 0                            # parts sent (the last included)
        self.sign_s = 0.0                         # finish's wait for the signature
        self.error: BaseException | None = None
        self.closing = self.aborted = False
        self.cv = threading.Condition()
        self.thread = threading.Thread(target=self._run, name=f"ltpx-answer-{round_}",
                                       daemon=True)
        self.thread.start()

    def feed(self, nelems: int) -> None:
        """buf[:nelems] is final: send the whole chunks inside it not sent yet."""
        with self.cv:
            self.ready = max(self.ready, min(nelems // self.ce, self.body))
            self.cv.notify()

    def _run(self) -> None:
        while True:
            with self.cv:
                while self.ready <= self.sent and not self.closing:
                    self.cv.wait()
                if self.ready <= self.sent or self.aborted:
                    return
                lo, hi = self.sent, self.ready
                # at `share` while later rounds may still come in; once finish
                # is called the last of them is in: the full rate
                self.push.share = 1.0 if self.closing or hi >= self.body else self.share
            try:
                self._part(lo, hi)
            except BaseException as e:   # finish() raises it on the caller's thread
                self.error = e
                return
            with self.cv:
                self.sent = hi

    def _part(self, lo: int, hi: int) -> None:
        """Chunks [lo, hi) until every target has them."""
        if self.signer is not None:
            self.signer.feed(self.buf, hi * self.ce)
        p = self.push
        p.order = [c for c in self.planned if lo <= c < hi]
        p.restrict(p.order)
        p.send()
        self.parts += 1

    def finish(self) -> None:
        """The rest of the round (buf is final now: its report and, signed,
        its signature), once the parts before it are sent; raises the error
        that stopped the stream, if one did. A part still going speeds up to
        the full rate (the pacer reads `share` at its next look at the ACKs)."""
        self._stop(full_rate=True)
        if self.error is not None:
            raise self.error
        if self.signer is not None:
            t0 = time.perf_counter()
            self.signer.sign_into(self.buf)
            self.sign_s = time.perf_counter() - t0
        if self.sent < self.nch:
            self._part(self.sent, self.nch)
            self.sent = self.nch

    def abort(self) -> None:
        """Stop the stream (the op failed): no part starts after this, and the
        part in flight ends after its current pass."""
        self.push.over = lambda: True
        self._stop(abort=True)

    def _stop(self, full_rate: bool = False, abort: bool = False) -> None:
        with self.cv:
            self.closing = True
            self.aborted = self.aborted or abort
            if full_rate:
                self.push.share = 1.0
            self.cv.notify()
        self.thread.join()


def answered_from(ep, round_: int, chunk: int) -> bool:
    """True once any chunk of reliable round_ (open on `ep`) at index `chunk`
    or later arrived. A streamed answer's part for uplink round i starts at
    the chunk holding round i's first element, and is sent only once round
    i is over (the server gathered it), as is all that follows it; so such an
    arrival proves round i over, although earlier parts prove nothing of it."""
    return ep.arrived_from(round_, chunk)
