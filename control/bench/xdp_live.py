# SPDX-License-Identifier: Apache-2.0
"""`ltp bench xdp`'s live arms: the copy floor and the DATA path receiving
batches in a veth's NAPI loop, with their caches as a receive loop keeps
them, beside the test-run arms (xdp_stages.py), where every run starts cold.

A veth pair in two namespaces the bench makes (dataplane/rig/pair.py,
198.18.0.0/15): the arm's program (`empty`: xdp_pass; `floor`: ltp_floor.c;
`data`: ltp_xdp.c with a heartbeat, as xdp_stages.DataFeed sets it up) is
attached in native mode on one end, and bpf/ltp_gen.c, run by
BPF_PROG_TEST_RUN in live-frames mode on the other end, sends it a round's
DATA a batch of 64 frames at a time (each chunk of the round once). The
kernel's run-time statistics (BPF_ENABLE_STATS, on while its fd is held)
give each program's run time and run count; ns per packet is their ratio
less the `empty` arm's (what the statistics' own clock reads add). Arms
take turns in blocks, in an order reversed block by block. Everything the
arms make is removed when they end, also on failure.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import statistics

from ...dataplane import netns
from ...dataplane.clib import libs
from ...dataplane.clib.bpfsys import map_update, obj_info
from ...dataplane.rig.pair import VethPair
from ...dataplane.xdp.loader import attach_fd, compile_program, detach
from ...errors import BenchError
from . import xdp_stages as S

BPF_STATS_RUN_TIME = 0
BPF_F_TEST_XDP_LIVE_FRAMES = 1 << 1
BATCH = 64
# struct bpf_prog_info: offsets of run_time_ns and run_cnt (u64 each)
PROG_INFO_RUN_TIME_NS, PROG_INFO_RUN_CNT = 192, 200
PAY_OFF = 14 + 20 + 8 + 40
LIVE_SLACK = 8


class XdpMd(ctypes.Structure):
    """struct xdp_md, the test run's context (ingress_ifindex: where the
    live frames come in, and go out again on XDP_TX)."""

    _fields_ = [(n, ctypes.c_uint32) for n in ("data", "data_end", "data_meta", "ingress_ifindex",
                                              "rx_queue_index", "egress_ifindex")]


def run_stats(prog_fd: int) -> tuple[int, int]:
    """The kernel's (run_time_ns, run_cnt) of a program (counted while
    BPF_ENABLE_STATS is on)."""
    raw = obj_info(prog_fd, 256)
    return (int.from_bytes(raw[PROG_INFO_RUN_TIME_NS:PROG_INFO_RUN_TIME_NS + 8], "little"),
            int.from_bytes(raw[PROG_INFO_RUN_CNT:PROG_INFO_RUN_CNT + 8], "little"))


@contextlib.contextmanager
def enabled_stats():
    """Run-time statistics on for the body (BPF_ENABLE_STATS: while the fd lives)."""
    fd = libs.libbpf().bpf_enable_stats(BPF_STATS_RUN_TIME)
    if fd < 0:
        raise BenchError(f"BPF_ENABLE_STATS failed: {os.strerror(ctypes.get_errno() or -fd)}")
    try:
        yield
    finally:
        os.close(fd)


class Generator:
    """ltp_gen on `end` of a pair: send(round, n) sends round's chunks
    0..n-1 of worker 1's DATA out of that end, a batch at a time."""

    def __init__(self, end, template: bytes, nchunks: int):
        self.end, self.frame, self.nchunks = end, template, nchunks
        self.b, fn = compile_program("ltp_gen.c", "ltp_gen_xdp")
        self.fd = fn.fd
        self.state = self.b[b"ltp_gen"]
        with netns.inside(end.ns):
            self.ifindex = socket.if_nametoindex(end.dev)

    def send(self, round_: int) -> None:
        st = self.state.Leaf()
        st.round, st.nchunks, st.next, st.len = round_, self.nchunks, 0, len(self.frame)
        ctypes.memmove(ctypes.addressof(st.hdr), self.frame, PAY_OFF)
        map_update(self.state.get_fd(), ctypes.c_uint32(0), st)
        # The page's frame is LIVE_SLACK bytes longer than the DATA: ltp_gen
        # cuts it, so its bounds differ from the page's first ones and the
        # kernel sets the frame's length from them on every send (the far
        # end, cutting its ACK, left its own length there).
        frame = self.frame + bytes(LIVE_SLACK)
        inbuf = ctypes.create_string_buffer(frame, len(frame))
        ctx = XdpMd(data=0, data_end=len(frame), ingress_ifindex=self.ifindex)
        opts = libs.TestRunOpts(sz=ctypes.sizeof(libs.TestRunOpts),
                                data_in=ctypes.addressof(inbuf), data_size_in=len(frame),
                                ctx_in=ctypes.addressof(ctx), ctx_size_in=ctypes.sizeof(ctx),
                                repeat=self.nchunks, flags=BPF_F_TEST_XDP_LIVE_FRAMES,
                                batch_size=BATCH)
        with netns.inside(self.end.ns):      # the ifindex is the namespace's
            libs.check(libs.libbpf().bpf_prog_test_run_opts(self.fd, ctypes.byref(opts)),
                       "sending live frames (BPF_PROG_TEST_RUN)")

    def close(self) -> None:
        self.b.cleanup()


def _arms(frames: list[bytes]) -> dict:
    """Arm name -> (prog fd, begin(round), end(round), close)."""
    out = {}
    empty = S.EmptyFeed(frames)
    out["empty"] = (empty.fd, lambda r: None, lambda r: None, empty.close)
    try:
        for name, source in (("floor", "ltp_floor.c"), ("data", "ltp_xdp.c")):
            f = S.DataFeed(frames, source=source)
            out[name] = (f.fd, f.begin, f.end, f.close)
    except BaseException:
        for arm in out.values():
            arm[3]()
        raise
    return out


def live(packets: int = 20000, blocks: int = 10, nchunks: int = 2048, progress=None) -> dict:
    """ns per packet of the empty program, the copy floor and the DATA path
    receiving from a veth in native XDP, `packets` an arm (whole rounds of
    nchunks) in `blocks` alternating blocks."""
    step = progress or (lambda msg: None)
    frames = S.data_frames(nchunks)
    rounds = max(1, packets // blocks // nchunks)
    got: dict[str, list[tuple[int, int]]] = {}
    round_ = 1
    with VethPair(f"ltp-bl{os.getpid() % 100000}") as pair, enabled_stats():
        gen = Generator(pair.a, frames[0], nchunks)
        arms = _arms(frames)
        try:
            names = list(arms)
            for b in range(blocks):
                step(f"live block {b + 1}/{blocks}")
                for name in names if b % 2 == 0 else names[::-1]:
                    fd, begin, end, _ = arms[name]
                    attach_fd(fd, pair.b.dev, pair.b.ns)
                    try:
                        before = run_stats(fd)
                        for _ in range(rounds):
                            begin(round_)
                            gen.send(round_)
                            end(round_)
                            round_ += 1
                        after = run_stats(fd)
                    finally:
                        detach(pair.b.dev, pair.b.ns)
                    got.setdefault(name, []).append((after[0] - before[0], after[1] - before[1]))
        finally:
            for arm in arms.values():
                arm[3]()
            gen.close()
    return figures(got, rounds * nchunks)


def figures(got: dict[str, list[tuple[int, int]]], expected: int) -> dict:
    """Per arm: ns per packet (all blocks) less the empty arm's, per block
    too, and the packets its program ran (each block should run `expected`)."""
    def ns(pairs):
        t, n = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
        return t / max(n, 1)

    runs = {k: sum(p[1] for p in v) for k, v in got.items()}
    short = {k: n for k, n in runs.items() if n < expected * len(got[k])}
    if short:
        raise BenchError(f"live arms ran fewer packets than sent: {short} "
                         f"(expected {expected} a block)")
    base = ns(got["empty"])
    arms = {k: {"ns_per_packet": round(ns(v) - base, 1),
                "block_ns": [round(t / max(n, 1) - base, 1) for t, n in v],
                "packets": runs[k]}
            for k, v in got.items() if k != "empty"}
    floor = max(arms["floor"]["ns_per_packet"], 1.0)
    per = [round(d / max(f, 1.0), 2) for d, f in zip(arms["data"]["block_ns"],
                                                        arms["floor"]["block_ns"])]
    return {"harness_ns": round(base, 1), "arms": arms,
            "copy_floor_ns_per_packet": arms["floor"]["ns_per_packet"],
            "data_ns_per_packet": arms["data"]["ns_per_packet"],
            "over_floor": round(arms["data"]["ns_per_packet"] / floor, 2),
            "block_over_floor_median": statistics.median(per)}
