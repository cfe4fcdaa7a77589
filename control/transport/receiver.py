# SPDX-License-Identifier: Apache-2.0
"""Receiving rounds: open a round's bank, watch its progress until Early
Close shuts it, then collect what arrived, Bubble-Filled, as a RoundResult."""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .bubble import error_estimate as estimate_error
from .bubble import fill as fill_bubbles
from .bubble import remember as remember_stale
from .early_close import COMPLETE, TIMEOUT, EarlyClose
from .layout import FRAME_OVERHEAD, ChunkLayout
from .rate import SharePolicy
from .results import RoundResult, arrivals_of
from .straggler import attribute
from ..trust.tokens import RoundTokens

LOSS_SAMPLE = 32  # chunks an interval needs before its re-sent share feeds the boost


@dataclass
class OpenRound:
    """A round this endpoint receives, from open_round until it is collected
    or cancelled."""

    round: int
    layout: ChunkLayout
    workers: list[int]
    slots: list[int]               # the workers' rows in the maps
    critical: np.ndarray | None    # bool per chunk that must arrive from every worker
    reliable: bool                 # every chunk critical: only completeness closes it
    t_open: float                  # perf_counter() when opened
    timeout_s: float | None = None  # the hard timeout, if not Early Close's
    early: EarlyClose | None = None  # the Early Close state judging it (set by open)
    code: tuple | None = None      # a coded or deferred reliable round: (fec.Plan or
                                   # defer.Plan, the data's elements)
    # The rows as a slice when contiguous: indexing then gives views of the
    # mapped memory, not copies.
    rows: slice | list[int] = field(init=False)

    def __post_init__(self) -> None:
        s = self.slots
        contiguous = s == list(range(s[0], s[0] + len(s)))
        self.rows = slice(s[0], s[0] + len(s)) if contiguous else s

    @property
    def total(self) -> int:
        """Chunks the round holds when complete."""
        return self.layout.nchunks * len(self.workers)

    def critical_mask(self) -> np.ndarray:
        if self.critical is not None:
            return self.critical
        return np.ones(self.layout.nchunks, dtype=bool)

    def critical_missing(self, masks: np.ndarray) -> dict[int, list[int]]:
        """Per worker, the critical chunks that did not arrive (none asked: {})."""
        if self.critical is None and not self.reliable:
            return {}
        crit, out = self.critical_mask(), {}
        for i, w in enumerate(self.workers):
            miss = np.nonzero(crit & ~masks[i])[0]
            if miss.size:
                out[w] = miss.tolist()
        return out


@dataclass
class _Watch:
    """What waiting for a round carries from one Early Close decision to the next."""

    first: np.ndarray  # per worker: seconds from open to its first chunk (NaN: none yet)
    next_decide: float = 0.0
    last_bytes: int | None = None  # the previous decision's delivery counts
    last_t: float = 0.0
    last_retx: int = 0
    last_done: int = 0

    def delivery(self, now: float, nbytes: int, retx: int, done: int,
                 active: int) -> tuple[float, float] | None:
        """Delivery rate (bit/s) and re-sent share since the previous sample,
        None if there is no interval to judge; this sample becomes the previous."""
        out = None
        if done and active and self.last_bytes is not None and now > self.last_t:
            # the re-sent share of what arrived; not judged on a few
            # chunks (the round's last re-sends are all re-sends)
            fresh = done - self.last_done
            resent = (retx - self.last_retx) / fresh if fresh >= LOSS_SAMPLE else 0.0
            out = (nbytes - self.last_bytes) * 8 / (now - self.last_t), resent
        self.last_bytes, self.last_t, self.last_retx, self.last_done = nbytes, now, retx, done
        return out


class Receiver:
    """An endpoint's receive side: its open rounds, and the policies that
    close them (Early Close, the share of the capacity) and fill their holes."""

    def __init__(self, maps, peers: dict[int, int], nslots: int, *, chunk_bytes: int,
                 max_elems: int, capacity_bps: float, share: SharePolicy, early: EarlyClose,
                 bubble_strategy: str, tokens: RoundTokens | None = None, window: int = 0):
        self.maps, self.peers, self.nslots = maps, peers, nslots
        self.tokens = tokens or RoundTokens.off()  # each flow's per round
        self.window = window  # packets clocked senders may keep in flight together (the credit)
        self.chunk_bytes, self.max_elems, self.capacity_bps = chunk_bytes, max_elems, capacity_bps
        self.share, self.early, self.bubble_strategy = share, early, bubble_strategy
        self.rounds: dict[int, OpenRound] = {}
        self._stale: tuple[np.ndarray, np.ndarray] | None = None
        self._last_counters = maps.counters()
        self._report_lock = threading.Lock()   # S shards may collect on one endpoint at once

    # ------------------------------------------------------------------ open
    def open(self, round_: int, nelems: int, workers: list[int] | None = None,
             critical: np.ndarray | None = None, reliable: bool = False,
             early: EarlyClose | None = None, code: tuple | None = None) -> OpenRound:
        """Make round_ receivable (see Endpoint.open_round); `early` judges it
        (default: the endpoint's own Early Close state); `code`: a coded or
        deferred reliable round's (plan, data elements), OpenRound.code."""
        if nelems > self.max_elems:
            raise ValueError(f"round of {nelems} elements exceeds this endpoint's "
                             f"max_elems={self.max_elems}")
        workers = list(self.peers) if workers is None else list(workers)
        unknown = [w for w in workers if w not in self.peers]
        if unknown:
            raise ValueError(f"unknown worker id(s) {unknown}; known: {sorted(self.peers)}")
        layout = ChunkLayout(nelems, self.chunk_bytes)
        if critical is not None:
            critical = np.asarray(critical, dtype=bool)
            if critical.shape != (layout.nchunks,):
                raise ValueError(f"critical mask needs {layout.nchunks} entries, got {critical.shape}")
        self.maps.beat()  # the round's reader is alive (docs/transport.md, a hung receiver)
        early = early or self.early
        early.start_round(layout.nbytes * len(workers))
        # ACKs divide the capacity among the flows not finished at that moment
        # (the XDP program counts them down); share_kbps(1) is the whole of it.
        # thresh: a slot's progress is stamped when it reaches the threshold.
        self.maps.open_bank(round_, layout.nchunks, layout.last_len,
                            share_kbps=self.share.share_kbps(1), flows=len(workers),
                            slot_tokens=self.tokens.bank(round_, self.peers),
                            group_token=self.tokens.group(round_), window=self.window,
                            thresh=math.ceil(early.threshold * layout.nchunks),
                            slots=[self.peers[w] for w in workers])
        st = OpenRound(round_, layout, workers, [self.peers[w] for w in workers], critical,
                       reliable, time.perf_counter(), early=early, code=code)
        self.rounds[round_] = st
        return st

    def limit(self, round_: int, timeout_s: float) -> None:
        """Round round_ (if open) closes by its hard timeout after timeout_s."""
        st = self.rounds.get(round_)
        if st is not None:
            st.timeout_s = timeout_s

    def arrived_from(self, round_: int, chunk: int) -> bool:
        """Whether any chunk of round_ (open here, one worker's: a reliable
        answer) at index `chunk` or later has arrived."""
        st = self.rounds.get(round_)
        if st is None:
            return False
        words = self.maps.done[self.maps.bank_index(round_), st.slots[0]]
        w0 = chunk // 64
        if w0 >= len(words):
            return False
        if int(words[w0]) >> (chunk % 64):
            return True
        return bool(words[w0 + 1:].any())

    def drop(self, round_: int, worker: int) -> None:
        """Stop round_ taking `worker`'s DATA (it is dropped from the round):
        its frames are ACKed CLOSED, never written, and count no flow down,
        in XDP from now on; what it delivered before stays."""
        st = self.rounds.get(round_)
        if st is None or worker not in st.workers:
            raise ValueError(f"worker {worker} is not in open round {round_}")
        self.maps.close_slot(round_, self.peers[worker])

    def cancel(self, round_: int) -> None:
        if self.rounds.pop(round_, None) is None:
            raise ValueError(f"round {round_} is not open on this endpoint")
        self.maps.close_bank(round_)

    # ------------------------------------------------------------------ wait
    def wait(self, round_: int, poll_s: float = 0.0003) -> RoundResult:
        """Block until round_ closes; collect it (see Endpoint.wait_round)."""
        st = self.rounds.get(round_)
        if st is None:
            raise ValueError(f"round {round_} is not open on this endpoint")
        reason, first = self._watch(st, poll_s)
        if st.reliable:  # when its chunks began to arrive, for the report (the XDP
            # program's clock is CLOCK_MONOTONIC, as perf_counter's is on Linux)
            prog = self.maps.progress[self.maps.bank_index(round_)]
            started = prog["first_ns"][st.rows].astype(np.float64)
            first[:] = np.where(started > 0, started / 1e9 - st.t_open, np.nan)
        t_first = st.t_open + float(np.nanmin(first)) if (~np.isnan(first)).any() else None
        t_close = time.perf_counter()
        self.maps.close_bank(round_)
        return self.collect(st, reason, t_first, t_close)

    def _watch(self, st: OpenRound, poll_s: float) -> tuple[str, np.ndarray]:
        """Poll the round's progress counters until it closes: the reason, and
        when each worker's first chunk arrived (seconds after open).

        While much data is still to come it sleeps for half the time the rest
        needs at line rate (at most 1 ms between Early Close decisions, 5 ms
        in a reliable round), and every `poll_s` near the end."""
        prog = self.maps.progress[self.maps.bank_index(st.round)]
        rows, total, t_open, reliable = st.rows, st.total, st.t_open, st.reliable
        w = _Watch(first=np.full(len(st.workers), np.nan))
        limit = st.timeout_s or st.early.cfg.hard_timeout_s
        # seconds per chunk at line rate, and the longest sleep
        chunk_s = (self.chunk_bytes + FRAME_OVERHEAD) * 8 / self.capacity_bps
        max_sleep = max(poll_s, 0.005 if reliable else 0.001)
        beat = self.maps.beat
        while True:
            beat()  # its DATA is ACKed only while this loop (or a push) runs
            chunks = prog["chunks"][rows]
            done = int(chunks.sum())
            now = time.perf_counter() - t_open
            if st.code is not None and self._whole(st, done):
                return COMPLETE, w.first
            if done == total:
                if not reliable:   # a repair that completed it is learnt from
                    st.early.observe(now, w.first, chunks / st.layout.nchunks,
                                     prog["retx"][rows])
                return COMPLETE, w.first
            if reliable:  # only completeness (above) or the hard timeout closes it
                if now >= limit:
                    return TIMEOUT, w.first
            elif now >= w.next_decide:  # the full rule about once a millisecond
                reason = self._decide(st, w, prog, now, chunks, done)
                if reason is not None:
                    return reason, w.first
            time.sleep(min(max_sleep, max(poll_s, 0.5 * (total - done) * chunk_s)))

    def _decide(self, st: OpenRound, w: _Watch, prog: np.ndarray, now: float,
                chunks: np.ndarray, done: int) -> str | None:
        """One Early Close decision: the share policy hears the delivery since
        the last one, then the close rule judges the round."""
        nch, rows = st.layout.nchunks, st.rows
        w.first[np.isnan(w.first) & (chunks > 0)] = now
        active = int((chunks < nch).sum())
        # on the wire: payload plus each chunk's Ethernet, IP, UDP and LTP headers,
        # the bytes the capacity C is counted in
        nbytes = int(prog["bytes"][rows].sum()) + done * FRAME_OVERHEAD
        sample = w.delivery(now, nbytes, int(prog["retx"][rows].sum()), done, active)
        w.next_decide = now + 0.001
        if sample is not None and self.share.observe(*sample):
            self.maps.set_share(st.round, self.share.share_kbps(1))
        crit_ok = st.critical is None or self.critical_ok(st)
        return st.early.decide(now, w.first, chunks / nch, crit_ok, prog["retx"][rows])

    def _whole(self, st: OpenRound, done: int) -> bool:
        """A coded round (fec.py): every group has enough of its chunks to
        rebuild it; a deferred one (defer.py): its verdict is in, and every
        chunk the verdict does not defer."""
        plan, nch = st.code[0], st.layout.nchunks
        if done < plan.least:
            return False
        mem = self.maps.mem[self.maps.bank_index(st.round)][st.slots[0]]
        return plan.complete(self.maps.done_mask(st.round, st.slots[0], nch),
                             mem[:nch * st.layout.chunk_elems].view(np.uint8).reshape(nch, -1))

    def critical_ok(self, st: OpenRound) -> bool:
        """Every worker's critical chunks are in."""
        nch, crit = st.layout.nchunks, st.critical_mask()
        return all(self.maps.done_mask(st.round, s, nch)[crit].all() for s in st.slots)

    # --------------------------------------------------------------- collect
    def collect(self, st: OpenRound, reason: str, t_first: float | None,
                t_close: float) -> RoundResult:
        """Fill the closed round's holes, record its outcome, and retire it."""
        maps, layout, slots, round_ = self.maps, st.layout, st.slots, st.round
        bank = maps.bank_index(round_)
        nch, ce = layout.nchunks, layout.chunk_elems
        masks = np.stack([maps.done_mask(round_, s, nch) for s in slots])
        if masks.all():   # what came between the decision and the bank's close made it whole
            reason = COMPLETE
        # [workers, chunks, elems]; a copy when the rows are not contiguous
        chunked = maps.mem[bank][st.rows, :nch * ce].reshape(len(slots), nch, ce)
        missing, rebuilt = st.critical_missing(masks), 0
        if st.code is not None and reason == COMPLETE:   # rebuild what the code covers
            plan, nelems = st.code
            rebuilt = plan.rebuild(chunked[0].view(np.uint8), masks[0])
            masks, missing = np.ones((1, plan.data), dtype=bool), {}
            chunked, layout = chunked[:, :plan.data], ChunkLayout(nelems, self.chunk_bytes)
            nch = layout.nchunks
        error = (estimate_error(chunked, masks) if not st.reliable and not masks.all()
                 else None)
        filled = self._fill(st, chunked, masks)
        prog = maps.progress[bank][slots]
        arrivals = arrivals_of(prog, st.t_open, t_close)
        att = attribute(arrivals, st.workers, masks.sum(axis=1), reason)
        for i, s in enumerate(slots):  # round outcomes, for `ltp flows` from any process
            w = st.workers[i]
            maps.record_round(s, reason, int(masks[i].sum()), int(filled[i]), round_=round_,
                              duration_s=t_close - st.t_open, straggler=att.critical == w,
                              lateness_s=att.lateness.get(w),
                              budget=0.0 if st.reliable or st.early is None else st.early.cfg.budget)
        values = chunked.reshape(len(slots), nch * ce)[:, :layout.nelems]
        late, dups, bad_token = self._since_last_report()
        retx = int(prog["retx"].sum())
        active_s = (t_close - t_first) if t_first else 0.0
        res = RoundResult(round=round_, reason=reason, duration_s=t_close - st.t_open,
                          active_s=active_s, workers=st.workers, layout=layout, values=values,
                          masks=masks, filled=filled,
                          threshold=st.early.threshold, deadline_s=st.early.deadline_s,
                          late=late, duplicates=dups, bad_token=bad_token, retx_chunks=retx,
                          critical_missing=missing, rebuilt=rebuilt,
                          arrivals=arrivals, attribution=att,
                          **({"error": error} if error else {}))
        if not st.reliable:
            st.early.end_round(total_bytes=layout.nbytes * len(slots),
                                 delivered_bytes=int(prog["bytes"].sum()), active_s=active_s,
                                 lost_fraction=(retx + int((~masks).sum())) / max(1, masks.size))
        del self.rounds[round_]
        return res

    def _fill(self, st: OpenRound, chunked: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """Bubble-Fill the holes in place (chunks filled per worker); under
        "stale", what arrived in a tolerant round is kept for later rounds."""
        strategy, slots = self.bubble_strategy, st.slots
        if strategy != "stale":
            return fill_bubbles(chunked, masks, strategy)
        stale, valid = self.stale_state(st.layout.nchunks, st.layout.chunk_elems)
        filled = fill_bubbles(chunked, masks, "stale", stale[slots], valid[slots])
        if not st.reliable:
            idx = np.asarray(slots)
            s_view, v_view = stale[idx], valid[idx]
            remember_stale(s_view, v_view, chunked, masks)
            stale[idx], valid[idx] = s_view, v_view
        return filled

    def _since_last_report(self) -> tuple[int, int, int]:
        """Packets of closed rounds, duplicates, and packets without their
        round's token, since the last report."""
        with self._report_lock:
            now, last = self.maps.counters(), self._last_counters
            self._last_counters = now
        return (now["late"] + now["stale"] - last["late"] - last["stale"],
                now["dup"] - last["dup"], now["bad_token"] - last["bad_token"])

    def stale_state(self, nch: int, ce: int) -> tuple[np.ndarray, np.ndarray]:
        """Per slot, the last value of each chunk that arrived, and whether one
        did (a round of another shape starts them afresh)."""
        shape = (self.nslots, nch, ce)
        if self._stale is None or self._stale[0].shape != shape:
            self._stale = (np.zeros(shape, dtype=np.float32), np.zeros(shape[:2], dtype=bool))
        return self._stale
