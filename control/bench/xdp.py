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
"""
from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from ...dataplane.xdp import wire as W
from ...errors import BenchError
from ...dataplane.xdp.loader import Dataplane, Geometry
from ...dataplane.xdp.testrun import XDP_TX, run_xdp

CHUNK = 1424


def _data_packet(chunk: int, nchunks: int, body: bytes) -> bytes:
    from scapy.layers.inet import IP, UDP, Ether
    from scapy.packet import Raw
    ltp = W.pack_header(worker=1, round=1, chunk=chunk, nchunks=nchunks, length=len(body))
    return bytes(Ether(src="02:00:00:00:00:0a", dst="02:00:00:00:00:01") /
                 IP(src="198.18.0.10", dst="198.18.0.1") / UDP(sport=40000, dport=W.PORT) /
                 Raw(ltp + body))


def bench_xdp(packets: int = 20000, nchunks: int = 2048, capture: bool = False) -> dict:
    """Median and mean kernel ns per DATA packet (copy + ACK rewrite); with
    `capture`, while `ltp capture` would be recording every frame in full
    (the ring is drained between rounds, so none is lost)."""
    g = Geometry(slots=1, max_chunks=nchunks)
    body = np.arange(CHUNK // 4, dtype=np.float32).tobytes()
    frames = [_data_packet(c, nchunks, body) for c in range(nchunks)]
    durations = []
    with Dataplane(g) as dp, _Capture(dp, capture) as cap:
        m = dp.maps()
        m.set_peers({1: 0})
        round_ = 1
        while len(durations) < packets:
            m.open_bank(round_, nchunks, CHUNK)
            for f in frames:
                r = run_xdp(dp.prog_fd, _with_round(f, round_))
                if r.verdict != XDP_TX:
                    raise BenchError(f"DATA packet got {r.verdict_name}, expected XDP_TX")
                durations.append(r.duration_ns)
            m.close_bank(round_)
            cap.drain()
            round_ += 1
        delivered = m.counters()["data"]
    durations = durations[:packets]
    return {"packets": len(durations), "delivered": delivered, "captured": cap.captured,
            "median_ns": statistics.median(durations),
            "mean_ns": statistics.fmean(durations)}


class _Capture:
    """Capture on (as `ltp capture` leaves it) on a Dataplane, or nothing."""

    def __init__(self, dp, on: bool):
        self.captured, self.cap = 0, None
        if on:
            from ...dataplane.xdp import capring
            self.cap = capring.RingCapture(capring.CaptureMaps.from_dataplane(dp)).start()

    def drain(self) -> None:
        if self.cap is not None:
            self.cap.ring.drain()
            self.cap.renew()

    def __enter__(self) -> "_Capture":
        return self

    def __exit__(self, *exc) -> None:
        if self.cap is not None:
            self.captured = self.cap.stats()["captured"]
            self.cap.__exit__(*exc)


def _with_round(frame: bytes, round_: int) -> bytes:
    off = 14 + 20 + 8 + 12  # round field in the LTP header
    return frame[:off] + round_.to_bytes(4, "big") + frame[off + 4:]


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
    import os
    import socket
    from ...dataplane import netns
    from ...dataplane.rig.pair import VethPair
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
    from scapy.layers.inet import Ether
    from scapy.layers.l2 import ARP
    from ...dataplane.xdp.loader import compile_program
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
