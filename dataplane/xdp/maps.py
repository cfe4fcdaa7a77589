# SPDX-License-Identifier: Apache-2.0
"""Typed views of the LTP maps (bpf/ltp_maps.h), from bcc or from pins.

The value structs live in mapstructs.py (re-exported here); tests/test_wire.py
checks them against the ctypes types bcc generates from the C. Mmapable maps
(reassembly memory, bitmaps, progress) are numpy views with no copy; the rest
go through libbpf's bpf_map_lookup_elem/bpf_map_update_elem by fd, so the same
code serves the process that loaded the program and one that opened its pins.
"""
from __future__ import annotations

import bisect
import ctypes
import os
import socket
import threading
import time
from collections.abc import Iterable

import numpy as np

from ...errors import DataplaneError
from .. import clib
from . import headers
from .mapstructs import (BANK_CLOSED, BANK_FREE, BANK_OPEN, BANK_STATES, CFG_CSUM,  # noqa: F401
                         CFG_SELF,
                         LATE_BOUNDS_S, PROGRESS_DTYPE, ROUND_REASONS, ROUND_TIME_BOUNDS_S,
                         ROUND_TIME_BUCKETS, SENDSLOT_DTYPE, SHARE_DTYPE, SLOT_STATS,
                         SLOTTOK_DTYPE, TX_DTYPE, Bank, Cfg, FdMap, Geometry, Progress,
                         RoundStats, SendSlot, Share, SlotStats, SlotTok, Tx, mmap_rw,
                         read_counters)
from .wire import LtpHdr, token_word

#: enum ltp_counter, in order; the maps bpf/ltp_maps.h declares, in order
COUNTERS = headers.enum_members("ltp_maps.h", "ltp_counter", "LTP_C_")
MAP_NAMES = headers.map_names("ltp_maps.h")
#: maps a program built from an older bpf/ may not have (LtpMaps then goes without;
#: ltp_beatchk is the program's own, which no Python reads)
OPTIONAL_MAPS = ("ltp_slottok", "ltp_beatchk")
# The longest heartbeat limit: the program compares ltp_cfg.limit_ns as a
# signed 64-bit count (bpf/ltp_data.h, owner_stale), 2^63 - 1 ns ~ 9.22e9 s.
MAX_LIVENESS_S = 9.2e9
SETTLE_POLL_S = 0.0002   # how often a closing bank's claimed and done chunks are compared


def liveness_ns(limit_s: float | None) -> int:
    """A heartbeat limit in seconds (None or 0: off) as ltp_cfg.limit_ns;
    ValueError outside 0..MAX_LIVENESS_S (a longer one would read as negative
    in the program: every round stale, nothing ACKed)."""
    if limit_s is None:
        return 0
    if not 0 <= limit_s <= MAX_LIVENESS_S:   # nan and inf too
        raise ValueError(f"liveness limit must be in 0..{MAX_LIVENESS_S:g} seconds "
                         f"(None: off), got {limit_s!r}")
    return round(limit_s * 1e9)

class LtpMaps:
    """All maps of one ltp_xdp program, with the operations the control plane needs."""

    def __init__(self, fds: dict[str, int], geometry: Geometry, owns_fds: bool = False):
        g = self.geometry = geometry
        self._fds, self._owns, self._rounds_lock = fds, owns_fds, threading.Lock()
        self.cfg = FdMap(fds["ltp_cfg"], Cfg)
        self.peers = FdMap(fds["ltp_peers"], ctypes.c_uint32)
        self.banks = FdMap(fds["ltp_banks"], Bank)
        self.rate = FdMap(fds["ltp_rate"], ctypes.c_uint32)
        self.counter_map = FdMap(fds["ltp_counters"], ctypes.c_uint64, percpu=True)
        self.stats = FdMap(fds["ltp_stats"], SlotStats, percpu=True)
        self.lasthdr = FdMap(fds["ltp_lasthdr"], LtpHdr)
        # absent in fd sets made before the map existed; record_round says so
        self.rounds = FdMap(fds["ltp_rounds"], RoundStats) if "ltp_rounds" in fds else None
        words = g.max_chunks // 64
        self._mm = {}

        def view(name, nbytes, dtype, shape):
            mm = self._mm[name] = mmap_rw(fds[name], nbytes)
            return np.frombuffer(mm, dtype=dtype, count=int(np.prod(shape))).reshape(shape)

        self.mem_bytes = view("ltp_mem", g.mem_bytes, np.uint8,
                              (g.banks, g.slots, g.max_chunks * g.chunk_bytes))
        #: float32 view [bank, slot, element]: one slot's chunks are contiguous
        self.mem = self.mem_bytes.view(np.float32)
        bm_shape = (g.banks, g.slots, words)
        self.claim = view("ltp_claim", 8 * words * g.banks * g.slots, np.uint64, bm_shape)
        self.done = view("ltp_done", 8 * words * g.banks * g.slots, np.uint64, bm_shape)
        self.acked = view("ltp_acked", 8 * words * g.banks * g.slots, np.uint64, bm_shape)
        #: sender state [bank, slot] (round, closed, rate_kbps, acked, token), read with no syscall
        self.tx = view("ltp_tx", TX_DTYPE.itemsize * g.banks * g.slots, TX_DTYPE,
                       (g.banks, g.slots))
        #: per [bank, slot]: the tokens its DATA and ACK carry, and whether the
        #: bank's round takes its DATA (open); None in fd sets made before it
        self.slottok = (view("ltp_slottok", SLOTTOK_DTYPE.itemsize * g.banks * g.slots,
                             SLOTTOK_DTYPE, (g.banks, g.slots))
                        if "ltp_slottok" in fds else None)
        self.progress = view("ltp_progress", PROGRESS_DTYPE.itemsize * g.banks * g.slots,
                             PROGRESS_DTYPE, (g.banks, g.slots))
        #: per bank (active flows, capacity to share in kbit/s); None in fd sets
        #: pinned before the map existed
        self.share = (view("ltp_share", SHARE_DTYPE.itemsize * g.banks, SHARE_DTYPE, (g.banks,))
                      if "ltp_share" in fds else None)
        #: the ACK clock's send side [bank, ...]: payload bytes per chunk (uint8,
        #: chunks back to back) and the send order; None in fd sets made before them
        self.sendbuf = self.sendorder = None
        if "ltp_sendbuf" in fds and "ltp_sendorder" in fds:
            self.sendbuf = view("ltp_sendbuf", g.banks * g.max_chunks * g.chunk_bytes, np.uint8,
                                (g.banks, g.max_chunks * g.chunk_bytes))
            self.sendorder = view("ltp_sendorder", SENDSLOT_DTYPE.itemsize * g.banks * g.max_chunks,
                                  SENDSLOT_DTYPE, (g.banks, g.max_chunks))

        #: per [bank, slot, chunk]: the XDP send log's seq + 1 of the chunk's latest
        #: DATA from XDP (0: not XDP's to recover); None in fd sets made before it
        self.sentat = (view("ltp_sentat", 8 * g.banks * g.slots * g.max_chunks, np.uint64,
                            (g.banks, g.slots, g.max_chunks)) if "ltp_sentat" in fds else None)
        #: the receiving control plane's heartbeat [beat_ns, limit_ns] (in ltp_cfg,
        #: mmapped); None for a program built before ltp_cfg was mmapable
        self.live = None
        try:
            self.live = view("ltp_cfg", ctypes.sizeof(Cfg), np.uint64,
                             (ctypes.sizeof(Cfg) // 8,))[Cfg.beat_ns.offset // 8:][:2]
        except (OSError, ValueError):
            pass

    @classmethod
    def from_bpf(cls, bpf, geometry) -> LtpMaps:
        """The maps of a program bcc loaded; one built from an older bpf/
        (`ltp bench xdp --against`) may lack the maps added since (OPTIONAL)."""
        fds = {}
        for n in MAP_NAMES:
            try:
                fds[n] = bpf[n.encode()].get_fd()
            except KeyError:
                if n not in OPTIONAL_MAPS:
                    raise
        return cls(fds, geometry)

    @classmethod
    def from_pins(cls, directory: str, geometry) -> LtpMaps:
        fds = {}
        try:
            for n in MAP_NAMES:
                fds[n] = clib.obj_get(os.path.join(directory, n))
        except Exception:
            for fd in fds.values():
                os.close(fd)
            raise
        return cls(fds, geometry, owns_fds=True)

    def close(self) -> None:
        # Views must go before their mmaps can close.
        for attr in ("mem", "mem_bytes", "claim", "done", "acked", "progress", "tx", "share",
                     "slottok",
                     "sendbuf", "sendorder", "live", "sentat"):
            self.__dict__.pop(attr, None)
        for mm in self._mm.values():
            try:
                mm.close()
            except BufferError:
                pass  # a caller still holds a view; the mapping dies with it
        self._mm = {}
        if self._owns:
            for fd in self._fds.values():
                os.close(fd)
            self._owns = False

    # --- configuration -------------------------------------------------
    def set_job(self, job: int) -> None:
        if not 0 <= job < 2**32:
            raise ValueError(f"job cookie must fit 32 bits, got {job}")
        c = self.cfg.get(0)
        c.job = job
        self.cfg.set(0, c)

    def set_self(self, worker: int, ip: str, mac: str) -> None:
        """This host's worker id, address and device MAC: with them set, DATA
        flagged GROUP (sent to a broadcast or multicast address) is taken as
        addressed to `worker`, and its ACK leaves from `ip` and `mac`."""
        if not 0 <= worker < 65536:
            raise ValueError(f"worker id must be in 0..65535, got {worker}")
        raw_mac = bytes.fromhex(mac.replace(":", ""))
        if len(raw_mac) != 6:
            raise ValueError(f"not a MAC address: {mac!r}")
        c = self.cfg.get(0)
        c.self_ip[:] = socket.inet_aton(ip)
        c.self_worker = worker
        c.self_mac[:] = raw_mac
        c.flags |= CFG_SELF
        self.cfg.set(0, c)

    def set_verify_csum(self, on: bool) -> None:
        """Verify every DATA frame's UDP checksum before its chunk counts: a
        frame that fails is counted bad_csum, never marked delivered nor
        ACKed. For frames from a NIC (which always carry the whole sum); a
        veth hands socket-sent frames over with the sum left to offload."""
        c = self.cfg.get(0)
        c.flags = (c.flags | CFG_CSUM) if on else (c.flags & ~CFG_CSUM)
        self.cfg.set(0, c)

    def verify_csum(self) -> bool:
        """Whether the program verifies checksums now (set_verify_csum)."""
        return bool(self.cfg.get(0).flags & CFG_CSUM)

    def set_peers(self, peers: dict[int, int]) -> None:
        """worker id -> slot (0-based). Workers not named stay unknown."""
        for worker, slot in peers.items():
            if not 0 <= worker < 65536:
                raise ValueError(f"worker id must be in 0..65535, got {worker}")
            if not 0 <= slot < self.geometry.slots:
                raise ValueError(f"slot must be in 0..{self.geometry.slots - 1}, got {slot}")
            self.peers.set(worker, ctypes.c_uint32(slot + 1))

    def set_rate(self, slot: int, kbps: int) -> None:
        self.rate.set(slot, ctypes.c_uint32(max(0, min(int(kbps), 2**32 - 1))))

    def set_share(self, round_: int, kbps: int) -> None:
        """Capacity (kbit/s) that round_'s ACKs divide among its active flows;
        0 falls back to the per-slot rates (set_rate)."""
        if self.share is None:
            raise ValueError("these maps have no ltp_share (pinned by an older version)")
        self.share[self.bank_index(round_)]["share_kbps"] = max(0, min(int(kbps), 2**32 - 1))

    def active_flows(self, round_: int) -> int:
        """Flows of round_ not finished (set at open, counted down by XDP)."""
        return 0 if self.share is None else int(self.share[self.bank_index(round_)]["active"])

    # --- liveness (ltp_cfg.beat_ns, limit_ns) ----------------------------
    def set_liveness(self, limit_s: float | None) -> None:
        """DATA of an open round is ACKed only while the heartbeat is at most
        limit_s old (None or 0: always, the check is off)."""
        ns = liveness_ns(limit_s)
        if self.live is not None:
            self.live[1] = ns

    def beat(self) -> None:
        """The receiving control plane is alive now (a store into mapped
        memory, no system call; bpf_ktime_get_ns reads CLOCK_MONOTONIC too)."""
        if self.live is not None:
            self.live[0] = time.monotonic_ns()

    def heartbeat_age_s(self) -> float | None:
        """Seconds since the last heartbeat; None if nothing ever beat."""
        if self.live is None or not self.live[0]:
            return None
        return (time.monotonic_ns() - int(self.live[0])) / 1e9

    # --- receiver rounds ----------------------------------------------
    def bank_index(self, round_: int) -> int:
        return round_ // self.geometry.stride % self.geometry.banks

    def open_bank(self, round_: int, nchunks: int, last_len: int, share_kbps: int = 0,
                  flows: int = 1, token: int = 0, window: int = 0, thresh: int = 0,
                  slot_tokens: dict[int, tuple[int, int]] | None = None,
                  group_token: int | None = -1, slots: Iterable[int] | None = None) -> int:
        """Make round `round_` writable in its bank; returns the bank index.

        The bank is FREE while its bitmaps are cleared (no packet of the old
        or new round lands then); the round it held is answered CLOSED still
        (data_late). share_kbps: the capacity its ACKs divide among the
        `flows` senders not yet finished (see set_share).
        token: every slot's DATA and ACK token and the group token, unless
        slot_tokens ({slot: (data token, ack token)}, the rest 0) and
        group_token (None: GROUP DATA is refused; -1: `token`) say otherwise;
        DATA carrying another is dropped as bad_token. slots: the slots the
        round takes (default all); another's DATA with its token is ACKed
        CLOSED and never written (close_slot closes one later).
        window: packets its clocked flows may keep in flight together (each
        window / active, at least 1; 0: no limit). thresh: the chunks per
        slot that stamp its progress's thresh_ns (0: none)."""
        g = self.geometry
        word = token_word(token)
        if not 1 <= nchunks <= g.max_chunks:
            raise ValueError(f"nchunks must be in 1..{g.max_chunks}, got {nchunks}")
        if not 0 < last_len <= g.chunk_bytes or last_len % 4:
            raise ValueError(f"last chunk length must be a multiple of 4 in 4..{g.chunk_bytes}")
        gword = word if group_token == -1 else token_word(group_token or 0)
        b = self.bank_index(round_)
        held = self.slottok is not None and (old := self.banks.get(b)).state != BANK_FREE
        bank = dict(round=round_, nchunks=nchunks, last_len=last_len, token=gword,
                    thresh=max(0, min(int(thresh), nchunks)), group=int(group_token is not None),
                    prev_round=old.round if held else 0, prev=int(held and old.round != round_))
        self.banks.set(b, Bank(state=BANK_FREE, **bank))
        self.claim[b] = self.done[b] = self.progress[b] = 0
        if self.slottok is not None:
            t = self.slottok[b]
            t["prev_data"], t["prev_ack"] = (t["data"], t["ack"]) if held else (0, 0)
            if slot_tokens is None:
                t["data"], t["ack"] = word, word
            else:
                t["data"], t["ack"] = 0, 0
                for slot, (d, a) in slot_tokens.items():
                    t[slot]["data"], t[slot]["ack"] = token_word(d), token_word(a)
            t["open"] = 1 if slots is None else 0
            if slots is not None:
                t["open"][list(slots)] = 1
        if self.share is not None:
            self.share[b]["share_kbps"] = max(0, min(int(share_kbps), 2**32 - 1))
            self.share[b]["active"] = max(1, int(flows))
            self.share[b]["window"] = max(0, min(int(window), 2**32 - 1))
        self.banks.set(b, Bank(state=BANK_OPEN, **bank))
        return b

    def close_slot(self, round_: int, slot: int) -> None:
        """Stop round_ taking `slot`'s DATA (a worker dropped from it): from
        now on its frames are ACKed CLOSED, never written, and count no flow
        down; what it delivered before stays."""
        b = self.bank_index(round_)
        if self.banks.get(b).round != round_:
            raise ValueError(f"round {round_} is not in bank {b}")
        self.slottok[b, slot]["open"] = 0

    def close_bank(self, round_: int, settle_s: float = 0.01) -> None:
        """Retire round `round_`: later packets are counted late, never written.

        Waits (at most settle_s) for copies that began before the close to
        finish, so the done bitmaps are final when this returns."""
        b = self.bank_index(round_)
        bank = self.banks.get(b)
        if bank.round != round_:
            raise ValueError(f"round {round_} is not in bank {b} (holds {bank.round})")
        bank.state = BANK_CLOSED
        self.banks.set(b, bank)
        deadline = time.monotonic() + settle_s
        while not np.array_equal(self.claim[b], self.done[b]) and time.monotonic() < deadline:
            time.sleep(SETTLE_POLL_S)

    def bank(self, round_: int) -> Bank:
        return self.banks.get(self.bank_index(round_))

    def done_mask(self, round_: int, slot: int, nchunks: int) -> np.ndarray:
        """bool[nchunks]: which chunks of `slot` arrived in round_'s bank."""
        return _bits(self.done[self.bank_index(round_), slot], nchunks)

    def slot_values(self, round_: int, slot: int, nelems: int) -> np.ndarray:
        """float32 view (no copy) of the first nelems elements `slot` sent."""
        return self.mem[self.bank_index(round_), slot, :nelems]

    # --- sender state -------------------------------------------------
    def tx_start(self, round_: int, slot: int, token: int = 0, nchunks: int | None = None,
                 dtoken: int | None = None) -> None:
        """Start sending round_ (nchunks chunks; default the most there may
        be) to `slot`: ACKs of other rounds, without the flow's ACK `token`,
        or of a chunk past nchunks are ignored. dtoken: the token its DATA
        carries (default `token`), which the ACK clock writes into the DATA
        it grows."""
        b = self.bank_index(round_)
        t = self.tx[b, slot]
        t["round"] = (round_ + 1) % 2**32  # park: no ACK matches while resetting
        self.acked[b, slot] = 0
        t["closed"] = 0
        t["acked"] = 0
        for name in ("clock", "tail", "window", "window_min", "next", "added", "consumed",
                     "stops", "sent", "xseq", "scan", "newest", "rexmit", "rack"):
            t[name] = 0
        if self.sentat is not None:
            self.sentat[b, slot] = 0
        n = self.geometry.max_chunks if nchunks is None else int(nchunks)
        if not 1 <= n <= self.geometry.max_chunks:
            raise ValueError(f"nchunks must be in 1..{self.geometry.max_chunks}, got {n}")
        t["nchunks"] = n
        t["token"] = token_word(token)
        t["dtoken"] = token_word(token if dtoken is None else dtoken)
        t["round"] = round_

    def tx_state(self, round_: int, slot: int) -> np.void:
        """(round, closed, rate_kbps, acked, token) of round_ toward `slot`; a live view."""
        return self.tx[self.bank_index(round_), slot]

    def acked_mask(self, round_: int, slot: int, nchunks: int) -> np.ndarray:
        return _bits(self.acked[self.bank_index(round_), slot], nchunks)

    # --- counters -----------------------------------------------------
    def counters(self) -> dict[str, int]:
        """Per class, its count (an older build's program: only the classes it has)."""
        return read_counters(self.counter_map, COUNTERS)

    def slot_stats(self, slot: int) -> dict[str, int]:
        per_cpu = self.stats.get(slot)
        return {n: int(sum(getattr(v, n) for v in per_cpu)) for n in SLOT_STATS}

    # --- round outcomes (decided in user space, kept in ltp_rounds) -----
    def record_round(self, slot: int, reason: str, delivered_chunks: int, filled_chunks: int,
                     *, round_: int | None = None, duration_s: float | None = None,
                     straggler: bool = False, lateness_s: float | None = None,
                     budget: float = 0.0) -> None:
        """Count one closed round of `slot`: why it closed (one of
        ROUND_REASONS), how many of its chunks arrived and were filled and,
        if given, how long it was open (into the time histogram), whether it
        named this slot's worker its straggler, the worker's lateness (into
        the lateness histogram; control/transport/straggler.py), and the
        round's Early Close loss budget (the loss policy's, in [0, 1)).

        One writer per program (the receiving endpoint; its threads, a
        sharded worker's shards, take turns): a read, modify, write of the
        slot's entry, not atomic across processes."""
        if self.rounds is None:
            raise DataplaneError("this program has no ltp_rounds map (loaded by an older build):"
                                 " `ltp unload` it and load it again")
        if reason not in ROUND_REASONS:
            raise ValueError(f"reason must be one of {', '.join(ROUND_REASONS)}, got {reason!r}")
        if not 0 <= slot < self.geometry.slots:
            raise ValueError(f"slot must be in 0..{self.geometry.slots - 1}, got {slot}")
        if delivered_chunks < 0 or filled_chunks < 0:
            raise ValueError("chunk counts must not be negative")
        if not 0.0 <= budget < 1.0:
            raise ValueError(f"budget must be in [0, 1), got {budget}")
        with self._rounds_lock:
            st = self.rounds.get(slot)
            setattr(st, reason, getattr(st, reason) + 1)
            st.delivered += int(delivered_chunks)
            st.filled += int(filled_chunks)
            if round_ is not None:
                st.last_round = int(round_) % 2**32
            st.last_delivered = min(int(delivered_chunks), 2**32 - 1)
            st.last_filled = min(int(filled_chunks), 2**32 - 1)
            st.last_budget_ppm = round(budget * 1e6)
            if duration_s is not None:
                st.time_us += max(0, round(duration_s * 1e6))
                # the first bucket whose bound is >= the time; past the last bound, the last
                st.time_hist[bisect.bisect_left(ROUND_TIME_BOUNDS_S, duration_s)] += 1
            st.straggler += bool(straggler)
            if lateness_s is not None:
                st.late_hist[bisect.bisect_left(LATE_BOUNDS_S, lateness_s)] += 1
            self.rounds.set(slot, st)

    def round_stats(self, slot: int) -> dict[str, int | list[int]]:
        """Round outcomes of `slot`: complete, early, deadline, timeout (rounds),
        delivered, filled (chunks over all recorded rounds), last_round,
        last_delivered, last_filled, last_budget_ppm, time_us and time_hist (a list, buckets
        of ROUND_TIME_BOUNDS_S), straggler (rounds that named it) and
        late_hist (buckets of LATE_BOUNDS_S); all zero if nothing was recorded."""
        st = self.rounds.get(slot) if self.rounds is not None else RoundStats()
        out = {n: int(getattr(st, n)) for n, *_ in RoundStats._fields_
               if n not in ("time_hist", "late_hist")}
        out["time_hist"] = [int(v) for v in st.time_hist]
        out["late_hist"] = [int(v) for v in st.late_hist]
        return out

    def last_header(self, counter: str) -> LtpHdr:
        return self.lasthdr.get(COUNTERS.index(counter))

    def peers_of(self, workers: Iterable[int]) -> dict[int, int]:
        out = {}
        for w in workers:
            v = self.peers.get(w).value
            if v:
                out[w] = v - 1
        return out


def _bits(words: np.ndarray, n: int) -> np.ndarray:
    return np.unpackbits(words.view(np.uint8), bitorder="little")[:n].astype(bool)
