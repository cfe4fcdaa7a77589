"""The LTP transport: an endpoint per host, pushing and receiving rounds.

An `Endpoint` owns one ltp_xdp program attached to the host's device (in its
network namespace) and one UDP socket. The same endpoint sends (its XDP program
records the ACKs its peers' programs build) and receives (its XDP program
writes DATA into mapped memory and answers with ACKs).

Parameter server: `ps.open_round(r, nelems)`, then `ps.wait_round(r)` returns a
`RoundResult` with per-worker arrays (views of the mapped memory), delivery
masks, Bubble-Filled values and the aggregate.
Worker: `wk.push(r, grads, ps_addr)` sends tolerable chunks until the PS closes
the round; `wk.expect(r, nelems)` + `wk.receive(r)` take the reliable
parameter downlink that the PS sends with `ps.push_reliable(r, params, peers)`.
"""
from __future__ import annotations

import errno
import functools
import operator
import socket
import struct
import time
from dataclasses import dataclass, field

import numpy as np

from ...dataplane import netns
from ...dataplane.xdp import wire as W
from ...dataplane.xdp.loader import Dataplane, Geometry
from . import bubble
from .early_close import COMPLETE, DEADLINE, TIMEOUT, EarlyClose, EarlyCloseConfig
from .layout import ChunkLayout, as_f32
from .rate import Pacer, SharePolicy, fine_timer_slack
from ...errors import TransportError

FRAME_OVERHEAD = 14 + 20 + 8 + W.HDR_LEN  # Ethernet + IPv4 + UDP + LTP bytes per chunk
UDP_SEGMENT = 103  # linux/udp.h: GSO segment size, per sendmsg
REORDER = 3  # a chunk is lost once one sent more than this many places later is acked
LOSS_SAMPLE = 32  # chunks an interval needs before its re-sent share feeds the boost
TAIL_WAIT = 0.002  # after a pass, how long the last ACKs may take before a re-send pass


_HDR_DTYPE = np.dtype([("magic", ">u2"), ("version", "u1"), ("type", "u1"), ("flags", ">u2"),
                       ("worker", ">u2"), ("job", ">u4"), ("round", ">u4"), ("chunk", ">u4"),
                       ("nchunks", ">u4"), ("len", ">u2"), ("state", "u1"), ("pad", "u1"),
                       ("rate", ">u4")])
assert _HDR_DTYPE.itemsize == W.HDR_LEN


def _headers(job: int, round_: int, worker: int, nch: int, flags: np.ndarray,
             layout: ChunkLayout) -> np.ndarray:
    """The DATA headers of a round for one target, as one byte array."""
    h = np.zeros(nch, dtype=_HDR_DTYPE)
    h["magic"], h["version"], h["type"] = W.MAGIC, W.VERSION, W.T_DATA
    h["flags"], h["worker"], h["job"], h["round"] = flags, worker, job, round_
    h["chunk"] = np.arange(nch)
    h["nchunks"] = nch
    h["len"] = layout.chunk_bytes
    h["len"][-1] = layout.last_len
    return h.view(np.uint8)


def _device_mac(sock: socket.socket, dev: str) -> str:
    """The MAC of `dev` in the namespace `sock` was created in (SIOCGIFHWADDR)."""
    import fcntl
    info = fcntl.ioctl(sock.fileno(), 0x8927, struct.pack("256s", dev.encode()[:15]))
    return info[18:24].hex(":")


def _runs(order: list[int], acked: list[int], done: list[bool]) -> list[tuple[int, list[int]]]:
    """A pass's sending order: runs of unacknowledged chunks, one target each
    (acked[i]: bit c set when target i acknowledged chunk c).

    Targets take turns in runs of a few chunks, so a GSO batch (one target
    per system call) can form when there are several; a single target has
    one run."""
    run = len(order) if len(acked) == 1 else 8
    out = []
    for b in range(0, len(order), run):
        part = order[b:b + run]
        for i, a in enumerate(acked):
            if done[i]:
                continue
            chunks = [c for c in part if not (a >> c) & 1] if a else part
            if chunks:
                out.append((i, chunks))
    return out


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

    def restart(self) -> None:
        """A new pass re-sends everything outstanding: judge only what it sends."""
        self.judged = len(self.sent)

    def lost(self, acked: int) -> list[int]:
        """Chunks newly found lost, given the ACK state (bit c: chunk c acked)."""
        so, start = self.sent, self.judged
        j = len(so) - 1  # the latest position whose chunk is acked
        while j >= start and not (acked >> so[j]) & 1:
            j -= 1
        out = []
        p = start
        while p < j - self.reorder:
            c = so[p]
            if not (acked >> c) & 1:
                out.append(c)
            p += 1
        self.judged = max(start, p)
        return out


@dataclass
class Peer:
    """A host this endpoint talks to: its worker id (the flow owner) and address."""

    worker: int
    ip: str
    port: int = W.PORT


@dataclass
class PushPlan:
    """A push made ready to send (Endpoint.prepare_push)."""

    round_: int
    targets: list
    layout: ChunkLayout
    crit: np.ndarray
    slots: list[int]
    order: list[int]
    hdrs: list
    bodies: list
    pieces: list  # [target][chunk] -> (header, payload) views (None: built when sent)
    runs: list  # the first pass: [(target, [chunk, ...]), ...] (see _runs)
    group: bool  # the last of hdrs/addrs/pieces is a group address; the first pass goes there
    addrs: list
    reliable: bool
    timeout_s: float
    buf: np.ndarray  # keeps the payload's memory alive


@dataclass
class PushReport:
    round: int
    chunks: int
    sent: int
    resent: int
    acked: int
    closed_by_receiver: bool
    duration_s: float
    passes: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class RoundResult:
    """What a parameter server gets when a round closes."""

    round: int
    reason: str                      # complete | early | deadline | timeout
    duration_s: float                # open -> close
    active_s: float                  # first chunk -> close
    workers: list[int]
    layout: ChunkLayout
    values: np.ndarray               # float32 [W, nelems]: per-worker, filled (mapped memory)
    masks: np.ndarray                # bool [W, nchunks]: what arrived
    filled: np.ndarray               # int [W]: chunks filled per worker
    threshold: float
    deadline_s: float
    late: int = 0                    # packets of closed rounds seen since the last report
    duplicates: int = 0
    retx_chunks: int = 0             # chunks that arrived only as a re-send
    critical_missing: dict = field(default_factory=dict)

    @functools.cached_property
    def aggregate(self) -> np.ndarray:
        """float32 [nelems]: mean over workers after filling (accumulated in float64)."""
        return self.values.mean(axis=0, dtype=np.float64).astype(np.float32)

    @property
    def delivered_fraction(self) -> float:
        return float(self.masks.mean()) if self.masks.size else 1.0

    def delivered_per_worker(self) -> dict[int, float]:
        return {w: float(self.masks[i].mean()) for i, w in enumerate(self.workers)}

    @property
    def missing_workers(self) -> list[int]:
        return [w for i, w in enumerate(self.workers) if not self.masks[i].any()]

    def report(self) -> dict:
        return {"round": self.round, "reason": self.reason,
                "duration_s": round(self.duration_s, 6), "active_s": round(self.active_s, 6),
                "delivered_fraction": round(self.delivered_fraction, 6),
                "delivered_per_worker": {str(k): round(v, 6)
                                         for k, v in self.delivered_per_worker().items()},
                "filled_chunks": {str(w): int(self.filled[i]) for i, w in enumerate(self.workers)},
                "missing_workers": self.missing_workers, "late": self.late,
                "duplicates": self.duplicates, "retx_chunks": self.retx_chunks,
                "threshold": round(self.threshold, 6), "deadline_s": round(self.deadline_s, 6),
                "critical_missing": {str(k): v for k, v in self.critical_missing.items()}}


class Endpoint:
    """One host's LTP endpoint: XDP program on `dev` plus a UDP socket.

    peers: worker id -> slot. A PS lists every worker; a worker lists itself
    (its uplink ACKs and its downlink DATA both carry its own id).
    self_id: a worker's own id. With it the endpoint also receives downlink
    DATA sent to a group address (`push_reliable(..., group=...)`): its XDP
    program takes such packets as addressed to self_id and ACKs them from
    this host's own MAC and address.
    """

    def __init__(self, dev: str, ip: str, peers: dict[int, int], max_elems: int, *,
                 ns: str | None = None, mode: str = "native", job: int = 0,
                 capacity_bps: float = 1e9, chunk_bytes: int = 1424, port: int = W.PORT,
                 early_close: EarlyCloseConfig | None = None, bubble_strategy: str = "mean",
                 initial_rate_bps: float | None = None, publish: bool = True,
                 self_id: int | None = None):
        if self_id is not None and self_id not in peers:
            raise ValueError(f"self_id {self_id} must be one of the peers {sorted(peers)}")
        if bubble_strategy not in bubble.STRATEGIES:
            raise ValueError(f"unknown bubble strategy {bubble_strategy!r}")
        if not peers:
            raise ValueError("an endpoint needs at least one peer")
        self.ip, self.ns, self.job, self.port = ip, ns, job, port
        self.peers = dict(peers)
        self.slots = max(peers.values()) + 1
        self.max_elems = max_elems
        self.chunk_bytes = chunk_bytes
        max_chunks = ChunkLayout(max_elems, chunk_bytes).nchunks
        self.dp = Dataplane(Geometry(slots=self.slots, max_chunks=max_chunks,
                                     chunk_bytes=chunk_bytes, port=port), job=job)
        try:
            self.maps = self.dp.maps()
            self.maps.set_peers(self.peers)
            self.dp.attach(dev, ns, mode)
            self._published = None
            if publish:  # pins + record: `ltp status/flows/top` see this endpoint
                from ...dataplane.xdp import registry
                ns = ns or netns.current()  # a process started inside a namespace
                registry.publish(self.dp, dev, ns, role="ps" if len(peers) > 1 else "worker",
                                 job=job, mode=mode, peers=self.peers)
                self._published = (dev, ns)
            with netns.inside(ns):
                self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.sock.bind((ip, 0))
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
            # Group sends: to a broadcast address, or to a multicast group out
            # of this host's device (no multicast route needed), one hop.
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(ip))
            self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
            self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
            if self_id is not None:
                self.maps.set_self(self_id, ip, _device_mac(self.sock, dev))
        except BaseException:
            if getattr(self, "_published", None):
                from ...dataplane.xdp import registry
                registry.withdraw(*self._published)
            self.dp.close()
            raise
        self.capacity_bps = capacity_bps
        self.share = SharePolicy(capacity_bps)
        self.early = EarlyClose(capacity_bps, early_close)
        self.bubble_strategy = bubble_strategy
        self.initial_rate_bps = initial_rate_bps or capacity_bps / max(1, len(peers))
        self._rate_hint: dict[int, float] = {}
        self._open: dict[int, dict] = {}
        self._stale = None
        self._last_counters = self.maps.counters()
        fine_timer_slack()
        self._gso_size = struct.pack("=H", W.HDR_LEN + chunk_bytes)

    # ------------------------------------------------------------------ receive
    def open_round(self, round_: int, nelems: int, workers: list[int] | None = None,
                   critical: np.ndarray | None = None, reliable: bool = False) -> None:
        """Make round_ receivable for `workers` (default: all peers).

        critical: bool per chunk that must arrive from every worker before the
        round may close. reliable: every chunk is critical and only
        completeness (or the hard timeout, an error) closes the round."""
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
        # ACKs divide the capacity among the flows not finished at that moment
        # (the XDP program counts them down); share_kbps(1) is the whole of it.
        self.maps.open_bank(round_, layout.nchunks, layout.last_len,
                            share_kbps=self.share.share_kbps(1), flows=len(workers))
        self.early.start_round(layout.nbytes * len(workers))
        self._open[round_] = {"layout": layout, "workers": workers, "critical": critical,
                              "reliable": reliable, "t_open": time.perf_counter()}

    def wait_round(self, round_: int, poll_s: float = 0.0003) -> RoundResult:
        """Block until round_ closes (Early Close rules); return the filled result.

        Polls the mapped progress counters. While much data is still to come
        it sleeps for half the time the rest needs at line rate (at most 1 ms
        between Early Close decisions, 5 ms in a reliable round, which only
        completeness closes), and every `poll_s` near the end, so a receiver
        that waits costs little CPU (many share a machine on the rig) and
        still sees the last chunk within `poll_s`."""
        st = self._open.get(round_)
        if st is None:
            raise ValueError(f"round {round_} is not open on this endpoint")
        layout, workers = st["layout"], st["workers"]
        slots = [self.peers[w] for w in workers]
        bank = self.maps.bank_index(round_)
        prog = self.maps.progress[bank]
        nch = layout.nchunks
        total = nch * len(workers)
        t_open = st["t_open"]
        first = np.full(len(workers), np.nan)
        contiguous = slots == list(range(slots[0], slots[0] + len(slots)))
        sl = slice(slots[0], slots[0] + len(slots)) if contiguous else slots
        limit = st.get("timeout_s") or self.early.cfg.hard_timeout_s
        next_decide = 0.0
        last_bytes, last_t, last_retx, last_done = None, 0.0, 0, 0
        reliable = st["reliable"]
        # seconds per chunk at line rate, and the longest sleep
        chunk_s = (self.chunk_bytes + FRAME_OVERHEAD) * 8 / self.capacity_bps
        max_sleep = max(poll_s, 0.005 if reliable else 0.001)
        reason = None
        while reason is None:
            chunks = prog["chunks"][sl]
            done = int(chunks.sum())
            now = time.perf_counter() - t_open
            if done == total:
                reason = COMPLETE
                break
            if reliable:  # only completeness (above) or the hard timeout closes it
                if now >= limit:
                    reason = TIMEOUT
            elif now >= next_decide:  # the full rule about once a millisecond
                first[np.isnan(first) & (chunks > 0)] = now
                active = int((chunks < nch).sum())
                # on the wire: payload plus each chunk's Ethernet, IP, UDP and LTP headers,
                # the bytes the capacity C is counted in
                nbytes = int(prog["bytes"][sl].sum()) + done * FRAME_OVERHEAD
                retx = int(prog["retx"][sl].sum())
                boosted = False
                if done and active and last_bytes is not None and now > last_t:
                    # the re-sent share of what arrived; not judged on a few
                    # chunks (the round's last re-sends are all re-sends)
                    fresh = done - last_done
                    resent = (retx - last_retx) / fresh if fresh >= LOSS_SAMPLE else 0.0
                    boosted = self.share.observe((nbytes - last_bytes) * 8 / (now - last_t),
                                                 resent)
                last_bytes, last_t, last_retx, last_done = nbytes, now, retx, done
                next_decide = now + 0.001
                if boosted:
                    self.maps.set_share(round_, self.share.share_kbps(1))
                crit_ok = True
                if st["critical"] is not None:
                    crit_ok = self._critical_ok(round_, st, slots)
                reason = self.early.decide(now, first, chunks / nch, crit_ok)
            if reason is None:
                time.sleep(min(max_sleep, max(poll_s, 0.5 * (total - done) * chunk_s)))
        if reliable:  # when its chunks began to arrive, for the report (the XDP
            # program's clock is CLOCK_MONOTONIC, as perf_counter's is on Linux)
            started = prog["first_ns"][sl].astype(np.float64)
            first[:] = np.where(started > 0, started / 1e9 - t_open, np.nan)
        t_first = t_open + float(np.nanmin(first)) if (~np.isnan(first)).any() else None
        t_close = time.perf_counter()
        self.maps.close_bank(round_)
        return self._collect(round_, st, reason, t_open, t_first, t_close)

    def cancel_round(self, round_: int) -> None:
        """Retire an open round without collecting it (its bank is closed)."""
        if self._open.pop(round_, None) is None:
            raise ValueError(f"round {round_} is not open on this endpoint")
        self.maps.close_bank(round_)

    def _critical_ok(self, round_: int, st: dict, slots: list[int]) -> bool:
        nch = st["layout"].nchunks
        crit = st["critical"] if st["critical"] is not None else np.ones(nch, dtype=bool)
        return all(self.maps.done_mask(round_, s, nch)[crit].all() for s in slots)

    def _collect(self, round_, st, reason, t_open, t_first, t_close) -> RoundResult:
        layout, workers = st["layout"], st["workers"]
        slots = [self.peers[w] for w in workers]
        bank = self.maps.bank_index(round_)
        nch, ce = layout.nchunks, layout.chunk_elems
        masks = np.stack([self.maps.done_mask(round_, s, nch) for s in slots])
        mem = self.maps.mem[bank]  # [slots, max_elems_padded]
        if slots == list(range(slots[0], slots[0] + len(slots))):
            chunked = mem[slots[0]:slots[0] + len(slots), :nch * ce].reshape(len(slots), nch, ce)
        else:  # non-contiguous slot set: work on a copy
            chunked = mem[slots, :nch * ce].reshape(len(slots), nch, ce)
        strategy = self.bubble_strategy
        if strategy == "stale":
            stale, valid = self._stale_state(len(self.peers), nch, ce)
            filled = bubble.fill(chunked, masks, "stale", stale[slots], valid[slots])
        else:
            filled = bubble.fill(chunked, masks, strategy)
        if strategy == "stale" and not st["reliable"]:
            stale, valid = self._stale_state(len(self.peers), nch, ce)
            idx = np.asarray(slots)
            s_view, v_view = stale[idx], valid[idx]
            bubble.remember(s_view, v_view, chunked, masks)
            stale[idx], valid[idx] = s_view, v_view
        for i, s in enumerate(slots):  # round outcomes, for `ltp flows` from any process
            self.maps.record_round(s, reason, int(masks[i].sum()), int(filled[i]), round_=round_)
        values = chunked.reshape(len(slots), nch * ce)[:, :layout.nelems]
        prog = self.maps.progress[bank][slots]
        counters = self.maps.counters()
        late = counters["late"] + counters["stale"] - self._last_counters["late"] - \
            self._last_counters["stale"]
        dups = counters["dup"] - self._last_counters["dup"]
        self._last_counters = counters
        delivered_bytes = int(prog["bytes"].sum())
        retx = int(prog["retx"].sum())
        missing = int((~masks).sum())
        active_s = (t_close - t_first) if t_first else 0.0
        crit_missing = {}
        if st["critical"] is not None or st["reliable"]:
            crit = st["critical"] if st["critical"] is not None else np.ones(nch, dtype=bool)
            for i, w in enumerate(workers):
                miss = np.nonzero(crit & ~masks[i])[0]
                if miss.size:
                    crit_missing[w] = miss.tolist()
        res = RoundResult(round=round_, reason=reason, duration_s=t_close - t_open,
                          active_s=active_s, workers=workers, layout=layout, values=values,
                          masks=masks, filled=filled,
                          threshold=self.early.threshold, deadline_s=self.early.deadline_s,
                          late=late, duplicates=dups, retx_chunks=retx,
                          critical_missing=crit_missing)
        if not st["reliable"]:
            self.early.end_round(total_bytes=layout.nbytes * len(workers),
                                 delivered_bytes=delivered_bytes, active_s=active_s,
                                 lost_fraction=(retx + missing) / max(1, masks.size))
        del self._open[round_]
        return res

    def _stale_state(self, nworkers: int, nch: int, ce: int):
        shape = (self.slots, nch, ce)
        if self._stale is None or self._stale[0].shape != shape:
            self._stale = (np.zeros(shape, dtype=np.float32), np.zeros(shape[:2], dtype=bool))
        return self._stale

    # --------------------------------------------------------------------- send
    def push(self, round_: int, buf, to: Peer | list[Peer], *, critical=None,
             reliable: bool = False, timeout_s: float = 10.0, seed: int | None = None,
             group: tuple[str, int] | None = None) -> PushReport:
        """Send buf (float32) as round_ to one or more peers.

        Chunks go in a per-round random order, paced to the rate the receiver
        advertises. Unacknowledged chunks are re-sent (flagged RETX) while the
        receiver keeps the round open; a receiver closes a round only once its
        critical chunks (all of them with reliable=True) are in, so critical
        data is re-sent until it arrives. Returns when every target closed the
        round or acknowledged every chunk.

        group: (address, port) of a broadcast address or multicast group that
        reaches every target. The first pass then goes once, to the group,
        instead of once per target (each target's XDP program must know its
        own id: Endpoint(self_id=...)); what a target lacks after that is
        re-sent to it alone."""
        return self.send(self.prepare_push(round_, buf, to, critical=critical, reliable=reliable,
                                           timeout_s=timeout_s, seed=seed, group=group))

    def prepare_push(self, round_: int, buf, to: Peer | list[Peer], *, critical=None,
                     reliable: bool = False, timeout_s: float = 10.0,
                     seed: int | None = None,
                     group: tuple[str, int] | None = None) -> "PushPlan":
        """Everything `push` does before its first packet (checks, chunk order,
        headers, sender state), so a caller can do it ahead of a barrier and
        `send` the plan the moment the round starts. `buf` must not change
        until `send` returns."""
        targets = [to] if isinstance(to, Peer) else list(to)
        if not targets:
            raise ValueError("push needs at least one target peer")
        for t in targets:
            if t.worker not in self.peers:
                raise ValueError(f"peer worker id {t.worker} is not configured on this endpoint")
        arr = as_f32(buf)
        if arr.size > self.max_elems:
            raise ValueError(f"buffer of {arr.size} elements exceeds max_elems={self.max_elems}")
        layout = ChunkLayout(arr.size, self.chunk_bytes)
        nch = layout.nchunks
        crit = np.ones(nch, dtype=bool) if reliable else (
            np.zeros(nch, dtype=bool) if critical is None else np.asarray(critical, dtype=bool))
        if crit.shape != (nch,):
            raise ValueError(f"critical mask needs {nch} entries, got {crit.shape}")
        payload = memoryview(arr).cast("B")
        slots = [self.peers[t.worker] for t in targets]
        for s in slots:
            self.maps.tx_start(round_, s)
        rng = np.random.default_rng(seed if seed is not None else
                                    (round_ * 1_000_003 + targets[0].worker) % 2**32)
        order = rng.permutation(nch).tolist()
        base_flags = W.F_RELIABLE if reliable else 0
        flags = np.full(nch, base_flags, dtype=np.uint16)
        flags[crit] |= W.F_CRITICAL
        flags[-1] |= W.F_LAST
        # Every header of the round, per target, built at once: [target][chunk] -> 32 bytes.
        hdrs = [memoryview(_headers(self.job, round_, t.worker, nch, flags, layout))
                for t in targets]
        bodies = [payload[c * self.chunk_bytes:c * self.chunk_bytes + layout.chunk_len(c)]
                  for c in range(nch)]
        addrs = [(t.ip, t.port) for t in targets]
        if group is not None:  # one more "target": the group, its headers flagged GROUP
            hdrs.append(memoryview(_headers(self.job, round_, 0, nch, flags | W.F_GROUP,
                                            layout)))
            addrs.append((group[0], int(group[1])))
        # Per target and chunk, the two iovec pieces: header (its RETX flag is
        # set in place from the second pass on) and payload. A group push
        # sends its first pass to the group only; the few re-sends to single
        # targets build theirs as they go (pieces None).
        pieces = [[(h[c * W.HDR_LEN:(c + 1) * W.HDR_LEN], bodies[c]) for c in range(nch)]
                  if group is None or i == len(targets) else None for i, h in enumerate(hdrs)]
        first = ([(len(targets), order)] if group is not None else
                 _runs(order, [0] * len(targets), [False] * len(targets)))
        return PushPlan(round_=round_, targets=targets, layout=layout, crit=crit, slots=slots,
                        order=order, hdrs=hdrs, bodies=bodies, pieces=pieces, runs=first,
                        group=group is not None, addrs=addrs, reliable=reliable,
                        timeout_s=timeout_s, buf=arr)

    def send(self, plan: "PushPlan") -> PushReport:
        """Send a prepared push (see `push`).

        The loop runs once per system call, not once per chunk: each pass
        lists the chunks still unacknowledged at its start, and the pacer's
        tokens take the next few of them as one GSO batch. About once a
        millisecond it reads what the ACKs say: the rate and the closed flag
        from the tx map, and which chunks arrived (LossDetector judges them).
        In a group push, `sent` counts a group datagram once, while `acked`
        sums over targets."""
        round_, targets, layout, crit = plan.round_, plan.targets, plan.layout, plan.crit
        slots, order, hdrs, addrs = plan.slots, plan.order, plan.hdrs, plan.addrs
        reliable, timeout_s = plan.reliable, plan.timeout_s
        nch = layout.nchunks
        nt = len(targets)
        grp = nt if plan.group else -1  # the group's index in hdrs/addrs/pieces and runs
        bank = self.maps.bank_index(round_)
        txv = self.maps.tx[bank]
        tx32 = txv.view(np.uint32).reshape(txv.shape[0], 4)  # round, closed, rate_kbps, acked
        nwords = -(-nch // 64)
        words = [self.maps.acked[bank, s, :nwords] for s in slots]
        full_int = (1 << nch) - 1  # every chunk acked
        pieces = plan.pieces
        gso = [(socket.SOL_UDP, UDP_SEGMENT, self._gso_size)]
        short = nch - 1 if layout.last_len != self.chunk_bytes else -1  # must end a GSO batch
        hints = [self._rate_hint.get(t.worker, self.initial_rate_bps) for t in targets]
        rate0 = min(hints) if plan.group else sum(hints)  # a group packet reaches them all
        # The first batch goes at once: the round starts on the barrier, not a
        # pacing interval later.
        pacer = Pacer(rate0, pkt_bytes=self.chunk_bytes + FRAME_OVERHEAD, full=True)
        t0 = time.perf_counter()
        sent = resent = passes = 0
        done_t = [False] * nt
        # The lowest rate a target advertised: its share with every flow active,
        # the rate to start the next round at (shares grow as flows finish).
        low = [0] * nt

        # Chunks found lost (LossDetector) are re-sent next, before the pass
        # goes on; ACK state is a Python int per target (bit c: chunk c acked).
        detectors = [LossDetector() for _ in range(nt)]
        urgent: list[tuple[int, int]] = []  # (target, chunk) found lost, to send next
        # each header as bytes, to flag re-sends in place
        hdr_u8 = [np.frombuffer(h, dtype=np.uint8).reshape(nch, W.HDR_LEN) for h in hdrs]

        def acked_int(i: int) -> int:
            return int.from_bytes(words[i].tobytes(), "little")

        def refresh() -> list:
            """Closed flags; sets the pacer to the sum of the advertised rates
            (their minimum during a group pass)."""
            closed = [bool(tx32[s, 1]) for s in slots]
            rates = [int(tx32[s, 2]) for s in slots]
            for i, r in enumerate(rates):
                if r and (not low[i] or r < low[i]):
                    low[i] = r
            if all(rates):  # a group packet reaches every target at once
                pacer.set_rate((min(rates) if grp >= 0 and passes <= 1 else sum(rates)) * 1000)
            return closed

        def detect_losses() -> list[int]:
            """ACK state per target; queues the chunks found lost."""
            acked = [acked_int(i) for i in range(nt)]
            for i, det in enumerate(detectors):
                for c in det.lost(acked[i]):
                    urgent.append((i, c))
                    hdr_u8[i][c, 5] |= W.F_RETX
            return acked

        while True:
            closed = refresh()
            acked = [acked_int(i) for i in range(nt)]
            for i in range(nt):
                # CLOSED means the receiver is done: it closes a round only once
                # its critical data is in (all of it, for a reliable round).
                if not done_t[i]:
                    done_t[i] = closed[i] or acked[i] == full_int
            if all(done_t):
                break
            if time.perf_counter() - t0 > timeout_s:
                if reliable or any(not all((acked[i] >> c) & 1 for c in np.flatnonzero(crit).tolist())
                                   for i in range(nt)):
                    raise TransportError(
                        f"round {round_}: critical chunks unacknowledged after {timeout_s:g}s "
                        f"(targets {[t.ip for t in targets]})")
                break
            if passes == 0:  # the runs made ready with the plan
                runs = plan.runs
            else:  # from the second pass on, every chunk is a re-send
                if passes == 1:
                    for hv in hdr_u8:
                        hv[:, 5] |= W.F_RETX
                runs = _runs(order, acked, done_t)
                urgent.clear()
                for det in detectors:  # this pass re-sends whatever is still out
                    det.restart()
            passes += 1
            refresh_at = 0.0
            ri = k = 0
            wait_until = None
            while True:
                if ri >= len(runs) and not urgent:
                    # The pass is out: give its last ACKs a round-trip (plus
                    # queueing) to come back, still looking for losses.
                    now = time.perf_counter()
                    if wait_until is None:
                        wait_until = now + TAIL_WAIT
                    if now >= wait_until or all(
                            tx32[s, 1] or acked_int(i) == full_int for i, s in enumerate(slots)):
                        break
                    time.sleep(0.0002)
                    acked = detect_losses()
                    continue
                n = pacer.take()
                now = time.perf_counter()
                if now >= refresh_at:  # what the ACKs say, about once a millisecond
                    closed = refresh()
                    refresh_at = now + 0.001
                    if all(closed):
                        break
                    acked = detect_losses()
                    if grp >= 0:  # what every target still open has: the group skips it
                        acked_open = functools.reduce(
                            operator.and_, (a for a, c in zip(acked, closed) if not c), full_int)
                batch = []
                if urgent:  # lost chunks first, to one target per system call
                    tgt = urgent[0][0]
                    a = acked[tgt]
                    j = 0
                    while j < len(urgent) and len(batch) < n and urgent[j][0] == tgt:
                        c = urgent[j][1]
                        j += 1
                        if not (a >> c) & 1:
                            batch.append(c)
                            if c == short:
                                break
                    at = urgent[:j]
                    del urgent[:j]
                    if closed[tgt]:
                        batch = []
                else:
                    tgt, chunks = runs[ri]
                    if tgt == grp:
                        a, shut = acked_open, all(closed)
                    else:
                        a, shut = acked[tgt], closed[tgt]
                    at = (ri, k)  # to retry this batch if the local queue is full
                    while k < len(chunks) and len(batch) < n:
                        c = chunks[k]
                        k += 1
                        if not (a >> c) & 1:
                            batch.append(c)
                            if c == short:
                                break  # GSO segments all but the last share one size
                    if k >= len(chunks) or shut:
                        ri, k = ri + 1, 0
                        if shut:
                            batch = []
                if len(batch) < n:
                    pacer.refund(n - len(batch))
                if not batch:
                    continue
                pc = pieces[tgt]
                if pc is not None:
                    iov = [p for c in batch for p in pc[c]]
                else:
                    h = hdrs[tgt]
                    iov = []
                    for c in batch:
                        iov += (h[c * W.HDR_LEN:(c + 1) * W.HDR_LEN], plan.bodies[c])
                try:
                    self.sock.sendmsg(iov, gso if len(batch) > 1 else (), 0, addrs[tgt])
                except OSError as e:
                    if e.errno not in (errno.ENOBUFS, errno.EAGAIN):
                        raise
                    if time.perf_counter() - t0 > timeout_s:
                        break  # the device stays full: the pass ends, the timeout rules
                    time.sleep(0.0002)  # local queue full: back off, retry these
                    if isinstance(at, list):
                        urgent[:0] = at
                    else:
                        ri, k = at
                    continue
                for det in (detectors if tgt == grp else (detectors[tgt],)):
                    det.sent.extend(batch)
                wait_until = None
                sent += len(batch)
                if passes > 1 or isinstance(at, list):
                    resent += len(batch)
        for t, r in zip(targets, low):
            if r:
                self._rate_hint[t.worker] = r * 1000
        acked_total = sum(acked_int(i).bit_count() for i in range(nt))
        return PushReport(round=round_, chunks=nch, sent=sent, resent=resent, acked=acked_total,
                          closed_by_receiver=all(bool(tx32[s, 1]) for s in slots),
                          duration_s=time.perf_counter() - t0, passes=passes)

    # ------------------------------------------------------- reliable downlink
    def push_reliable(self, round_: int, buf, to: list[Peer], timeout_s: float = 10.0,
                      group: tuple[str, int] | None = None) -> PushReport:
        """Send buf to every peer in `to`, every chunk critical, until all acked
        (group: see `push`)."""
        return self.push(round_, buf, to, reliable=True, timeout_s=timeout_s, group=group)

    def expect(self, round_: int, nelems: int, source_worker: int) -> None:
        """Open round_ to receive a reliable buffer (e.g. parameters) for
        `source_worker`'s slot (a worker uses its own id)."""
        self.open_round(round_, nelems, workers=[source_worker], reliable=True)

    def receive(self, round_: int, timeout_s: float | None = None,
                out: np.ndarray | None = None) -> np.ndarray:
        """Wait for a reliable round to complete; returns a copy of the buffer
        (written into `out`, a float32 array of the round's size, if given)."""
        if round_ in self._open and timeout_s is not None:
            self._open[round_]["timeout_s"] = timeout_s
        res = self.wait_round(round_)
        if res.reason != COMPLETE:
            raise TransportError(f"reliable round {round_} incomplete after "
                                 f"{res.duration_s:.2f}s: {res.masks.sum()}/{res.masks.size} chunks")
        if out is not None:
            np.copyto(out, res.values[0])
            return out
        return res.values[0].copy()

    # ------------------------------------------------------------------- misc
    def counters(self) -> dict[str, int]:
        return self.maps.counters()

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            if self._published:
                from ...dataplane.xdp import registry
                registry.withdraw(*self._published)
                self._published = None
            self.dp.close()

    def __enter__(self) -> "Endpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["Endpoint", "Peer", "PushReport", "RoundResult", "TransportError", "EarlyCloseConfig",
           "COMPLETE", "DEADLINE", "TIMEOUT"]
