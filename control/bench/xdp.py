# SPDX-License-Identifier: Apache-2.0
"""`ltp bench xdp`: cost per packet of the XDP DATA path against a socket loop.

XDP side (control/bench/xdp_stages.py): the real ltp_xdp program run by
BPF_PROG_TEST_RUN on DATA packets of distinct chunks, one packet per run, so
every run validates, copies the payload into reassembly memory, marks the
bitmaps and rewrites the packet into its ACK. (Repeat mode cannot be used
for this path: the kernel re-runs the program on the packet it already
rewrote, so repetitions 2..n would measure the ACK path.) In alternating
blocks of the same run: an empty program on the same frames (the harness,
subtracted), the copy floor, the DATA path with its stages left out one
after another, the same while capturing, the ACK path and the ACK clock.
Live (xdp_live.py): the copy floor and the DATA path attached in native mode
to a veth, receiving DATA a batch at a time in its NAPI loop, timed by the
kernel's run-time statistics. Socket side: a Python receive loop on a veth pair in namespaces doing the
same work (receive, copy into memory, send an ACK), timed from its first to
its last packet.

A/B (`--against DIR`): bpf/ and DIR/ (another version of the program with
the same maps), their DATA path, ACK path and ACK clock timed in alternating
blocks in one process, so drift and a neighbour's load fall on both arms
alike; the spread of the per-block figures shows the noise, and `--against`
a copy of bpf/ (A/A) its size.
"""
from __future__ import annotations

import ctypes
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np

from ... import BPF_DIR
from ...dataplane import netns
from ...dataplane.rig.pair import VethPair
from ...dataplane.xdp import wire as W
from ...errors import BenchError
from ...dataplane.xdp.mapstructs import Tx
from . import xdp_live as L
from . import xdp_stages as S

CHUNK = S.CHUNK
NCHUNKS = 2048


def bench_ab(against: Path, packets: int = 20000, blocks: int = 10,
             nchunks: int = NCHUNKS, progress=None) -> dict:
    """bpf/ ("this") against <against>/ (another version of the program with
    the same maps): its DATA path (also while capturing), ACK path and ACK
    clock, `packets` packets
    an arm in `blocks` blocks, every arm loaded afresh each block, the order
    reversed block by block (xdp_stages.interleave). Per arm ns per packet,
    the trimmed mean less the empty program's on the same frames (and the
    median); per path the ratio this / against, overall and per block."""
    frames = S.data_frames(nchunks)
    acks = S.ack_frames(nchunks, clocked=False)
    dirs = {"this": BPF_DIR, "against": Path(against)}
    # The sender's paths are set up through this version's ltp_tx layout: an
    # older program whose struct ltp_tx differs is timed on the DATA paths only.
    paths = ("data", "capture", "csum") + (("ack", "clock") if _same_tx(Path(against)) else ())
    makers = {"empty": lambda: S.EmptyFeed(frames), "empty_ack": lambda: S.EmptyFeed(acks)}
    for side, d in dirs.items():
        makers[f"data:{side}"] = lambda d=d: S.DataFeed(frames, bpf_dir=d)
        makers[f"capture:{side}"] = lambda d=d: S.DataFeed(frames, bpf_dir=d, capture=True)
        # UDP checksums verified (Endpoint(verify_csum=True)), where the program can
        makers[f"csum:{side}"] = lambda d=d: S.DataFeed(frames, bpf_dir=d, csum=True)
        if "ack" in paths:
            makers[f"ack:{side}"] = lambda d=d: S.AckFeed(nchunks, clocked=False, bpf_dir=d)
            makers[f"clock:{side}"] = lambda d=d: S.AckFeed(nchunks, clocked=True, bpf_dir=d)
    got = S.interleave(makers, packets, blocks, progress)
    base = {k: S.trimmed_mean([d for b in got[k] for d in b]) for k in ("empty", "empty_ack")}
    out = {"against": str(against), "packets_per_arm": max(1, packets // blocks) * blocks,
           "blocks": blocks, "harness_ns": round(base["empty"], 1),
           "ack_harness_ns": round(base["empty_ack"], 1)}
    if "ack" not in paths:
        out["skipped"] = "ack, clock: the other program's struct ltp_tx differs"
    for path in paths:
        b = base["empty" if path in ("data", "capture", "csum") else "empty_ack"]
        this, other = (S.figures(got[f"{path}:{k}"], b) for k in dirs)
        per = [round(t / max(a, 1.0), 3) for t, a in zip(this["block_ns"], other["block_ns"])]
        out[path] = {"this": this, "against_arm": other,
                     "ratio": round(this["ns_per_packet"] / max(other["ns_per_packet"], 1.0), 3),
                     "median_ratio": round(this["median_ns"] / max(other["median_ns"], 1.0), 3),
                     "block_ratios": per, "block_ratio_min": min(per),
                     "block_ratio_max": max(per)}
    return out


def _same_tx(bpf_dir: Path) -> bool:
    """Whether the program in bpf_dir has this version's struct ltp_tx."""
    with S.Dataplane(S.Geometry(slots=1, max_chunks=64), bpf_dir=bpf_dir) as d:
        leaf = d.table("ltp_tx")
        return ctypes.sizeof(getattr(leaf, "sLeaf", leaf.Leaf)) == ctypes.sizeof(Tx)


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


def run(packets: int = 20000, blocks: int = 10, progress=None) -> dict:
    """The XDP arms in alternating blocks (xdp_stages.breakdown), then the
    socket loop."""
    step = progress or (lambda msg: None)
    step("XDP arms: DATA path, copy floor, stages left out, capture, ACK path, ACK clock")
    bd = S.breakdown(packets, blocks, progress=step)
    step("live arms: copy floor and DATA path receiving from a veth (native XDP)")
    live = L.live(packets, blocks, progress=step)
    step("Python socket loop on a veth pair")
    s = bench_socket(max(packets, 20000))
    arms = bd["arms"]
    xdp_ns = max(arms["data"]["ns_per_packet"], 1.0)
    cap_ns = arms["capture"]["ns_per_packet"]
    return {"xdp_ns_per_packet": xdp_ns,
            "xdp_raw_ns_per_packet": arms["data"]["raw_trimmed_mean_ns"],
            "harness_ns": bd["harness_ns"], "xdp_packets": bd["packets_per_arm"],
            "blocks": bd["blocks"],
            "xdp_capture_ns_per_packet": cap_ns,
            "xdp_capture_raw_ns_per_packet": arms["capture"]["raw_trimmed_mean_ns"],
            "copy_floor_ns_per_packet": bd["copy_floor_ns_per_packet"],
            "over_floor": bd["over_floor"],
            "capture_over_floor": round(cap_ns / max(bd["copy_floor_ns_per_packet"], 1.0), 2),
            "published_floor_ns_per_packet": bd["published_floor_ns_per_packet"],
            "over_published_floor": bd["over_published_floor"],
            "capture_over_published_floor": round(
                cap_ns / max(bd["published_floor_ns_per_packet"], 1.0), 2),
            "stage_ns": bd["stage_ns"],
            "ack_ns_per_packet": bd["ack_ns_per_packet"],
            "clock_ns_per_packet": bd["clock_ns_per_packet"],
            "ack_harness_ns": bd["ack_harness_ns"],
            "arms": {k: {f: v[f] for f in ("ns_per_packet", "median_ns", "raw_trimmed_mean_ns")}
                     for k, v in arms.items()},
            "live": live,
            "socket_ns_per_packet": round(s["ns_per_packet"], 1),
            "socket_packets": s["packets"],
            "speedup": round(s["ns_per_packet"] / xdp_ns, 1)}
