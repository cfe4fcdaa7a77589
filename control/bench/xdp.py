# SPDX-License-Identifier: Apache-2.0
"""`ltp bench xdp`: cost per packet of the XDP DATA path against a socket loop.

XDP side: the real ltp_xdp program run by BPF_PROG_TEST_RUN on DATA packets
of distinct chunks, one packet per run, so every run validates, copies the
payload into reassembly memory, marks the bitmaps and rewrites the packet into
its ACK. (Repeat mode cannot be used for this path: the kernel re-runs the
program on the packet it already rewrote, so repetitions 2..n would measure
the ACK path.) The kernel's timer gives ns per run; the same harness running
an empty XDP program gives the fixed cost of one test run, which is
subtracted. Socket side: a Python receive loop on a veth pair in namespaces
doing the same work (receive, copy into memory, send an ACK), timed from its
first to its last packet.

A/B (`--against DIR`): bpf/ltp_xdp.c and DIR/ltp_xdp.c (another version of
the program with the same maps) timed in alternating blocks in one process,
so drift and a neighbour's load fall on both arms alike; the spread of the
per-block figures shows the noise, and `--against bpf` (A/A) its size.
"""
from __future__ import annotations

import os
import socket
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from scapy.layers.inet import IP, UDP, Ether
from scapy.layers.l2 import ARP
from scapy.packet import Raw

from ... import BPF_DIR
from ...dataplane import netns
from ...dataplane.rig.pair import VethPair
from ...dataplane.xdp import capring
from ...dataplane.xdp import wire as W
from ...dataplane.xdp.loader import Dataplane, Geometry, compile_program
from ...dataplane.xdp.testrun import XDP_TX, run_xdp
from ...errors import BenchError

CHUNK = 1424
NCHUNKS = 2048


def _data_packet(chunk: int, nchunks: int, body: bytes) -> bytes:
    ltp = W.pack_header(worker=1, round=1, chunk=chunk, nchunks=nchunks, length=len(body))
    return bytes(Ether(src="02:00:00:00:00:0a", dst="02:00:00:00:00:01") /
                 IP(src="198.18.0.10", dst="198.18.0.1") / UDP(sport=40000, dport=W.PORT) /
                 Raw(ltp + body))


def _frames(nchunks: int) -> list[bytes]:
    body = np.arange(CHUNK // 4, dtype=np.float32).tobytes()
    return [_data_packet(c, nchunks, body) for c in range(nchunks)]


def _with_round(frame: bytes, round_: int) -> bytes:
    off = 14 + 20 + 8 + 12  # round field in the LTP header
    return frame[:off] + round_.to_bytes(4, "big") + frame[off + 4:]


class _Arm:
    """One ltp_xdp program (of `bpf_dir`) fed DATA packets of fresh chunks:
    round after round, each chunk of a round once, the round's bank closed
    and the next one opened when all have been sent."""

    def __init__(self, frames: list[bytes], bpf_dir: Path = BPF_DIR, capture: bool = False):
        self.frames, self.pos, self.round = frames, 0, 1
        self.dp = Dataplane(Geometry(slots=1, max_chunks=len(frames)), bpf_dir=bpf_dir)
        try:
            self.cap = _Capture(self.dp, capture)
            self.maps = self.dp.maps()
            self.maps.set_peers({1: 0})
        except BaseException:
            self.dp.close()
            raise

    def run(self, n: int) -> list[int]:
        """Kernel ns of each of the next `n` packets."""
        out = []
        while len(out) < n:
            if self.pos == 0:
                self.maps.open_bank(self.round, len(self.frames), CHUNK)
            r = run_xdp(self.dp.prog_fd, _with_round(self.frames[self.pos], self.round))
            if r.verdict != XDP_TX:
                raise BenchError(f"DATA packet got {r.verdict_name}, expected XDP_TX")
            out.append(r.duration_ns)
            self.pos += 1
            if self.pos == len(self.frames):
                self.maps.close_bank(self.round)
                self.cap.drain()
                self.pos, self.round = 0, self.round + 1
        return out

    def delivered(self) -> int:
        return self.maps.counters()["data"]

    def close(self) -> None:
        self.cap.close()
        self.dp.close()


def bench_xdp(packets: int = 20000, nchunks: int = NCHUNKS, capture: bool = False) -> dict:
    """Median and mean kernel ns per DATA packet (copy + ACK rewrite); with
    `capture`, while `ltp capture` would be recording every frame in full
    (the ring is drained between rounds, so none is lost)."""
    arm = _Arm(_frames(nchunks), capture=capture)
    try:
        durations = arm.run(packets)
        delivered = arm.delivered()
    finally:
        arm.close()
    return {"packets": len(durations), "delivered": delivered, "captured": arm.cap.captured,
            "median_ns": statistics.median(durations),
            "mean_ns": statistics.fmean(durations)}


class _Capture:
    """Capture on (as `ltp capture` leaves it) on a Dataplane, or nothing."""

    def __init__(self, dp, on: bool):
        self.captured, self.cap = 0, None
        if on:
            self.cap = capring.RingCapture(capring.CaptureMaps.from_dataplane(dp)).start()

    def drain(self) -> None:
        if self.cap is not None:
            self.cap.ring.drain()
            self.cap.renew()

    def close(self) -> None:
        if self.cap is not None:
            self.captured = self.cap.stats()["captured"]
            self.cap.__exit__()
            self.cap = None


def trimmed_mean(values: list[int], cut: float = 0.1) -> float:
    """Mean of `values` without the lowest and highest `cut` of them. The
    kernel's test-run timer steps by about 10 ns on the VMs measured, so a
    median moves in steps of 2-3 % of a DATA packet's cost; this mean does not."""
    v = sorted(values)
    k = int(len(v) * cut)
    return statistics.fmean(v[k:len(v) - k])


def _arm_figures(blocks: list[list[int]], harness: float) -> dict:
    every = [d for b in blocks for d in b]
    return {"ns_per_packet": round(max(trimmed_mean(every) - harness, 1.0), 1),
            "median_ns": round(max(statistics.median(every) - harness, 1.0), 1),
            "raw_trimmed_mean_ns": round(trimmed_mean(every), 1),
            "block_ns": [round(trimmed_mean(b) - harness, 1) for b in blocks]}


def bench_ab(against: Path, packets: int = 20000, blocks: int = 10,
             nchunks: int = NCHUNKS, progress=None) -> dict:
    """bpf/ltp_xdp.c ("this") against <against>/ltp_xdp.c: `packets` DATA
    packets each, in `blocks` blocks. Each block loads both programs afresh
    (from the compile cache) and runs them one after the other, the first
    loaded first; which arm that is alternates from block to block, since
    the arm loaded first runs a few percent slower (an A/A run shows it).
    Per arm ns per packet, the trimmed mean less the harness (and the
    median); the ratio this / against overall and per block."""
    step = progress or (lambda msg: None)
    frames = _frames(nchunks)
    dirs = {"this": BPF_DIR, "against": Path(against)}
    per = max(1, packets // blocks)
    got: dict[str, list[list[int]]] = {k: [] for k in dirs}
    for b in range(blocks):
        step(f"block {b + 1}/{blocks}")
        order = ("this", "against") if b % 2 == 0 else ("against", "this")
        arms = {}
        try:
            for k in order:
                arms[k] = _Arm(frames, bpf_dir=dirs[k])
            for k in order:
                arms[k].run(nchunks)            # one round to warm up: pages touched
                got[k].append(arms[k].run(per))
        finally:
            for arm in arms.values():
                arm.close()
    harness = bench_harness()
    this, other = (_arm_figures(got[k], harness) for k in ("this", "against"))
    block_ratios = [round(t / max(a, 1.0), 3) for t, a in zip(this["block_ns"], other["block_ns"])]
    return {"against": str(against), "packets_per_arm": per * blocks, "blocks": blocks,
            "harness_ns": harness, "this": this, "against_arm": other,
            "ratio": round(this["ns_per_packet"] / other["ns_per_packet"], 3),
            "median_ratio": round(this["median_ns"] / other["median_ns"], 3),
            "block_ratios": block_ratios,
            "block_ratio_min": min(block_ratios), "block_ratio_max": max(block_ratios)}


SENDER = r"""
import socket, sys
dst, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
msg = bytes(int(sys.argv[4]))
for _ in range(n):
    try:
        s.sendto(msg, (dst, port))
    except BlockingIOError:
        pass
"""


def bench_socket(packets: int = 50000, payload: int = W.HDR_LEN + CHUNK) -> dict:
    """A Python UDP receive loop doing the XDP program's job: receive, copy
    the payload into reassembly memory, send an ACK. ns per packet received."""
    mem = np.zeros(packets * CHUNK // 4 + CHUNK, dtype=np.float32)
    view = memoryview(mem).cast("B")
    with VethPair(f"ltp-bx{os.getpid() % 100000}") as pair:
        rx = pair.udp_socket(pair.b, W.PORT)
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 25)
        rx.settimeout(0.5)
        buf = bytearray(2048)
        ack = bytes(W.HDR_LEN)
        proc = netns.popen(pair.a.ns, [sys.executable, "-c", SENDER, pair.b.ip, str(W.PORT),
                                       str(packets), str(payload)])
        got = 0
        first = last = 0.0
        try:
            while got < packets:
                try:
                    n, src = rx.recvfrom_into(buf)
                except TimeoutError:
                    break
                if got == 0:
                    first = time.perf_counter()
                off = (got % packets) * CHUNK
                view[off:off + n - W.HDR_LEN] = buf[W.HDR_LEN:n]
                rx.sendto(ack, src)
                got += 1
                last = time.perf_counter()
        finally:
            proc.wait(timeout=30)
            rx.close()
    if got < 2:
        raise BenchError("the socket loop received no packets")
    return {"packets": got, "ns_per_packet": (last - first) * 1e9 / (got - 1)}


def bench_harness(runs: int = 5000) -> float:
    """Median ns of one BPF_PROG_TEST_RUN of an empty XDP program."""
    b, fn = compile_program("xdp_pass.c", "xdp_pass")
    try:
        frame = bytes(Ether() / ARP())
        return float(statistics.median(run_xdp(fn.fd, frame).duration_ns for _ in range(runs)))
    finally:
        b.cleanup()


def run(packets: int = 20000, progress=None) -> dict:
    step = progress or (lambda msg: None)
    step("XDP DATA path (BPF_PROG_TEST_RUN)")
    x = bench_xdp(packets)
    step("... with ltp capture recording every frame")
    xc = bench_xdp(packets, capture=True)
    harness = bench_harness()
    step("Python socket loop on a veth pair")
    s = bench_socket(max(packets, 20000))
    xdp_ns = max(x["median_ns"] - harness, 1.0)
    return {"xdp_ns_per_packet": round(xdp_ns, 1),
            "xdp_raw_ns_per_packet": x["median_ns"], "harness_ns": harness,
            "xdp_packets": x["packets"],
            "xdp_capture_ns_per_packet": round(max(xc["median_ns"] - harness, 1.0), 1),
            "xdp_capture_raw_ns_per_packet": xc["median_ns"],
            "socket_ns_per_packet": round(s["ns_per_packet"], 1),
            "socket_packets": s["packets"],
            "speedup": round(s["ns_per_packet"] / xdp_ns, 1)}
