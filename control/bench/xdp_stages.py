# SPDX-License-Identifier: Apache-2.0
"""`ltp bench xdp`'s arms: the DATA path, its copy floor, the DATA path with
one stage left out at a time, the ACK path and the ACK clock, timed in
alternating blocks of one run.

Every arm is one program run by BPF_PROG_TEST_RUN, one packet per run, each
packet a fresh chunk: `empty` (xdp_pass on the DATA frames: the harness),
`floor` (bpf/ltp_floor.c: the one copy no LTP program can skip, same maps
and memory layout), `floor_done` (the same publishing the copy with its done
bit, as ltp_xdp does: a locked operation, which waits for the copy's stores
to drain, where `floor` returns with them still draining), `data`
(bpf/ltp_xdp.c), `capture` (the same while
`ltp capture` records every frame), `-<stage>` (ltp_xdp.c compiled with
-DLTP_BENCH_SKIP leaving that stage and the ones before it in STAGES out),
`ack` (a sender's program taking the ACKs of a round), `clock` (the ACK
clock growing each ACK into the flow's next DATA) and `empty_ack` (xdp_pass
on those ACKs: their harness). Each block loads every arm afresh from the compile cache,
in an order rotated block by block (the arm loaded first runs a few percent
slower), warms it with one round and times it; an arm's ns per packet is
the trimmed mean of its packets less the empty arm's.
"""
from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from ... import BPF_DIR
from ...control.transport.endpoint_config import LIVENESS_S
from ...dataplane.xdp import capring, clockmaps
from ...dataplane.xdp import wire as W
from ...dataplane.xdp.loader import Dataplane, Geometry, compile_program
from ...dataplane.xdp.testrun import XDP_DROP, XDP_TX, run_xdp
from ...errors import BenchError

CHUNK = W.CHUNK_BYTES
ETH_IP_UDP = bytes.fromhex("020000000001" "02000000000a" "0800")  # dst, src, IPv4
GROW = CHUNK + 64

# The stages left out one after another (cumulative), each with its
# LTP_BENCH_SKIP bit (bpf/ltp_util.h) and what leaving it out leaves out; the
# payload copy stays: what is left at the end is the floor plus the checks.
STAGES = {"ack_rewrite": 1,   # turn_around, checksums, the tail trim, the rate lookups
          "marking": 2,       # done bit, progress atomics, share, clock read
          "counters": 8,      # ltp_counters and ltp_stats
          "claim": 16}        # the claim bit's fetch-or


def trimmed_mean(values: list[int], cut: float = 0.1) -> float:
    """Mean of `values` without the lowest and highest `cut` of them. The
    kernel's test-run timer steps by about 10 ns on the VMs measured, so a
    median moves in steps of 2-3 % of a DATA packet's cost; this mean does not."""
    v = sorted(values)
    k = int(len(v) * cut)
    return statistics.fmean(v[k:len(v) - k])


def _udp_sum(addrs: bytes, udp: bytes) -> int:
    """The UDP checksum of `udp` (its check field 0) between addrs (src + dst)."""
    raw = addrs + bytes([0, 17]) + len(udp).to_bytes(2, "big") + udp
    raw += b"\0" * (len(raw) % 2)
    s = int(np.frombuffer(raw, dtype=">u2").sum(dtype=np.uint64))
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    return (~s & 0xffff) or 0xffff


def _frame(sport: int, dport: int, ltp: bytes, body: bytes = b"") -> bytes:
    """An Ethernet/IPv4/UDP frame 198.18.0.10 -> 198.18.0.1 (IP checksum 0:
    the program does not check it; the UDP checksum whole, as a NIC delivers
    it, for the arm that verifies it)."""
    udp_len = 8 + len(ltp) + len(body)
    addrs = bytes([198, 18, 0, 10, 198, 18, 0, 1])
    ip = (bytes([0x45, 0]) + (20 + udp_len).to_bytes(2, "big") + bytes(4) +
          bytes([64, 17]) + bytes(2) + addrs)
    udp = sport.to_bytes(2, "big") + dport.to_bytes(2, "big") + udp_len.to_bytes(2, "big")
    check = _udp_sum(addrs, udp + bytes(2) + ltp + body)
    return ETH_IP_UDP + ip + udp + check.to_bytes(2, "big") + ltp + body


def data_frames(nchunks: int) -> list[bytes]:
    """DATA of worker 1, round 1, one frame per chunk (a full chunk each)."""
    body = np.arange(CHUNK // 4, dtype=np.float32).tobytes()
    return [_frame(40000, W.PORT, W.pack_header(worker=1, round=1, chunk=c, nchunks=nchunks,
                                                length=CHUNK), body) for c in range(nchunks)]


def ack_frames(nchunks: int, clocked: bool) -> list[bytes]:
    """The ACKs a receiver sends worker 1 for round 1, one per chunk."""
    flags, rate = (W.F_CLOCK, 64) if clocked else (0, 1000)
    return [_frame(W.PORT, 40000, W.pack_header(type=W.T_ACK, worker=1, round=1, chunk=c,
                                                nchunks=nchunks, state=W.RS_OPEN, rate=rate,
                                                flags=flags)) for c in range(nchunks)]


def with_round(frame: bytes, round_: int) -> bytes:
    """`frame` of another round: the round field and the UDP checksum
    updated for it (RFC 1624: HC' = ~(~HC + ~m + m'))."""
    off = 14 + 20 + 8 + 12  # round field in the LTP header
    new = round_.to_bytes(4, "big")
    old_w = int.from_bytes(frame[off:off + 2], "big"), int.from_bytes(frame[off + 2:off + 4], "big")
    new_w = int.from_bytes(new[:2], "big"), int.from_bytes(new[2:], "big")
    hc = int.from_bytes(frame[40:42], "big")
    s = (~hc & 0xffff) + sum(~w & 0xffff for w in old_w) + sum(new_w)
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    check = (~s & 0xffff) or 0xffff
    return frame[:40] + check.to_bytes(2, "big") + frame[42:off] + new + frame[off + 4:]


class Feed:
    """One program fed `frames` round after round, each frame once a round;
    `begin(round)` readies its maps for a round, `end(round)` closes it.
    Every run must give `verdict`; the last `skip_last` frames of a round
    run untimed (the clock's last ACK, which has nothing left to send)."""

    verdict, grow, skip_last = XDP_TX, 0, 0

    def __init__(self, frames: list[bytes], fd: int):
        self.frames, self.fd, self.pos, self.round = frames, fd, 0, 1

    def begin(self, round_: int) -> None:
        pass

    def end(self, round_: int) -> None:
        pass

    def run(self, n: int) -> list[int]:
        """Kernel ns of each of the next `n` timed packets."""
        out, last = [], len(self.frames) - self.skip_last
        while len(out) < n:
            if self.pos == 0:
                self.begin(self.round)
            r = run_xdp(self.fd, with_round(self.frames[self.pos], self.round), grow=self.grow)
            if r.verdict != self.verdict and self.pos < last:
                raise BenchError(f"{type(self).__name__}: packet {self.pos} got "
                                 f"{r.verdict_name}")
            if self.pos < last:
                out.append(r.duration_ns)
            self.pos += 1
            if self.pos == len(self.frames):
                self.end(self.round)
                self.pos, self.round = 0, self.round + 1
        return out

    def close(self) -> None:
        pass


class EmptyFeed(Feed):
    """xdp_pass (XDP_PASS for every frame): the harness on these frames."""

    verdict = 2

    def __init__(self, frames: list[bytes]):
        self.b, fn = compile_program("xdp_pass.c", "xdp_pass")
        super().__init__(frames, fn.fd)

    def close(self) -> None:
        self.b.cleanup()


class DataFeed(Feed):
    """ltp_xdp (or `source`, with `defines`) receiving worker 1's DATA: each
    round's bank opened before its first chunk, with a heartbeat, and closed
    after its last."""

    def __init__(self, frames: list[bytes], source: str = "ltp_xdp.c",
                 defines: tuple[str, ...] = (), bpf_dir: Path = BPF_DIR, capture: bool = False,
                 csum: bool = False):
        self.dp = Dataplane(Geometry(slots=1, max_chunks=len(frames)), bpf_dir=bpf_dir,
                            source=source, defines=defines)
        self.cap = None
        try:
            self.maps = self.dp.maps()
            self.maps.set_peers({1: 0})
            self.maps.set_liveness(LIVENESS_S)   # checked for every packet, as an endpoint's is
            self.maps.set_verify_csum(csum)      # (a program before LTP_CFG_CSUM ignores it)
            if capture:
                self.cap = capring.RingCapture(capring.CaptureMaps.from_dataplane(self.dp)).start()
        except BaseException:
            self.dp.close()
            raise
        super().__init__(frames, self.dp.prog_fd)

    def begin(self, round_: int) -> None:
        n = len(self.frames)   # a threshold to cross, as a receiver's rounds have
        self.maps.open_bank(round_, n, CHUNK, thresh=n * 19 // 20)
        self.maps.beat()

    def end(self, round_: int) -> None:
        self.maps.close_bank(round_)
        if self.cap is not None:
            self.cap.ring.drain()
            self.cap.renew()

    def close(self) -> None:
        if self.cap is not None:
            self.cap.__exit__()
        self.dp.close()


class AckFeed(Feed):
    """A sender's ltp_xdp taking the receiver's ACKs of its round (worker 1,
    slot 0): recorded and dropped; `clocked`, each grown into the flow's next
    DATA from the send buffer (order = chunk order, one packet primed)."""

    grow = GROW

    def __init__(self, nchunks: int, clocked: bool, bpf_dir: Path = BPF_DIR):
        self.clocked = clocked
        self.verdict, self.skip_last = (XDP_TX, 1) if clocked else (XDP_DROP, 0)
        self.dp = Dataplane(Geometry(slots=1, max_chunks=nchunks), bpf_dir=bpf_dir)
        try:
            self.maps = self.dp.maps()
            self.maps.set_peers({1: 0})
        except BaseException:
            self.dp.close()
            raise
        self.payload = np.arange(nchunks * CHUNK, dtype=np.uint32).astype(np.uint8)
        super().__init__(ack_frames(nchunks, clocked), self.dp.prog_fd)

    def begin(self, round_: int) -> None:
        n = len(self.frames)
        self.maps.tx_start(round_, 0)
        if self.clocked:
            clockmaps.load(self.maps, round_, self.payload, np.arange(n), np.zeros(n, bool), CHUNK)
            clockmaps.start(self.maps, round_, 0, nchunks=n, last_len=CHUNK, flags=0, primed=1)

    def close(self) -> None:
        self.dp.close()


def figures(blocks: list[list[int]], base: float) -> dict:
    every = [d for b in blocks for d in b]
    return {"ns_per_packet": round(trimmed_mean(every) - base, 1),
            "median_ns": round(statistics.median(every) - base, 1),
            "raw_trimmed_mean_ns": round(trimmed_mean(every), 1),
            "block_ns": [round(trimmed_mean(b) - base, 1) for b in blocks]}


def arms(nchunks: int, stages: bool = True, capture: bool = True) -> dict:
    """Arm name -> a function making its Feed afresh."""
    frames = data_frames(nchunks)
    out = {"empty": lambda: EmptyFeed(frames),
           "floor": lambda: DataFeed(frames, source="ltp_floor.c"),
           "floor_done": lambda: DataFeed(frames, source="ltp_floor.c",
                                          defines=("LTP_FLOOR_PUBLISH=1",)),
           "data": lambda: DataFeed(frames)}
    if capture:
        out["capture"] = lambda: DataFeed(frames, capture=True)
    bits = 0
    for name, bit in STAGES.items() if stages else ():
        bits |= bit
        out[f"-{name}"] = lambda b=bits: DataFeed(frames, defines=(f"LTP_BENCH_SKIP={b}",))
    acks = ack_frames(nchunks, clocked=False)
    out["empty_ack"] = lambda: EmptyFeed(acks)
    out["ack"] = lambda: AckFeed(nchunks, clocked=False)
    out["clock"] = lambda: AckFeed(nchunks, clocked=True)
    return out


def interleave(makers: dict, packets: int, blocks: int, progress=None) -> dict:
    """Every arm's packets' kernel ns, `packets` an arm in `blocks` blocks,
    every arm loaded afresh each block and the arms loaded and run in their
    order, then reversed in the next block (the arm loaded first runs a few
    percent slower), and so on."""
    step = progress or (lambda msg: None)
    names = list(makers)
    per = max(1, packets // blocks)
    got: dict[str, list[list[int]]] = {k: [] for k in names}
    for b in range(blocks):
        step(f"block {b + 1}/{blocks}")
        order = names if b % 2 == 0 else names[::-1]
        feeds = {}
        try:
            for k in order:
                feeds[k] = makers[k]()
            for k in order:
                feeds[k].run(len(feeds[k].frames))      # one round to warm up: pages touched
                got[k].append(feeds[k].run(per))
        finally:
            for f in feeds.values():
                f.close()
    return got


def breakdown(packets: int = 20000, blocks: int = 10, nchunks: int = 2048,
              stages: bool = True, progress=None) -> dict:
    """Every arm's ns per packet (less the empty program's on the same
    frames), the copy floor, the DATA path over it, and where the rest goes:
    per stage, what leaving it out (after the stages before it) saved;
    `checks` what is left over the floor with every stage out (parsing,
    validation, the lookups, the capture test). Cache misses dominate under
    this harness (every run starts cold), so a stage's figure depends on
    which lines the stages before it touched: read them as an order, not
    as independent parts. `published_floor_ns_per_packet`: the floor with
    its copy published by a done bit (`floor_done`), the floor of any
    program that marks the copy with an atomic; `over_published_floor` the
    DATA path over it."""
    got = interleave(arms(nchunks, stages=stages), packets, blocks, progress)
    base = {k: trimmed_mean([d for b in got[k] for d in b]) for k in ("empty", "empty_ack")}
    fig = {k: figures(v, base["empty_ack" if k in ("ack", "clock") else "empty"])
           for k, v in got.items() if not k.startswith("empty")}
    ns = {k: f["ns_per_packet"] for k, f in fig.items()}
    floor, data = max(ns["floor"], 1.0), ns["data"]
    published = max(ns["floor_done"], 1.0)
    cost, prev = {}, data
    for s in STAGES if stages else ():
        cost[s], prev = round(prev - ns[f"-{s}"], 1), ns[f"-{s}"]
    if stages:
        cost["checks"] = round(prev - floor, 1)
    return {"packets_per_arm": max(1, packets // blocks) * blocks, "blocks": blocks,
            "harness_ns": round(base["empty"], 1), "ack_harness_ns": round(base["empty_ack"], 1),
            "arms": fig, "copy_floor_ns_per_packet": ns["floor"],
            "over_floor": round(data / floor, 2), "stage_ns": cost,
            "published_floor_ns_per_packet": ns["floor_done"],
            "over_published_floor": round(data / published, 2),
            "ack_ns_per_packet": ns["ack"], "clock_ns_per_packet": ns["clock"]}
