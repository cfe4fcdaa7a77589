# SPDX-License-Identifier: Apache-2.0
"""What a sender sends next: chunks found lost (RACK-style) first, then a
pass's runs of unacknowledged chunks, a GSO batch at a time; and to whom a
re-send pass may go at all (`Backoff`: a silent target gets rarer, smaller
probes, one chunk a second at the least, and is named dead at the push's
timeout).

ACK state is a Python int per target: bit c set once chunk c is acknowledged.
"""
from __future__ import annotations

import bisect
import math

REORDER = 3  # a chunk is lost once one sent more than this many places later is acked
RTO_MIN = 0.01  # s: the first wait before re-sending to a target silent through a pass
PROBE_SHARE = 16  # a re-send to a silent target is a probe: 1/16 of the round (>= 1 chunk)
PROBE_BUDGET = 2  # probes to a silent target shrink to one chunk after this many passes' worth
RTO_MAX = 1.0   # s: the longest wait between probes, so a target back from a pause (an endpoint
                # being remade) is heard within a second, whatever the push's timeout
DEAD_AFTER = 2  # sends in a row a target left unanswered: at the timeout it is dead
SILENT_CHUNKS = 10  # chunks in a row a target leaves unanswered before it counts as silent:
                    # at 50 % round-trip loss (30 % each way) all 10 go unanswered 1 time in 1,000


def pass_runs(order: list[int], acked: list[int], done: list[bool],
              limit: list[int | None] | None = None) -> list[tuple[int, list[int]]]:
    """A pass's sending order: runs of unacknowledged chunks, one target each
    (acked[i]: bit c set when target i acknowledged chunk c; done[i]: skip
    target i; limit[i]: at most that many of its chunks, None for all).

    Targets take turns in runs of a few chunks, so a GSO batch (one target
    per system call) can form when there are several; a single target has
    one run."""
    run = len(order) if len(acked) == 1 else 8
    left = list(limit) if limit is not None else [None] * len(acked)
    out = []
    for b in range(0, len(order), run):
        part = order[b:b + run]
        for i, a in enumerate(acked):
            if done[i] or left[i] == 0:
                continue
            chunks = [c for c in part if not (a >> c) & 1] if a else part
            if left[i] is not None:
                chunks = chunks[:left[i]]
                left[i] -= len(chunks)
            if chunks:
                out.append((i, chunks))
    return out


def group_pass(order: list[int], acked: list[int], full: int, answering: list[bool],
               alone: bool = True, open_: list[bool] | None = None
               ) -> tuple[list[int], dict[int, list[int]], dict[int, int]]:
    """A group push's re-send pass: every chunk two or more answering
    targets lack, in `order`, for one run to the group (a chunk that several
    lack costs the sender's port one packet, not one per target); a chunk
    only one of them lacks, to that one alone (`alone`; sent to the group,
    each of the others would take a duplicate and answer it DUP: at 10 %
    loss on every port two thirds of a repair pass's chunks); and per
    answering target how many chunks it lacks (what its silence would leave
    unanswered: Backoff.listen's sent_to). alone False: every chunk any
    lacks goes to the group. open_: the targets still open (default: the
    answering ones); a chunk an answering target and an open silent one
    both lack goes to the group (one packet reaches both, as
    only_lacks judges it)."""
    missing = twice = 0
    lacks, lack_of = {}, {}
    for i, a in enumerate(acked):
        if answering[i]:
            lack = full & ~a
            twice |= missing & lack
            missing |= lack
            lacks[i], lack_of[i] = lack.bit_count(), lack
    if not missing:
        return [], {}, {}
    for i, a in enumerate(acked):
        if open_ is not None and open_[i] and not answering[i]:
            twice |= missing & full & ~a
    to_group = twice if alone else missing
    single = {}
    if alone and missing != twice:
        for i, lack in lack_of.items():
            mine = lack & ~twice
            if mine:
                single[i] = [c for c in order if (mine >> c) & 1]
    return [c for c in order if (to_group >> c) & 1], single, lacks


def only_lacks(acked: list[int], done: list[bool], i: int, c: int) -> bool:
    """In a group push: target i is the only open one without chunk c (its
    re-send goes to i alone; to the group, every other target would take a
    duplicate and answer it DUP)."""
    return all((acked[j] >> c) & 1 or done[j] for j in range(len(acked)) if j != i)


class Backoff:
    """To which targets a re-send pass may go, and how much it may send them.

    A target that answered nothing while a pass went to it (no new ACK, no
    CLOSED) is silent: dead, unreachable, or not taking the round. Sending
    it whole passes back to back would cost 94k-272k packets in a 10 s
    timeout. As TCP backs off its retransmission timer,
    its next re-send waits RTO_MIN, doubling with every send it leaves
    unanswered up to RTO_MAX, and is a probe of 1/PROBE_SHARE of the round;
    after PROBE_BUDGET passes' worth of chunks a probe is one chunk, so a
    dead peer costs at most 1 + PROBE_BUDGET passes, past that a chunk per RTO_MAX. The
    probes never stop before the timeout: a target silent for a while (its
    endpoint remade, a late CLOSED to give) is heard within RTO_MAX of its
    return, not at the push's timeout. Any answer (a late one too) makes
    it a normal target again at once. At the timeout, a target that left
    DEAD_AFTER sends in a row unanswered is dead (`dead`).

    A pass of a few chunks left unanswered is no sign of death on a lossy
    path: at 30 % loss each way, 3 re-sent chunks all go unanswered 13 times
    in 100, and each such miss cost a 10-40 ms back-off in a heavily lossy
    round's tail. A target is silent only once SILENT_CHUNKS chunks in a row
    went unanswered (one pass of a whole round does)."""

    def __init__(self, ntargets: int, nchunks: int, now: float):
        self.heard = [0] * ntargets  # ACK state when it last answered
        self.heard_at = [now] * ntargets
        self.silent = [0] * ntargets  # sends in a row it left unanswered
        self.unanswered = [0] * ntargets  # chunks sent it since it last answered
        self.rto = [RTO_MIN] * ntargets
        self.due = [now] * ntargets  # no re-send to it before this time
        self.probed = [0] * ntargets  # chunks probed since it last answered
        self.probe = max(1, -(-nchunks // PROBE_SHARE))
        self.budget = PROBE_BUDGET * nchunks

    def listen(self, acked: list[int], closed: list[bool], done: list[bool], now: float,
               sent_to=()) -> None:
        """What the ACKs say now; `sent_to`: the targets of the pass just ended
        (a dict: target -> chunks the pass sent it; other collections: each a
        whole round's worth)."""
        counts = sent_to if isinstance(sent_to, dict) else dict.fromkeys(sent_to, SILENT_CHUNKS)
        for i, a in enumerate(acked):
            if done[i]:
                continue
            if a != self.heard[i] or closed[i]:
                self.heard[i], self.heard_at[i], self.silent[i] = a, now, 0
                self.rto[i], self.due[i], self.probed[i] = RTO_MIN, now, 0
                self.unanswered[i] = 0
            elif i in counts:
                self.unanswered[i] += counts[i]
                if self.unanswered[i] < SILENT_CHUNKS and not self.silent[i]:
                    continue      # too few to tell a lossy path from a dead peer
                self.silent[i] += 1
                self.due[i] = now + self.rto[i]
                self.rto[i] = min(RTO_MAX, 2 * self.rto[i])

    def ready(self, done: list[bool], now: float) -> list[bool]:
        """Targets a pass may include now."""
        return [not d and self.due[i] <= now for i, d in enumerate(done)]

    def limits(self, ready: list[bool]) -> list[int | None]:
        """Per target, how many chunks the pass may send it (None: all; a
        silent target's probe is one chunk once its budget is spent)."""
        return [max(1, min(self.probe, self.budget - self.probed[i])) if r and self.silent[i]
                else (None if r else 0) for i, r in enumerate(ready)]

    def spend(self, runs: list[tuple[int, list[int]]]) -> None:
        """Count the chunks a pass probes silent targets with."""
        for i, chunks in runs:
            if self.silent[i]:
                self.probed[i] += len(chunks)

    def next_due(self, done: list[bool]) -> float:
        """When the next re-send may go (inf: every target is done)."""
        return min((self.due[i] for i, d in enumerate(done) if not d), default=math.inf)

    def dead(self, done: list[bool]) -> list[int]:
        return [i for i, d in enumerate(done) if not d and self.silent[i] >= DEAD_AFTER]


class LossDetector:
    """Which chunks sent to one target were lost, as RACK (RFC 8985) judges.

    The path keeps a flow's packets in order (one queue; on multi-path
    networks a flow is pinned to one path), so a chunk still unacknowledged
    when one sent more than `reorder` places after it has been acknowledged
    was lost,
    whatever the ACKs' own order. The sender re-sends it at once, instead of
    after the pass and a wait for the last ACKs. `sent` lists chunks in the
    order they went out (a re-send appends the chunk again); each position
    is judged once."""

    def __init__(self, reorder: int = REORDER):
        self.reorder = reorder
        self.sent: list[int] = []
        self.judged = 0  # sent[:judged] are judged: acked, or reported lost
        # when positions went out: batch i's first position and its time
        self.at_pos: list[int] = []
        self.at_t: list[float] = []
        self.latest = -1       # the latest position seen acked
        self.rtt = math.inf    # the shortest send-to-seen-acked time so far, s

    def note(self, batch: list[int], now: float) -> None:
        """A batch went out at `now`: its chunks take the next positions."""
        self.at_pos.append(len(self.sent))
        self.at_t.append(now)
        self.sent.extend(batch)

    def restart(self) -> None:
        """A new pass re-sends everything outstanding: judge only what it sends."""
        self.judged = len(self.sent)

    def lost(self, acked: int, now: float | None = None) -> list[int]:
        """Chunks newly found lost, given the ACK state (bit c: chunk c acked);
        `now`, the time the state was read, also samples the round trip
        (`rtt`): from the send of the latest position seen acked."""
        so, start = self.sent, self.judged
        j = len(so) - 1  # the latest position whose chunk is acked
        while j >= start and not (acked >> so[j]) & 1:
            j -= 1
        if now is not None and j > self.latest and self.at_pos:
            self.latest = j
            b = bisect.bisect_right(self.at_pos, j) - 1
            if b >= 0:
                self.rtt = min(self.rtt, now - self.at_t[b])
        out = []
        p = start
        while p < j - self.reorder:
            c = so[p]
            if not (acked >> c) & 1:
                out.append(c)
            p += 1
        self.judged = max(start, p)
        return out


class BatchPicker:
    """Which chunks go out in the next GSO batch (one target per system call).

    Chunks found lost (`urgent`: (target, chunk) pairs) go first, then the
    pass's runs (pass_runs); chunks acknowledged meanwhile are skipped,
    and a batch ends at the round's short last chunk (GSO segments all but
    the last share one size). The position is one cursor, (run, chunk in
    that run, urgent pairs taken): `pick` returns the cursor from before its
    batch, so a batch the local queue refused is put back with `rewind`."""

    def __init__(self, grp: int, short: int):
        self.grp = grp  # the group's target index (-1: no group)
        self.short = short  # the chunk shorter than the rest (-1: none)
        self.urgent: list[tuple[int, int]] = []
        self.runs: list[tuple[int, list[int]]] = []
        self.ri = self.k = self.ui = 0
        # What the ACKs said when last read: picks skip what has arrived.
        self.acked: list[int] = []
        self.closed: list[bool] = []
        self.acked_open = 0  # what every open target has: a group batch skips it
        self.queued = 0      # bit c: chunk c waits in `urgent` for the group (queued once)

    def start(self, runs: list, acked: list[int], closed: list[bool]) -> None:
        """A new pass: its runs; what was queued as lost is in them."""
        self.runs, self.acked, self.closed = runs, acked, closed
        self.urgent.clear()
        self.queued = 0
        self.ri = self.k = self.ui = 0

    def lost_to_group(self, c: int) -> bool:
        """Queue chunk c, found lost at some target of a group push, for one
        re-send to the group (True), unless it already waits for one."""
        if (self.queued >> c) & 1:
            return False
        self.queued |= 1 << c
        self.urgent.append((self.grp, c))
        return True

    def exhausted(self) -> bool:
        return self.ri >= len(self.runs) and self.ui >= len(self.urgent)

    def rewind(self, at: tuple[int, int, int]) -> None:
        self.ri, self.k, self.ui = at

    def pick(self, n: int) -> tuple[int, list[int], bool, tuple[int, int, int]]:
        """The next batch of at most n chunks: (target, chunks, whether they
        were found lost, the cursor before it). `chunks` may be empty."""
        at = (self.ri, self.k, self.ui)
        if self.ui < len(self.urgent):
            tgt, batch = self._pick_lost(n)
            return tgt, batch, True, at
        tgt, batch = self._pick_run(n)
        return tgt, batch, False, at

    def _pick_lost(self, n: int) -> tuple[int, list[int]]:
        urgent, j, short = self.urgent, self.ui, self.short
        tgt = urgent[j][0]
        grp = tgt == self.grp
        a, shut = (self.acked_open, all(self.closed)) if grp else \
            (self.acked[tgt], self.closed[tgt])
        batch = []
        while j < len(urgent) and len(batch) < n and urgent[j][0] == tgt:
            c = urgent[j][1]
            j += 1
            if grp:
                self.queued &= ~(1 << c)
            if not (a >> c) & 1:
                batch.append(c)
                if c == short:
                    break
        self.ui = j
        return tgt, ([] if shut else batch)

    def _pick_run(self, n: int) -> tuple[int, list[int]]:
        tgt, chunks = self.runs[self.ri]
        if tgt == self.grp:
            a, shut = self.acked_open, all(self.closed)
        else:
            a, shut = self.acked[tgt], self.closed[tgt]
        k, short, batch = self.k, self.short, []
        while k < len(chunks) and len(batch) < n:
            c = chunks[k]
            k += 1
            if not (a >> c) & 1:
                batch.append(c)
                if c == short:
                    break
        if k >= len(chunks) or shut:
            self.ri, self.k = self.ri + 1, 0
            return tgt, ([] if shut else batch)
        self.k = k
        return tgt, batch
