# SPDX-License-Identifier: Apache-2.0
"""Sending a round: a `Push` plans one round's packets to one or more targets
and sends them, paced, re-sending what is lost while the receivers want it."""
from __future__ import annotations

import errno
import functools
import math
import operator
import time

import numpy as np

from ...dataplane.xdp import wire as W
from ...dataplane.xdp.mapstructs import TX_CLOSED as CLOSED, TX_RATE as RATE
from ...errors import DeadPeerError, TransportError
from . import fec
from .layout import FRAME_OVERHEAD, ChunkLayout
from .lossdetect import Backoff, BatchPicker, LossDetector, group_pass, only_lacks, pass_runs
from .options import DEFAULTS, PushSpec
from .rate import Pacer
from .results import Peer, PushReport

UDP_SEGMENT = 103  # linux/udp.h: GSO segment size, per sendmsg
TAIL_WAIT = 0.002  # after a pass, the longest its last ACKs may take before a re-send pass
TAIL_MIN = 0.0005  # ... and the shortest (see Push.tail_wait)
TAIL_POLL = 0.0002  # how often the ACKs are read meanwhile
QUEUE_BACKOFF_S = 0.0002   # a full local send queue: the wait before a batch is tried again
RETX_BYTE = W.OFF["flags"] + 1   # a re-send's flag, set in place: RETX (< 0x100) in flags' low byte
assert W.F_RETX < 0x100


def data_headers(job: int, round_: int, worker: int, nch: int, flags: np.ndarray,
                 layout: ChunkLayout, token: int = 0) -> np.ndarray:
    """The DATA headers of a round for one target, as one byte array."""
    h = np.zeros(nch, dtype=W.HDR_DTYPE)
    h["magic"], h["version"], h["type"] = W.MAGIC, W.VERSION, W.T_DATA
    h["flags"], h["worker"], h["job"], h["round"] = flags, worker, job, round_
    h["token"], h["chunk"], h["nchunks"], h["len"] = token, np.arange(nch), nch, layout.chunk_bytes
    h["len"][-1] = layout.last_len
    return h.view(np.uint8)


class Push:
    """One push of one round to one or more targets (made by sender.Sender.prepare).

    Planned when made, so it can be made ahead of a barrier: the chunk order
    (random per round), every header, the iovec pieces. `send` then runs
    passes until every target closed the round or acknowledged every chunk.
    `buf` (kept here: the pieces point into it) must not change until then.

    `over`, when set (Endpoint.push), says from outside that the round is
    over for every target although no ACK said so: the caller saw the
    receiver answer the op the round belongs to, which it does only once
    the round is closed. A sender whose last ACKs were lost learns it no
    other way once the receiver's bank holds a newer round (stale DATA is
    dropped unACKed)."""

    over = None                   # a callable: True once the round is over everywhere
                                  # (PushSpec.over; stream.py ends a stopped part with it)
    overtaken = False             # the push ended by `over`
    coded = None                  # (fec.Plan, parity per group) of a coded reliable push
    first_loss = None             # the worst target's loss in the first pass
    only = None                   # bit c: chunk c is this push's (restrict); None: all are
    tolerant = False              # only critical chunks are re-sent at once (restrict)
    after_pass = None             # called with the push after each pass (defer.py)
    share = 1.0                   # of the advertised rate this push takes (stream.py)

    def __init__(self, sender, round_: int, buf: np.ndarray, layout: ChunkLayout,
                 targets: list[Peer], crit: np.ndarray, spec: PushSpec, why: str = ""):
        self.sender, self.round_, self.buf, self.layout = sender, round_, buf, layout
        self.options = spec.options or DEFAULTS   # the ACK clock's knobs (a socket push: none)
        self.targets, self.crit, self.sender_why = targets, crit, why   # why: Sender.prepare's
        self.reliable, self.timeout_s, self.over = spec.reliable, spec.timeout_s, spec.over
        seed, group = spec.seed, spec.group
        self.group = group is not None  # the last of hdrs/addrs/pieces is the group
        self.alone = sender.group_alone   # what one target alone lacks goes to it
        self.slots = [sender.peers[t.worker] for t in targets]
        # per target: (its DATA's token, its ACKs' token), this flow's own
        self.tokens = [sender.tokens.send(round_, t.worker) for t in targets]
        for s, (dtok, atok) in zip(self.slots, self.tokens):
            sender.maps.tx_start(round_, s, atok, nchunks=layout.nchunks, dtoken=dtok)
        rng = np.random.default_rng(seed if seed is not None else
                                    (round_ * 1_000_003 + targets[0].worker) % 2**32)
        self.order = rng.permutation(layout.nchunks).tolist()
        self.hdrs, self.addrs = self._plan_headers(group)
        self.bodies = self._plan_bodies()
        self.pieces = self._plan_pieces()
        self.runs = self._first_runs()

    def code(self, plan, r: int) -> None:
        """Make this (reliable) push a coded one (fec.py): it sends the data
        and each group's first r parity chunks, a target is done once its
        ACKs show every group whole, and only groups that are not get re-sends."""
        self.coded = (plan, r)
        self.unsent = ~fec.sent_mask(plan, r)
        self.unsent_bits = int.from_bytes(np.packbits(self.unsent, bitorder="little").tobytes(),
                                          "little")
        self.order = [c for c in self.order if not self.unsent[c]]
        self.runs = self._first_runs()

    def restrict(self, chunks, tolerant: bool = False, copies: int = 1) -> None:
        """Send only `chunks`, done once they are acked, each `copies` times
        in the first pass; tolerant: a loss found in a pass is re-sent at
        once only if the chunk is critical (defer.py)."""
        keep = {int(c) for c in chunks}
        self.only, self.tolerant = sum(1 << c for c in keep), tolerant
        self.order = [c for c in self.order if c in keep] * copies
        self.runs = self._first_runs()

    def _first_runs(self) -> list[tuple[int, list[int]]]:
        """The first pass's runs: the whole order to the group (a group push),
        else to each target in turn."""
        nt = len(self.targets)
        return ([(nt, self.order)] if self.group else
                pass_runs(self.order, [0] * nt, [False] * nt))

    # ------------------------------------------------------------------ plan
    def _plan_headers(self, group: tuple[str, int] | None) -> tuple[list, list]:
        """Every header of the round, per target ([chunk] -> HDR_LEN bytes), and the addresses."""
        nch, lay, job, r = self.layout.nchunks, self.layout, self.sender.job, self.round_
        flags = np.full(nch, W.F_RELIABLE if self.reliable else 0, dtype=np.uint16)
        flags[self.crit] |= W.F_CRITICAL
        flags[-1] |= W.F_LAST
        hdrs = [memoryview(data_headers(job, r, t.worker, nch, flags, lay, tok))
                for t, (tok, _) in zip(self.targets, self.tokens)]
        addrs = [(t.ip, t.port) for t in self.targets]
        if group is not None:  # one more "target": the group, its headers flagged GROUP
            # (the round's group token: one frame reaches every member)
            gtok = self.sender.tokens.group(r) or 0
            hdrs.append(memoryview(data_headers(job, r, 0, nch, flags | W.F_GROUP, lay, gtok)))
            addrs.append((group[0], int(group[1])))
        return hdrs, addrs

    def _plan_bodies(self) -> list[memoryview]:
        payload, cb = memoryview(self.buf).cast("B"), self.sender.chunk_bytes
        return [payload[c * cb:c * cb + self.layout.chunk_len(c)]
                for c in range(self.layout.nchunks)]

    def _plan_pieces(self) -> list:
        """Per target and chunk, the two iovec pieces: header (its RETX flag is
        set in place from the second pass on) and payload. A group push
        sends to the group, re-sends included; the probes of a silent
        target go to it alone and build theirs as they go (pieces None)."""
        nt, hl, bodies = len(self.targets), W.HDR_LEN, self.bodies
        return [[(h[c * hl:(c + 1) * hl], bodies[c]) for c in range(self.layout.nchunks)]
                if not self.group or i == nt else None for i, h in enumerate(self.hdrs)]

    # ------------------------------------------------------------------ send
    def send(self) -> PushReport:
        """Send the push (see Endpoint.push).

        The loop runs once per system call, not once per chunk: each pass
        lists the chunks still unacknowledged at its start, and the pacer's
        tokens take the next few of them as one GSO batch. About once a
        millisecond it reads what the ACKs say: the rate and the closed flag
        from the tx map, and which chunks arrived (LossDetector judges them).
        A target silent through a pass gets later, smaller re-sends
        (lossdetect.Backoff) and, still silent at the timeout, DeadPeerError.
        In a group push, `sent` counts a group datagram once, while `acked`
        sums over targets."""
        self._start()
        sent_to: dict[int, int] = {}
        while True:
            closed = self.refresh()
            acked = self.acked()
            if self._settle(closed, acked):
                break
            now = time.perf_counter()
            self.backoff.listen(acked, closed, self.done_t, now, sent_to)
            if now - self.t0 > self.timeout_s:
                self._give_up(acked, now)
                break
            ready = self.backoff.ready(self.done_t, now)
            if not any(ready):   # every open target is silent: wait for its turn or an answer
                time.sleep(min(0.001, max(0.0, self.backoff.next_due(self.done_t) - now)))
                sent_to = {}
                continue
            sent_to = self._start_pass(acked, closed, ready)
            self._run_pass()
        return self.sender.learned(self, self._report())

    def _start(self) -> None:
        """Bind what the passes read: the tx map's rows, the ACK bitmaps, the pacer."""
        s, nch, nt = self.sender, self.layout.nchunks, len(self.targets)
        self.sock, self.gso = s.sock, s.gso
        bank = s.maps.bank_index(self.round_)
        txv = s.maps.tx[bank]
        self.tx32 = txv.view(np.uint32).reshape(txv.shape[0], -1)   # words: CLOSED, RATE
        nwords = -(-nch // 64)
        self.words = [s.maps.acked[bank, slot, :nwords] for slot in self.slots]
        self.full = (1 << nch) - 1 if self.only is None else self.only  # every chunk acked
        self.hdr_u8 = [np.frombuffer(h, dtype=np.uint8).reshape(nch, W.HDR_LEN) for h in self.hdrs]
        self.detectors = [LossDetector() for _ in range(nt)]
        short = nch - 1 if self.layout.last_len != s.chunk_bytes else -1  # must end a GSO batch
        self.picker = BatchPicker(nt if self.group else -1, short)
        self.done_t = [False] * nt
        # The lowest rate a target advertised: its share with every flow active,
        # the rate to start the next round at (shares grow as flows finish).
        self.low = [0] * nt
        self.sent = self.resent = self.passes = 0
        self.backoff = Backoff(nt, nch, time.perf_counter())
        # The first batch goes at once: the round starts on the barrier, not a pacing interval later.
        self.pacer = Pacer(s.start_rate(self.targets, self.group),
                           pkt_bytes=s.chunk_bytes + FRAME_OVERHEAD, full=True)
        self.t0 = time.perf_counter()

    def acked(self) -> list[int]:
        """The ACK state per target (bit c: chunk c acked); in a coded push,
        what it owes nothing for (fec.owed_bits)."""
        if self.coded is None:
            return self._raw_acked()
        if self.coded[1] == 0:   # no parity: a group is whole when its data is in
            return [a | self.unsent_bits for a in self._raw_acked()]
        return fec.owed_bits(self.coded[0], self.words, self.unsent)

    def _raw_acked(self) -> list[int]:
        return [int.from_bytes(w.tobytes(), "little") for w in self.words]

    def _measure_first_pass(self) -> None:
        """The first pass's loss toward the worst target, once (what the
        sender's next coded pushes choose their parity for)."""
        if self.first_loss is not None or not self.order:
            return
        sent = 0
        for c in self.order:
            sent |= 1 << c
        got = [(a & sent).bit_count() for a in self._raw_acked()]
        self.first_loss = 1.0 - min(got) / len(self.order)
        if self.reliable:
            self.sender.learn_loss(self.first_loss)

    def refresh(self) -> list[bool]:
        """Closed flags; sets the pacer to the sum of the advertised rates
        (their minimum in a group push: a group packet reaches every target at once)."""
        tx32, low = self.tx32, self.low
        self.sender.maps.beat()  # this endpoint's control thread runs (a hung receiver)
        closed = [bool(tx32[s, CLOSED]) for s in self.slots]
        rates = [int(tx32[s, RATE]) for s in self.slots]
        for i, r in enumerate(rates):
            if r and (not low[i] or r < low[i]):
                low[i] = r
        if all(rates):  # a group packet reaches every target at once
            self.pacer.set_rate((min(rates) if self.group else sum(rates)) * 1000 * self.share)
        return closed

    def detect_losses(self) -> list[int]:
        """The ACK state per target; queues the chunks found lost, flagged RETX."""
        acked, now = self.acked(), time.perf_counter()
        picker, hdr_u8 = self.picker, self.hdr_u8
        parity_repairs = self.coded is not None and self.passes <= 1
        grp = picker.grp
        for i, det in enumerate(self.detectors):
            lost = det.lost(acked[i], now)
            if parity_repairs:   # the first pass's parity is its repair: no re-sends yet
                continue
            for c in lost:       # a group push re-sends to the group: once for all it missed
                if self.tolerant and not self.crit[c]:
                    continue
                if grp < 0 or (self.alone and only_lacks(acked, self.done_t, i, c)):
                    picker.urgent.append((i, c))   # (a group push: every other target has it)
                    hdr_u8[i][c, RETX_BYTE] |= W.F_RETX
                elif picker.lost_to_group(c):
                    hdr_u8[grp][c, RETX_BYTE] |= W.F_RETX
        return acked

    def _settle(self, closed: list[bool], acked: list[int]) -> bool:
        """Mark the targets that are done; True once all are. CLOSED means the
        receiver is done: it closes a round only once its critical data is in
        (all of it, for a reliable round)."""
        done, full = self.done_t, self.full
        if self.over is not None and not all(done) and self.over():
            self.overtaken = True
            done[:] = [True] * len(done)
            return True
        for i, d in enumerate(done):
            if not d:
                done[i] = closed[i] or (acked[i] & full) == full
        return all(done)

    def _give_up(self, acked: list[int], now: float) -> None:
        """At the timeout: DeadPeerError if a target stayed silent, else the
        rule for critical chunks."""
        dead = self.backoff.dead(self.done_t)
        if dead:
            quiet = now - min(self.backoff.heard_at[i] for i in dead)
            who = ", ".join(f"{self.targets[i].ip} (worker {self.targets[i].worker})"
                            for i in dead)
            rep = self._report()
            raise DeadPeerError(
                f"round {self.round_}: no answer from {who} for {quiet:.1f}s ({rep.sent} "
                f"packets sent, {rep.acked} acked): the peer is dead, unreachable, or not "
                f"taking round {self.round_} with this job's secret",
                peers=[self.targets[i] for i in dead], report=rep)
        self._check_critical(acked)

    def _check_critical(self, acked: list[int]) -> None:
        """At the timeout: fail if a target lacks critical chunks (reliable: any)."""
        crit = np.flatnonzero(self.crit).tolist()
        if self.reliable or any(not all((a >> c) & 1 for c in crit) for a in acked):
            raise TransportError(
                f"round {self.round_}: critical chunks unacknowledged after "
                f"{self.timeout_s:g}s (targets {[t.ip for t in self.targets]})")

    def _start_pass(self, acked: list[int], closed: list[bool],
                    ready: list[bool]) -> dict[int, int]:
        """Start a pass to the `ready` targets (silent ones get a probe);
        returns the targets it goes to, each with the chunks it sends them."""
        if self.passes == 0:
            runs = self.runs  # made ready with the plan
            to = dict.fromkeys(range(len(self.targets)), len(self.order))
        else:  # from the second pass on, every chunk is a re-send
            self._measure_first_pass()
            if self.passes == 1:   # this push's chunks (a part's, restricted) only
                for hv in self.hdr_u8:
                    hv[np.asarray(self.order, dtype=np.int64), RETX_BYTE] |= W.F_RETX
            bo = self.backoff
            runs, to = [], {}
            if self.group:   # one run to the group, and what one target alone lacks to it
                chunks, single, to = group_pass(
                    self.order, acked, self.full,
                    [r and not bo.silent[i] for i, r in enumerate(ready)], alone=self.alone,
                    open_=[not d for d in self.done_t])
                runs = ([(len(self.targets), chunks)] if chunks else []) + list(single.items())
            more = pass_runs(self.order, acked, [not r or i in to for i, r in enumerate(ready)],
                             bo.limits(ready))
            bo.spend(more)
            runs += more
            for i, chunks in more:
                to[i] = to.get(i, 0) + len(chunks)
            for det in self.detectors:  # this pass re-sends whatever is still out
                det.restart()
        self.passes += 1
        self.picker.start(runs, acked, closed)
        return to

    def _run_pass(self) -> None:
        """One pass, a batch per system call as the pacer's tokens allow, then
        a short wait for its last ACKs (still looking for losses)."""
        picker, pacer = self.picker, self.pacer
        pick, take, refund, send_batch = picker.pick, pacer.take, pacer.refund, self._send_batch
        clock, t0, timeout_s = time.perf_counter, self.t0, self.timeout_s
        detectors, grp = self.detectors, picker.grp
        all_resent = self.passes > 1
        sent = resent = 0
        refresh_at, wait_until = 0.0, None
        while True:
            if picker.exhausted():
                # The pass is out: give its last ACKs a round-trip (plus
                # queueing) to come back.
                now = clock()
                if wait_until is None:
                    wait_until = now + self.tail_wait()
                if now >= wait_until or self._all_closed_or_acked():
                    break
                time.sleep(TAIL_POLL)
                picker.acked = self.detect_losses()
                continue
            n = take()
            now = clock()
            if now >= refresh_at:  # what the ACKs say, about once a millisecond
                refresh_at = now + 0.001
                if not self._read_acks() or now - t0 > timeout_s:
                    break
            tgt, batch, lost, at = pick(n)
            if len(batch) < n:
                refund(n - len(batch))
            if not batch:
                continue
            if not send_batch(tgt, batch):
                if clock() - t0 > timeout_s:
                    break  # the device stays full: the pass ends, the timeout rules
                time.sleep(QUEUE_BACKOFF_S)   # local queue full: back off, retry these
                picker.rewind(at)
                continue
            now = clock()
            for det in (detectors if tgt == grp else (detectors[tgt],)):
                det.note(batch, now)
            wait_until = None
            sent += len(batch)
            if all_resent or lost:
                resent += len(batch)
        self.sent += sent
        self.resent += resent
        if self.after_pass is not None:
            self.after_pass(self)

    def tail_wait(self) -> float:
        """How long a pass's last ACKs may take before what they have not
        acknowledged is re-sent: twice the slowest open target's round trip
        (the shortest it showed so far: LossDetector.rtt), plus a read of
        the ACKs, within TAIL_MIN..TAIL_WAIT; TAIL_WAIT until every open
        target showed one. A lost chunk among a pass's last few, which no
        later ACK can show lost, waits that long: on the rig about 0.5 ms
        instead of 2 (RACK-TLP's probe timeout, RFC 8985, is 2 SRTT)."""
        rtt = max((d.rtt for d, done in zip(self.detectors, self.done_t) if not done),
                  default=math.inf)
        return min(TAIL_WAIT, max(TAIL_MIN, 2 * rtt + TAIL_POLL))

    def _read_acks(self) -> bool:
        """Rates, closed flags and losses into the picker; False once every
        target closed the round."""
        closed = self.refresh()
        if all(closed):
            return False
        picker = self.picker
        picker.acked = acked = self.detect_losses()
        picker.closed = closed
        if picker.grp >= 0:
            picker.acked_open = functools.reduce(
                operator.and_, (a for a, c in zip(acked, closed) if not c), self.full)
        return True

    def _all_closed_or_acked(self) -> bool:
        tx32, full = self.tx32, self.full
        return all(tx32[s, CLOSED] or (a & full) == full for s, a in zip(self.slots, self.acked()))

    def _send_batch(self, tgt: int, batch: list[int]) -> bool:
        """One sendmsg to one target (GSO when several chunks); False when the
        local queue is full (ENOBUFS, EAGAIN) and the batch must wait."""
        pc = self.pieces[tgt]
        if pc is not None:
            iov = [p for c in batch for p in pc[c]]
        else:
            h, bodies, hl = self.hdrs[tgt], self.bodies, W.HDR_LEN
            iov = []
            for c in batch:
                iov += (h[c * hl:(c + 1) * hl], bodies[c])
        try:
            self.sock.sendmsg(iov, self.gso if len(batch) > 1 else (), 0, self.addrs[tgt])
        except OSError as e:
            if e.errno not in (errno.ENOBUFS, errno.EAGAIN):
                raise
            return False
        return True

    def _report(self) -> PushReport:
        self.sender.learn_rates(self.targets, self.low)
        if self.passes == 1 and not self.overtaken:
            self._measure_first_pass()
        tx32 = self.tx32
        return PushReport(round=self.round_, chunks=self.layout.nchunks, sent=self.sent,
                          resent=self.resent, acked=sum(a.bit_count() for a in self._raw_acked()),
                          closed_by_receiver=self.overtaken or
                          all(bool(tx32[s, CLOSED]) for s in self.slots),
                          duration_s=time.perf_counter() - self.t0, passes=self.passes,
                          sender_why=self.sender_why)

