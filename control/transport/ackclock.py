# SPDX-License-Identifier: Apache-2.0
"""The ACK-clocked sender (`Endpoint(sender="xdp")`, docs/transport.md).

Python hands the round's payload and send order to the XDP program
(dataplane/xdp/clockmaps.py) and primes each flow with a few DATA packets from
the socket; from then on every ACK the receiver's program sends back is
turned by this host's program into the flow's next chunk (XDP_TX), so no
user-space work is done per packet. The receiver's credit (a window in
packets, in every ACK; STOP when a flow has more in flight) sizes each flow.

Python keeps the policy, polling the maps about every POLL_S:
- growth: an ACK turns into at most one DATA, so a window grows only by a
  new send; while the credit exceeds what is in flight, positions are taken
  from the tail of the order and sent from the socket;
- recovery, RACK-style: each chunk has a send key (its order position when
  the clock sent it; for a socket send, the clock's position at that time);
  a chunk unacknowledged while one keyed more than REORDER later is acked
  was lost (its DATA or its ACK) and is re-sent from the socket, flagged
  RETX, taking the lost packet's place in flight; with no progress for an
  RTO, the oldest outstanding chunks are re-sent (tail loss). The RTO is
  RTO_MIN or PushOptions.rto_rtts round trips, whichever is longer, a round trip being
  the flow's packets in flight times its mean time between ACKs over the
  last round trip (Little's law; `_gap`): on a slow link a round trip is longer than RTO_MIN (two
  flows sharing 10 Mbit/s through a 30 kB queue: ~23 ms), and a fixed 2 ms
  RTO re-sent a window between every two ACKs, each re-send delaying the
  next ACK further (2,760 re-sends for 369 chunks);
- the end: every chunk acked, or the receiver closed the round (Early Close,
  the reliable class), or the timeout (a target that never answered, or
  whose last QUIET_SENDS RTO re-sends went unanswered, is a DeadPeerError).
"""
from __future__ import annotations

import time
from collections import deque

import numpy as np

from ...dataplane.xdp import clockmaps as C
from ...dataplane.xdp import wire as W
from ...errors import DeadPeerError
from .layout import FRAME_OVERHEAD
from .push import QUEUE_BACKOFF_S, RETX_BYTE, Push

INITIAL_WINDOW = 2  # packets a flow is primed with before it learned its credit
MAX_WINDOW = 64     # growth stops here when the receiver sets no credit
GROW_BATCH = 8      # most packets one poll adds to a window
REORDER = 3         # RACK's reordering allowance, in send keys
POLL_S = 0.00025    # poll period while Python's own sends (priming, growth, re-sends) are out
NAP_MAX = 0.001     # longest sleep while the clock runs on its own (RTO_MIN / 2)
RTO_MIN = 0.002     # s without progress before the oldest outstanding chunks are re-sent,
                    # or PushOptions.rto_rtts of the flow's round trips if longer
RTO_MAX = 0.25
RTO_MAX_FIXED = 0.05  # the back-off's cap under the fixed rule (rto_rtts 0)
_NONE = np.empty(0, dtype=np.int64)
QUIET_SENDS = 2     # RTO re-sends left unanswered in a row that make a target silent
RATE = W.OFF["rate"]
FLAGS_LO = W.OFF["flags"] + 1
assert W.F_CLOCK < 0x100


class ClockPush(Push):
    """One push through the ACK clock (planned like a `Push`: order,
    headers, iovecs; the headers carry LTP_F_CLOCK). The send buffer is
    written into the program's maps when planned, so `buf` may change after
    that; the bank's previous round must be done.

    Its knobs (recovery, poll period, RTO rule) come from the push's
    options.PushOptions (`self.options`)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        s, lay, nt = self.sender, self.layout, len(self.targets)
        for h in self.hdrs:  # every planned header is clocked DATA
            np.frombuffer(h, dtype=np.uint8).reshape(lay.nchunks, W.HDR_LEN)[:, FLAGS_LO] |= \
                W.F_CLOCK
        C.load(s.maps, self.round_, np.frombuffer(memoryview(self.buf).cast("B"), np.uint8),
               self.order, self.crit, s.chunk_bytes)
        nch = lay.nchunks
        self.pos_of = np.empty(nch, dtype=np.int64)
        self.pos_of[self.order] = np.arange(nch)
        self.order_arr = np.asarray(self.order, dtype=np.int64)
        # per target: send key of each chunk (-1: not sent by the socket yet)
        self.key = np.full((nt, nch), -1, dtype=np.int64)
        self.seq = [0] * nt  # the last key a socket send took (from the clock's position on)
        self.base_flags = W.F_RELIABLE if self.reliable else 0
        self.max_over_credit = 0
        self.stops = 0

    # ------------------------------------------------------------------ send
    def send(self):
        self._start()
        s, nch, nt = self.sender, self.layout.nchunks, len(self.targets)
        bank = s.maps.bank_index(self.round_)
        self.txv = s.maps.tx[bank]
        w0 = min(nch, max(1, min(s.prime_window(t, INITIAL_WINDOW) for t in self.targets)))
        for slot in self.slots:
            C.start(s.maps, self.round_, slot, nchunks=nch, last_len=self.layout.last_len,
                    flags=self.base_flags, primed=w0, rack=self.options.xdp_recovery)
        self.rack = bool(self.txv[self.slots[0]]["rack"])
        self._prime(w0)
        self.progress_t = [self.t0] * nt
        self.heard = [0] * nt
        self.heard_t = [self.t0] * nt  # when its acked count last grew
        self.quiet = [0] * nt          # RTO re-sends since then
        self.first_ack = [(0.0, 0)] * nt  # when its first ACKs were seen, and how many
        # the mean time between a target's ACKs the RTO goes by (`_gap`): the
        # last push's until this one has its own (0: none)
        self.hint = [s.ack_gap(t) for t in self.targets]
        self.gap = list(self.hint)
        # a first push's gap before it has one: a frame's time at the sender's
        # rate (its link's, or its share of the receiver's)
        self.frame_s = (s.chunk_bytes + FRAME_OVERHEAD) * 8 / max(1.0, s.initial_rate_bps)
        self.marks = [deque() for _ in self.targets]  # (when, acked count) at its progress
        self.w0 = w0
        self.rto = [self._rto(i, w0) for i in range(nt)]
        self.low_window = [0] * nt
        try:
            self._run(nt)
        finally:
            for slot in self.slots:
                C.stop(s.maps, self.round_, slot)
        s.learn_windows(self.targets, self.low_window)
        s.learn_gaps(self.targets, [self._mean_gap(i) for i in range(nt)])
        return s.learned(self, self._clock_report())

    def _run(self, nt: int) -> None:
        """Poll until every target is done (or the timeout). A poll that
        finds nothing for this loop to do reads a few counters and sleeps
        (`_idle`); the others read the ACK bitmaps and tend each target."""
        s = self.sender
        while True:
            s.maps.beat()  # this endpoint's control thread runs (a hung receiver)
            now = time.perf_counter()
            if now - self.t0 <= self.timeout_s and self._idle(now):
                time.sleep(self._nap(False, now))
                continue
            closed = [bool(self.txv[sl]["closed"]) for sl in self.slots]
            if self._settle(closed, self.acked()):
                return
            acked, now = self._acked_bits(), time.perf_counter()
            if now - self.t0 > self.timeout_s:
                self._timeout(acked, now)
                return
            busy = False
            for i in range(nt):
                if not self.done_t[i]:
                    busy |= self._tend(i, acked[i], now)
            time.sleep(self._nap(busy, now))

    def _idle(self, now: float) -> bool:
        """True when no open target needs this loop now, judged from the tx
        row's counters alone: not closed, not all acked, nothing of this
        loop's own outstanding, no RTO due, no room to grow. Keeps the
        acked-count bookkeeping (`heard`, the RTO's clock) and the credit's."""
        if not self.rack:  # every loss is this loop's to find (RACK over all chunks)
            return False
        nch = self.layout.nchunks
        for i, slot in enumerate(self.slots):
            if self.done_t[i]:
                continue
            t = self.txv[slot]
            n = int(t["acked"])
            if t["closed"] or n >= nch or self.own[i].size:
                return False
            window, inflight = self._heard(i, t, n, now)
            if now - self.progress_t[i] > self.rto[i] or \
                    self._room(window, inflight, int(t["tail"]), int(t["next"])):
                return False
        return True

    def _heard(self, i: int, t, n_acked: int, now: float) -> tuple[int, int]:
        """Target i's bookkeeping from its tx row `t` and acked count: the
        credit (the smallest seen; past the first ACK, in flight never
        exceeds it) and, when the count grew, the RTO's clock. Returns the
        credit and the packets in flight."""
        window, inflight = int(t["window"]), max(0, int(t["added"]) - int(t["consumed"]))
        if window:
            self.low_window[i] = int(t["window_min"])
            if self.heard[i]:
                self.max_over_credit = max(self.max_over_credit, inflight - window)
        if n_acked != self.heard[i]:
            if not self.heard[i]:
                self.first_ack[i] = (now, n_acked)
            else:
                self._gap(i, n_acked, now, inflight)
            self.heard[i], self.progress_t[i] = n_acked, now
            self.rto[i] = self._rto(i, inflight)
            self.heard_t[i], self.quiet[i] = now, 0
        return window, inflight

    def _gap(self, i: int, n_acked: int, now: float, inflight: int) -> None:
        """Target i's mean ACK gap, after its acked count grew past the
        first ACKs: over the last round trip's ACKs (at least the packets in
        flight: a flow's ACKs come in bursts as its window crosses a shared
        queue, and the time between bursts counts; a stall counts for one
        round trip, not for the rest of the push), once the primed window is
        behind it (those packets left back to back, so their ACKs come at
        the bottleneck's rate, not at the flow's share). Until then the last
        push's mean gap, else (a first push) the mean since the first ACK."""
        t1, n1 = self.first_ack[i]
        dq, span = self.marks[i], max(1, inflight)
        if n_acked >= n1 + self.w0:
            dq.append((now, n_acked))
            while len(dq) > 1 and dq[1][1] <= n_acked - span:
                dq.popleft()
            tk, nk = dq[0]
            if nk <= n_acked - span:
                self.gap[i] = (now - tk) / (n_acked - nk)
                return
        if not self.hint[i]:
            self.gap[i] = (now - t1) / (n_acked - n1)

    def _mean_gap(self, i: int) -> float:
        """Target i's mean ACK gap over this push (0: fewer than two ACK
        counts): what the next push goes by until it has its own. Not the
        last round trip's: a flow that ended alone on the link saw its gap
        shrink to the bottleneck's, and the next push starts shared again."""
        t1, n1 = self.first_ack[i]
        return (self.heard_t[i] - t1) / (self.heard[i] - n1) if self.heard[i] > n1 else 0.0

    def _rto(self, i: int, inflight: int) -> float:
        """Target i's RTO: options.rto_rtts round trips (in flight x its mean ACK
        gap, `_gap`; a first push before its second ACK count: a frame's
        time at the sender's rate), at least RTO_MIN."""
        if not self.options.rto_rtts:
            return RTO_MIN
        gap = self.gap[i] or self.frame_s
        return min(RTO_MAX, max(RTO_MIN, self.options.rto_rtts * max(1, inflight) * gap))

    @staticmethod
    def _room(window: int, inflight: int, tail: int, nxt: int) -> int:
        """Packets a window may grow by now: under the credit (MAX_WINDOW
        when the receiver sets none) with positions left at the tail."""
        if not window or tail <= nxt:
            return 0
        return max(0, (window if window != 0xffff else MAX_WINDOW) - inflight)

    def _nap(self, busy: bool, now: float) -> float:
        """How long to sleep before the next poll: POLL_S while this loop's
        own sends are outstanding; else half the time the slowest unfinished
        target needs at its ACK rate so far, within POLL_S..NAP_MAX (a
        credit that grew when other flows finished is acted on within 1 ms,
        and the RTO is never overslept by more than half)."""
        if self.options.poll_s is not None:
            return self.options.poll_s
        if busy:
            return POLL_S
        elapsed, nch, eta = now - self.t0, self.layout.nchunks, 0.0
        for i, heard in enumerate(self.heard):
            if not self.done_t[i]:
                eta = max(eta, (nch - heard) * elapsed / heard if heard else NAP_MAX)
        return min(NAP_MAX, max(POLL_S, 0.5 * eta))

    def _acked_bits(self) -> list[np.ndarray]:
        nch = self.layout.nchunks
        return [np.unpackbits(w.view(np.uint8), bitorder="little")[:nch].astype(bool)
                for w in self.words]

    # ---------------------------------------------------------------- priming
    def _prime(self, w0: int) -> None:
        """The first w0 positions, from the socket: to the group once if
        there is one, else to each target."""
        first = [int(c) for c in self.order[:w0]]
        tgts = [len(self.targets)] if self.group else range(len(self.targets))
        for i in range(len(self.targets)):
            self.key[i, first] = self.pos_of[first]
        # per target, the chunks this loop sent that are not known acked yet
        self.own = [np.asarray(first, dtype=np.int64) for _ in self.targets]
        for t in tgts:
            self._stamp(t, first, w0, 0)
            self._send_chunks(t, first)
        self.passes = 1

    def _send_chunks(self, tgt: int, chunks: list[int]) -> None:
        """Send chunks to target tgt from the socket, in GSO batches (the
        short last chunk ends a batch); waits out a full local queue."""
        short = self.layout.nchunks - 1 if self.layout.last_len != self.sender.chunk_bytes else -1
        batch: list[int] = []
        for c in chunks + [None]:
            if c is not None:
                batch.append(c)
            if batch and (c is None or c == short or len(batch) >= 16):
                while not self._send_batch(tgt, batch):
                    time.sleep(QUEUE_BACKOFF_S)
                    if time.perf_counter() - self.t0 > self.timeout_s:
                        return
                self.sent += len(batch)
                batch = []

    def _stamp(self, tgt: int, chunks: list[int], inflight: int, stops: int) -> None:
        """Write the clock stamp into the chunks' headers toward tgt."""
        hv = self.hdr_u8[tgt]
        hv[chunks, RATE:RATE + 4] = np.frombuffer(
            W.clock_stamp(inflight, stops).to_bytes(4, "big"), dtype=np.uint8)

    # ---------------------------------------------------------------- tending
    def _tend(self, i: int, acked: np.ndarray, now: float) -> bool:
        """One poll of target i: credit bookkeeping, losses, growth. True if
        it sent (a re-send or growth) or has sends of its own outstanding:
        the next poll should come soon (RACK over them)."""
        t, slot = self.txv[self.slots[i]], self.slots[i]
        nxt, tail = int(t["next"]), int(t["tail"])
        stops = int(t["stops"])
        window, inflight = self._heard(i, t, int(acked.sum()), now)
        own = self.own[i]
        if own.size:
            own = self.own[i] = own[~acked[own]]
        lost, keyed = _NONE, None
        # what XDP sent last is XDP's to recover (RACK in XDP): with nothing of
        # this loop's own outstanding there is nothing to judge (the cheap poll)
        if own.size or not self.rack:
            key_now, sent = keyed = self._keyed(i, nxt, tail)
            mine = (~C.xdp_owned(self.sender.maps, self.round_, slot, len(key_now))
                    if self.rack else sent)
            lost = self._lost(key_now, sent, acked, mine)
        if lost.size == 0 and now - self.progress_t[i] > self.rto[i]:  # the RTO is for all
            key_now, sent = keyed or self._keyed(i, nxt, tail)
            out = np.flatnonzero(sent & ~acked)  # tail loss: the oldest outstanding
            lost = out[np.argsort(key_now[out])][:max(2, window or 2)]
            cap = RTO_MAX if self.options.rto_rtts else RTO_MAX_FIXED
            self.progress_t[i], self.rto[i] = now, min(cap, self.rto[i] * 1.5)
            self.quiet[i] += 1
        if lost.size:
            self._resend(i, lost.tolist(), nxt, inflight, stops)
        room = self._room(window, inflight, tail, nxt)
        if room:
            pos = C.take_tail(self.sender.maps, self.round_, slot, min(room, GROW_BATCH))
            if pos:
                chunks = self.order_arr[pos].tolist()
                self._keys(i, chunks, nxt)
                self._stamp(i, chunks, inflight + len(pos), stops)
                self._send_chunks(i, chunks)
                return True
        return bool(lost.size) or bool(self.own[i].size)

    def _keys(self, i: int, chunks: list[int], nxt: int) -> None:
        """Send keys for chunks the socket sends now: after every key taken
        so far and from the clock's position on, in sending order."""
        first = max(self.seq[i], nxt) + 1
        self.key[i, chunks] = np.arange(first, first + len(chunks))
        self.seq[i] = first + len(chunks) - 1
        self.own[i] = np.union1d(self.own[i], np.asarray(chunks, dtype=np.int64))  # a set

    def _keyed(self, i: int, nxt: int, tail: int) -> tuple[np.ndarray, np.ndarray]:
        """Each chunk's send key toward target i now (-1: not sent), and
        whether it was sent: the socket's keys, else the order position of
        what XDP has handed out."""
        key = self.key[i]
        handed = self.pos_of < min(nxt, tail)
        key_now = np.where(key >= 0, key, np.where(handed, self.pos_of, -1))
        return key_now, key_now >= 0

    @staticmethod
    def _lost(key: np.ndarray, sent: np.ndarray, acked: np.ndarray,
              mine: np.ndarray) -> np.ndarray:
        """RACK: chunks of `mine` still unacked while one keyed more than
        REORDER later was acked."""
        ack_keys = key[sent & acked]
        if ack_keys.size == 0:
            return ack_keys
        return np.flatnonzero(sent & mine & ~acked & (key < ack_keys.max() - REORDER))

    def _resend(self, i: int, chunks: list[int], nxt: int, inflight: int, stops: int) -> None:
        """Re-send lost chunks to target i from the socket, flagged RETX; each
        takes its lost packet's place in flight."""
        if self.rack:  # from now on this loop recovers them, not XDP
            C.take_over(self.sender.maps, self.round_, self.slots[i], chunks)
        self._keys(i, chunks, nxt)
        self.hdr_u8[i][chunks, RETX_BYTE] |= W.F_RETX
        self._stamp(i, chunks, inflight, stops)
        self._send_chunks(i, chunks)
        self.resent += len(chunks)

    # -------------------------------------------------------------------- end
    def _timeout(self, acked: list[np.ndarray], now: float) -> None:
        """At the timeout: DeadPeerError if a target never answered, or fell
        silent (its last QUIET_SENDS re-sends after an RTO unanswered: a dead
        or hung receiver), else the rule for critical chunks."""
        dead = [i for i, d in enumerate(self.done_t) if not d
                and (not self.heard[i] or self.quiet[i] >= QUIET_SENDS)
                and not bool(self.txv[self.slots[i]]["closed"])]
        if dead:
            who = ", ".join(f"{self.targets[i].ip} (worker {self.targets[i].worker})"
                            for i in dead)
            rep = self._clock_report()
            quiet = now - min(self.heard_t[i] for i in dead)
            raise DeadPeerError(
                f"round {self.round_}: no answer from {who} for {quiet:.1f}s "
                f"({rep.sent} packets sent, {rep.acked} acked): the peer is dead, unreachable, "
                f"or not taking round {self.round_} with this job's secret",
                peers=[self.targets[i] for i in dead], report=rep)
        self._check_critical(self.acked())

    def _clock_report(self):
        rep = self._report()
        clocked = sum(int(self.txv[s]["sent"]) for s in self.slots)
        rep.sent += clocked
        rep.sender, rep.clock_tx, rep.max_over_credit = "xdp", clocked, self.max_over_credit
        rep.stops = sum(int(self.txv[s]["stops"]) for s in self.slots)
        rep.clock_retx = sum(int(self.txv[s]["rexmit"]) for s in self.slots)
        return rep
