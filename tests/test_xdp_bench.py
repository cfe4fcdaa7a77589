# SPDX-License-Identifier: Apache-2.0
"""`ltp bench xdp`'s arms (control/bench/xdp_stages.py) do what they are
timed for: the copy floor writes the payload where ltp_xdp would, a stage
left out with LTP_BENCH_SKIP is out (and nothing else), the ACK and clock
arms take their paths, a short breakdown and A/B run end to end, and the
live arms (a veth in namespaces) run every frame they send.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import requires_bpf
from ltpx.dataplane.xdp.testrun import XDP_TX, run_xdp

pytestmark = [pytest.mark.root, requires_bpf]

NCH = 64


@pytest.fixture(scope="module")
def stages():
    from ltpx.control.bench import xdp_stages
    return xdp_stages


def payload(S, frame: bytes) -> np.ndarray:
    return np.frombuffer(frame[82:], dtype=np.float32)


def test_floor_copies_the_payload_into_the_rounds_bank(stages):
    S = stages
    frames = S.data_frames(NCH)
    feed = S.DataFeed(frames, source="ltp_floor.c")
    try:
        feed.maps.open_bank(3, NCH, S.CHUNK)
        r = run_xdp(feed.fd, S.with_round(frames[5], 3))
        assert r.verdict == XDP_TX
        got = feed.maps.slot_values(3, 0, NCH * S.CHUNK // 4).reshape(NCH, -1)
        assert np.array_equal(got[5], payload(S, frames[5]))
        assert not got[4].any() and not got[6].any()
        assert feed.maps.counters()["data"] == 0        # the floor counts nothing
        assert not feed.maps.done_mask(3, 0, NCH).any()  # nor marks anything
    finally:
        feed.close()


def test_published_floor_marks_the_chunk_done(stages):
    """floor_done publishes its copy as ltp_xdp does: the chunk's done bit."""
    S = stages
    frames = S.data_frames(NCH)
    feed = S.DataFeed(frames, source="ltp_floor.c", defines=("LTP_FLOOR_PUBLISH=1",))
    try:
        feed.maps.open_bank(3, NCH, S.CHUNK)
        assert run_xdp(feed.fd, S.with_round(frames[5], 3)).verdict == XDP_TX
        got = feed.maps.slot_values(3, 0, NCH * S.CHUNK // 4).reshape(NCH, -1)
        assert np.array_equal(got[5], payload(S, frames[5]))
        assert np.flatnonzero(feed.maps.done_mask(3, 0, NCH)).tolist() == [5]
        assert feed.maps.counters()["data"] == 0
    finally:
        feed.close()


@pytest.mark.parametrize("stage", ["ack_rewrite", "marking", "counters", "claim"])
def test_a_stage_left_out_is_out(stages, stage):
    S = stages
    frames = S.data_frames(NCH)
    feed = S.DataFeed(frames, defines=(f"LTP_BENCH_SKIP={S.STAGES[stage]}",))
    try:
        m = feed.maps
        m.open_bank(3, NCH, S.CHUNK)
        pkt = S.with_round(frames[7], 3)
        r = run_xdp(feed.fd, pkt)
        assert r.verdict == XDP_TX
        got = m.slot_values(3, 0, NCH * S.CHUNK // 4).reshape(NCH, -1)
        assert np.array_equal(got[7], payload(S, pkt))           # the copy is always made
        assert (r.data == pkt) == (stage == "ack_rewrite")       # no ACK: sent back as it came
        assert bool(m.done_mask(3, 0, NCH)[7]) == (stage != "marking")
        assert (m.counters()["data"] == 1) == (stage != "counters")
        again = run_xdp(feed.fd, pkt)                            # the claim bit dedupes
        assert (m.counters()["dup"] == 1) == (stage not in ("claim", "counters"))
        assert again.verdict == XDP_TX
    finally:
        feed.close()


@pytest.mark.parametrize("clocked", [False, True])
def test_ack_arms_take_their_paths(stages, clocked):
    S = stages
    feed = S.AckFeed(NCH, clocked=clocked)
    try:
        ns = feed.run(2 * NCH)       # two rounds: every verdict checked by the feed
        assert len(ns) == 2 * NCH and min(ns) > 0
        c = feed.maps.counters()
        assert c["ack_rx"] >= 2 * NCH
        assert (c["clock_tx"] >= 2 * NCH) == clocked
    finally:
        feed.close()


def test_breakdown_and_ab_run_end_to_end(stages, tmp_path):
    from ltpx import BPF_DIR
    from ltpx.control.bench import xdp
    r = stages.breakdown(packets=400, blocks=2, nchunks=NCH)
    assert set(r["stage_ns"]) == {*stages.STAGES, "checks"}
    # shape, not speed: which arm is faster is the benchmark's to say (a
    # 400-packet block on a busy machine can order them either way)
    assert r["copy_floor_ns_per_packet"] > 0 and r["over_floor"] > 0
    assert r["published_floor_ns_per_packet"] > 0 and r["over_published_floor"] > 0
    assert {"data", "-claim"} <= set(r["arms"])
    assert all(a["ns_per_packet"] > 0 for a in r["arms"].values())
    for f in BPF_DIR.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    ab = xdp.bench_ab(tmp_path, packets=400, blocks=2, nchunks=NCH)
    for path in ("data", "capture", "ack", "clock"):
        assert len(ab[path]["block_ratios"]) == 2 and ab[path]["ratio"] > 0


def test_live_arms_run_every_packet_and_leave_nothing(stages):
    """The live arms (xdp_live.py): every frame ltp_gen sends is run by the
    arm's program on the veth (the DATA path delivers each chunk), and the
    namespaces they made are gone afterwards."""
    from ltpx.control.bench import xdp_live as L
    r = L.live(packets=2 * NCH, blocks=2, nchunks=NCH)
    assert {"floor", "data"} == set(r["arms"])
    assert all(a["packets"] >= 2 * NCH and a["ns_per_packet"] > 0 for a in r["arms"].values())
    assert r["over_floor"] > 0
    assert not [n for n in os.listdir("/run/netns") if n.startswith(f"ltp-bl{os.getpid() % 100000}")]


def test_live_generator_sends_a_rounds_chunks_to_the_data_path(stages):
    from ltpx.control.bench import xdp_live as L
    from ltpx.dataplane.rig.pair import VethPair
    from ltpx.dataplane.xdp.loader import attach_fd, detach
    S = stages
    frames = S.data_frames(NCH)
    with VethPair(f"ltp-blt{os.getpid() % 100000}") as pair:
        gen = L.Generator(pair.a, frames[0], NCH)
        feed = S.DataFeed(frames)
        try:
            attach_fd(feed.fd, pair.b.dev, pair.b.ns)
            for round_ in (1, 2):
                feed.begin(round_)
                gen.send(round_)
                assert feed.maps.done_mask(round_, 0, NCH).all()
            c = feed.maps.counters()
            assert (c["data"], c["ack_tx"], c["malformed"], c["dup"]) == (2 * NCH, 2 * NCH, 0, 0)
        finally:
            detach(pair.b.dev, pair.b.ns)
            feed.close()
            gen.close()
