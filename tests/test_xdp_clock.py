# SPDX-License-Identifier: Apache-2.0
"""The ACK clock (docs/transport.md), packet by packet through
BPF_PROG_TEST_RUN: the sender's program turning an ACK into the flow's next
DATA, or consuming it (credit said STOP, round closed, nothing left, a
second ACK), and the receiver's program deciding each clocked flow's credit.

Sender set-up (each case): worker 3 is slot 1; round 9 is being sent with
the clock, 4 chunks (the last 8 bytes) in the order ORDER, chunk 2
critical, position 0 primed (in flight 1). Receiver set-up: round 5 open in
bank 1 with a window of 4 packets shared by 2 flows (credit 2 each).
"""
from __future__ import annotations

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP, Ether
from scapy.packet import Raw

from conftest import requires_bpf, star_rig
from ltpx.control.trust import tokens
from ltpx.dataplane.xdp import clockmaps
from ltpx.dataplane.xdp import wire as W
from ltpx.dataplane.xdp.testrun import XDP_DROP, XDP_TX, run_xdp

pytestmark = requires_bpf

JOB, CHUNK, LAST, NCH = 7, 1424, 8, 4
ORDER = [2, 0, 3, 1]
CRIT = np.array([False, False, True, False])
WORKER_MAC, PS_MAC = "02:00:00:00:00:0a", "02:00:00:00:00:01"
WORKER_IP, PS_IP = "198.18.0.10", "198.18.0.1"
SECRET = bytes(range(16))
GROW = CHUNK + 64


def tok(r: int) -> int:
    return tokens.derive(SECRET, JOB, r)


def gradient(nelems: int = (3 * CHUNK + LAST) // 4, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(nelems).astype(np.float32)


def ack(chunk=2, round_=9, flags=W.F_CLOCK, state=W.RS_OPEN, rate=2, token=None, worker=3):
    return (Ether(src=PS_MAC, dst=WORKER_MAC) / IP(src=PS_IP, dst=WORKER_IP, id=1) /
            UDP(sport=W.PORT, dport=40000) /
            W.LTP(type=W.T_ACK, worker=worker, job=JOB, round=round_, chunk=chunk,
                  nchunks=NCH, state=state, rate=rate, flags=flags, len=0,
                  token=tok(round_) if token is None else token))


def clocked_data(chunk=1, stamp=(1, 0), round_=5, worker=3, nchunks=NCH, body=None):
    if body is None:
        body = np.arange((LAST if chunk == nchunks - 1 else CHUNK) // 4, dtype=np.float32).tobytes()
    return (Ether(src=WORKER_MAC, dst=PS_MAC) / IP(src=WORKER_IP, dst=PS_IP, id=2) /
            UDP(sport=40000, dport=W.PORT) /
            W.LTP(worker=worker, job=JOB, round=round_, chunk=chunk, nchunks=nchunks,
                  flags=W.F_CLOCK, rate=W.clock_stamp(*stamp), token=tok(round_)) / Raw(body))


@pytest.fixture(scope="module")
def dp(small_geometry):
    from ltpx.dataplane.xdp.loader import Dataplane
    with Dataplane(small_geometry, job=JOB) as d:
        d.maps().set_peers({3: 1, 9: 2})
        yield d


def start_round(m, round_=9, grad=None, primed=1, flags=0):
    grad = gradient() if grad is None else grad
    m.tx_start(round_, 1, tok(round_))
    clockmaps.load(m, round_, grad.view(np.uint8), ORDER, CRIT, CHUNK)
    clockmaps.start(m, round_, 1, nchunks=NCH, last_len=LAST, flags=flags, primed=primed)
    return grad


@pytest.fixture
def maps(dp):
    m = dp.maps()
    m.open_bank(5, NCH, LAST, token=tok(5), flows=2, window=4)
    start_round(m)
    return m


def run(dp, pkt):
    return run_xdp(dp.prog_fd, bytes(pkt), grow=GROW)


def delta(m, before):
    after = m.counters()
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def tx(m, round_=9):
    t = m.tx_state(round_, 1)
    return {k: int(t[k]) for k in ("next", "added", "consumed", "stops", "sent", "window",
                                   "closed")}


def chunk_bytes(grad, c):
    raw = grad.view(np.uint8)
    return raw[c * CHUNK:c * CHUNK + (LAST if c == NCH - 1 else CHUNK)].tobytes()


def assert_checksums_right(frame: bytes):
    got = Ether(frame)
    del got[IP].chksum, got[UDP].chksum  # scapy recomputes both and must agree
    assert bytes(Ether(bytes(got))) == frame


# --- the sender: what an ACK becomes -------------------------------------------

@pytest.mark.root
def test_ack_becomes_the_next_chunk(dp, maps):
    grad = start_round(maps)
    before = maps.counters()
    res = run(dp, ack(chunk=ORDER[0]))
    assert res.verdict == XDP_TX
    assert delta(maps, before) == {"ack_rx": 1, "clock_tx": 1}
    out = Ether(res.data)
    assert (out.src, out.dst, out[IP].src, out[IP].dst) == (WORKER_MAC, PS_MAC, WORKER_IP, PS_IP)
    assert (out[UDP].sport, out[UDP].dport) == (40000, W.PORT)
    h = out[W.LTP]
    assert (h.type, h.chunk, h.len, h.round, h.worker, h.nchunks, h.token, h.state) == \
        (W.T_DATA, ORDER[1], CHUNK, 9, 3, NCH, tok(9), 0)
    assert int(h.flags) == W.F_CLOCK
    assert h.rate == W.clock_stamp(1, 0)  # one packet in flight, no STOP seen
    assert bytes(h.payload) == chunk_bytes(grad, ORDER[1])
    assert_checksums_right(res.data)
    assert maps.acked_mask(9, 1, NCH).tolist() == [False, False, True, False]
    assert tx(maps)["next"] == 2 and tx(maps)["sent"] == 1
    assert tx(maps)["window"] == 2 and tx(maps)["consumed"] == 0


@pytest.mark.root
def test_short_last_chunk_and_critical_flag(dp, maps):
    grad = start_round(maps, primed=2, flags=W.F_RELIABLE)  # next position: chunk 3 (the last)
    res = run(dp, ack(chunk=ORDER[0]))
    h = Ether(res.data)[W.LTP]
    assert res.verdict == XDP_TX and h.chunk == 3 and h.len == LAST
    assert int(h.flags) == W.F_CLOCK | W.F_LAST | W.F_RELIABLE
    assert bytes(h.payload) == chunk_bytes(grad, 3) and len(res.data) == 14 + 20 + 8 + 40 + LAST
    assert_checksums_right(res.data)
    res = run(dp, ack(chunk=ORDER[1]))  # position 3 (chunk 1), then ...
    assert Ether(res.data)[W.LTP].chunk == 1
    start_round(maps, primed=0)
    h = Ether(run(dp, ack(chunk=1)).data)[W.LTP]  # position 0 is chunk 2, critical
    assert h.chunk == 2 and int(h.flags) == W.F_CLOCK | W.F_CRITICAL


CONSUMED = [
    ("credit exhausted: STOP is consumed", ack(flags=W.F_CLOCK | W.F_STOP), None,
     {"ack_rx": 1, "clock_stop": 1}, {"consumed": 1, "stops": 1, "next": 1}),
    ("round closed: consumed, the flow stops", ack(state=W.RS_CLOSED), None,
     {"ack_rx": 1, "clock_idle": 1}, {"consumed": 1, "closed": 1, "next": 1}),
    ("nothing left to send: consumed", ack(), lambda m: clockmaps.take_tail(m, 9, 1, 3),
     {"ack_rx": 1, "clock_idle": 1}, {"consumed": 1, "added": 4}),  # no position taken
    ("stale bank (an older round's ACK): dropped, the flow untouched", ack(round_=7), None,
     {"ack_stale": 1}, {}),
    ("ACK without the round's token: dropped, the flow untouched", ack(token=1), None,
     {"bad_token": 1}, {}),
    ("unclocked ACK (a socket push): recorded, never sent on", ack(flags=0), None,
     {"ack_rx": 1}, {}),
    ("flow not clocked: its ACK is only recorded", ack(),
     lambda m: clockmaps.stop(m, 9, 1), {"ack_rx": 1}, {}),
]


@pytest.mark.root
@pytest.mark.parametrize("desc,pkt,before,counters,changes", CONSUMED,
                         ids=[c[0] for c in CONSUMED])
def test_ack_is_consumed(dp, maps, desc, pkt, before, counters, changes):
    if before:
        before(maps)
    t0, c0 = tx(maps), maps.counters()
    res = run(dp, pkt)
    assert res.verdict == XDP_DROP and res.data == bytes(pkt)
    assert delta(maps, c0) == counters
    t1 = tx(maps)
    for k in ("window",):
        t0.pop(k), t1.pop(k)
    assert {k: t1[k] for k in t1 if t1[k] != t0[k]} == \
        {k: v for k, v in changes.items() if v != t0[k]}


@pytest.mark.root
def test_a_second_ack_of_one_chunk_is_consumed(dp, maps):
    """A re-send the first ACK overtook: the first kept the clock going, the
    second's packet leaves the flight."""
    assert run(dp, ack(chunk=2)).verdict == XDP_TX
    c0 = maps.counters()
    assert run(dp, ack(chunk=2, flags=W.F_CLOCK | W.F_DUP)).verdict == XDP_DROP
    assert delta(maps, c0) == {"ack_rx": 1, "clock_idle": 1}
    # not counted as consumed: the re-send was never counted in flight
    assert tx(maps)["consumed"] == 0 and tx(maps)["next"] == 2


@pytest.mark.root
def test_chunks_only_a_sack_names_leave_the_flight(dp, maps):
    """Chunk 1's ACK was lost; chunk 2's ACK names it delivered in its SACK
    bits: chunk 2's ACK still becomes the next DATA, and chunk 1's packet
    leaves the flight (consumed), since no ACK of its own will clock
    anything. Its ACK arriving late after all is dropped, consuming nothing
    more; SACK bits already known free nothing."""
    start_round(maps, primed=3)
    p = ack(chunk=2, flags=W.F_CLOCK | W.F_SACK)
    p[W.LTP].len = W.SACK_LEN
    p = p / Raw(((1 << 1) | (1 << 2)).to_bytes(W.SACK_LEN, "little"))
    assert run(dp, p).verdict == XDP_TX
    assert maps.acked_mask(9, 1, NCH).tolist() == [False, True, True, False]
    assert tx(maps)["consumed"] == 1 and tx(maps)["added"] == 3
    assert run(dp, ack(chunk=1)).verdict == XDP_DROP       # late: seen in the SACK
    assert tx(maps)["consumed"] == 1
    again = ack(chunk=3, flags=W.F_CLOCK | W.F_SACK)
    again[W.LTP].len = W.SACK_LEN
    again = again / Raw(((1 << 1) | (1 << 2) | (1 << 3)).to_bytes(W.SACK_LEN, "little"))
    c0 = maps.counters()
    assert run(dp, again).verdict == XDP_DROP     # the order is all out: consumed, idle
    assert delta(maps, c0) == {"ack_rx": 1, "clock_idle": 1}
    assert tx(maps)["consumed"] == 2              # that one, none for the known SACK bits


@pytest.mark.root
def test_an_ack_that_cannot_grow_is_consumed_and_hands_nothing_out():
    """A frame with too little tailroom for a chunk (here: 4000-byte chunks,
    more than a test-run page holds after the headers): the ACK is consumed
    (one packet fewer in flight, so the control plane sends again) and no
    order position is taken, so no chunk waits for the RTO unsent."""
    from ltpx.dataplane.xdp.loader import Dataplane, Geometry
    big = 4000
    with Dataplane(Geometry(slots=4, max_chunks=64, chunk_bytes=big), job=JOB) as d:
        m = d.maps()
        m.set_peers({3: 1, 9: 2})
        grad = np.zeros((3 * big + LAST) // 4, dtype=np.float32)
        m.tx_start(9, 1, tok(9))
        clockmaps.load(m, 9, grad.view(np.uint8), ORDER, CRIT, big)
        clockmaps.start(m, 9, 1, nchunks=NCH, last_len=LAST, flags=0, primed=1)
        before = m.counters()
        res = run_xdp(d.prog_fd, bytes(ack(chunk=ORDER[0])), grow=big + 64)
        assert res.verdict == XDP_DROP
        assert delta(m, before) == {"ack_rx": 1, "grow_fail": 1}
        t = m.tx_state(9, 1)
        assert int(t["next"]) == 1 and int(t["consumed"]) == 1 and int(t["sent"]) == 0
        assert m.acked_mask(9, 1, NCH).tolist() == [False, False, True, False]


@pytest.mark.root
def test_positions_from_the_tail_are_not_sent_by_the_clock(dp, maps):
    assert clockmaps.take_tail(maps, 9, 1, 2) == [2, 3]
    assert Ether(run(dp, ack(chunk=2)).data)[W.LTP].chunk == ORDER[1]
    assert run(dp, ack(chunk=ORDER[1])).verdict == XDP_DROP  # positions 2, 3 are Python's
    assert tx(maps)["added"] == 3 and tx(maps)["consumed"] == 1


# --- recovery in XDP: RACK over the send log, re-sends before new chunks -------
# A 12-chunk round in order 0..11, chunks 0 and 1 primed from the socket; the
# clock sends chunk c as log entry c - 2. Chunk LOST's DATA (entry 2) is
# lost: it is never ACKed, while every other chunk is, in order. Entry 2 is
# judged lost once entry 6 (chunk 8) is acked: 6 - 2 > LTP_RACK_REORDER.

RACK_N, LOST = 12, 4


def rack_round(m, rack=True):
    grad = gradient((RACK_N - 1) * CHUNK // 4 + LAST // 4, seed=4)
    m.tx_start(9, 1, tok(9))
    clockmaps.load(m, 9, grad.view(np.uint8), list(range(RACK_N)), np.zeros(RACK_N, bool), CHUNK)
    clockmaps.start(m, 9, 1, nchunks=RACK_N, last_len=LAST, flags=0, primed=2, rack=rack)
    return grad


def ack_all_but(dp, lost, upto):
    """ACK chunks 0..upto-1 but `lost` in order: each becomes the next chunk
    (nothing judged lost yet)."""
    nxt = 2
    for c in range(upto):
        if c not in lost:
            res = run(dp, ack(chunk=c))
            h = Ether(res.data)[W.LTP]
            assert res.verdict == XDP_TX and h.chunk == nxt and not h.flags.retx, c
            nxt += 1


def rack_payload(grad, c):
    raw = grad.view(np.uint8)
    return raw[c * CHUNK:c * CHUNK + (LAST if c == RACK_N - 1 else CHUNK)].tobytes()


@pytest.mark.root
def test_rack_resends_a_lost_chunk_before_the_next_one(dp, maps):
    grad = rack_round(maps)
    ack_all_but(dp, {LOST}, upto=8)        # the last of them (chunk 7) was inside the window
    t0, c0 = tx(maps), maps.counters()
    res = run(dp, ack(chunk=8))
    assert res.verdict == XDP_TX
    h = Ether(res.data)[W.LTP]
    assert (h.type, h.chunk, h.len, h.token) == (W.T_DATA, LOST, CHUNK, tok(9))
    assert int(h.flags) == W.F_CLOCK | W.F_RETX
    assert bytes(h.payload) == rack_payload(grad, LOST)
    assert_checksums_right(res.data)
    assert delta(maps, c0) == {"ack_rx": 1, "clock_tx": 1, "clock_retx": 1}
    t1 = maps.tx_state(9, 1)
    # the ACK's packet left the flight, the re-send took the lost one's place;
    # the order did not move
    assert tx(maps)["consumed"] == t0["consumed"] + 1 and int(t1["rexmit"]) == 1
    assert tx(maps)["next"] == t0["next"]
    assert maps.sentat[1, 1, LOST] == int(t1["xseq"])      # logged again, as the newest
    # the re-send's ACK: the order goes on; at its end ACKs are consumed
    assert Ether(run(dp, ack(chunk=LOST)).data)[W.LTP].chunk == 9
    for c in (9, 10):
        assert Ether(run(dp, ack(chunk=c)).data)[W.LTP].chunk == c + 1
    c0 = maps.counters()
    assert run(dp, ack(chunk=11)).verdict == XDP_DROP
    assert delta(maps, c0) == {"ack_rx": 1, "clock_idle": 1}
    assert maps.acked_mask(9, 1, RACK_N)[2:].all()


@pytest.mark.root
@pytest.mark.parametrize("how", ["taken over by the control plane", "rack off"])
def test_rack_leaves_what_is_not_its_own(dp, maps, how):
    """A chunk the control plane re-sent itself (it zeroes ltp_sentat), and a
    flow without XDP recovery: the ACK carries the next chunk, no re-send."""
    rack_round(maps, rack=how != "rack off")
    ack_all_but(dp, {LOST}, upto=8)
    if how != "rack off":
        clockmaps.take_over(maps, 9, 1, [LOST])
    h = Ether(run(dp, ack(chunk=8)).data)[W.LTP]
    assert h.chunk == 9 and not h.flags.retx
    assert int(maps.tx_state(9, 1)["rexmit"]) == 0


# --- the receiver: the credit -------------------------------------------------

def ack_of(res):
    assert res.verdict == XDP_TX
    return Ether(res.data)[W.LTP]


@pytest.mark.root
def test_credit_within_window_keeps_the_packet(dp, maps):
    c0 = maps.counters()
    h = ack_of(run(dp, clocked_data(chunk=0, stamp=(2, 0))))
    assert h.rate == 2 and not h.flags.stop and h.flags.clock
    assert delta(maps, c0) == {"data": 1, "ack_tx": 1}
    assert maps.progress[1, 1]["stops"] == 0


@pytest.mark.root
def test_credit_over_window_says_stop_once_per_excess_packet(dp, maps):
    """Flow at 4 in flight, credit 2: the first two of its packets in flight
    (stamped before the sender saw any STOP) shed one each; the third is
    then within the credit."""
    c0 = maps.counters()
    flags = [ack_of(run(dp, clocked_data(chunk=c, stamp=(4, 0)))).flags.stop for c in range(3)]
    assert flags == [True, True, False]
    assert delta(maps, c0) == {"data": 3, "ack_tx": 3, "credit_stop": 2}
    assert maps.progress[1, 1]["stops"] == 2
    # sent after the sender saw both STOPs: 2 in flight, within its credit
    assert not ack_of(run(dp, clocked_data(chunk=3, stamp=(2, 2)))).flags.stop


@pytest.mark.root
def test_credit_grows_when_a_flow_finishes(dp, maps):
    """Worker 9 finishes its round: worker 3 alone shares the window of 4."""
    for c in range(NCH):
        ack_of(run(dp, clocked_data(worker=9, chunk=c, stamp=(2, 0))))
    assert maps.active_flows(5) == 1
    h = ack_of(run(dp, clocked_data(worker=3, chunk=0, stamp=(4, 0))))
    assert h.rate == 4 and not h.flags.stop


@pytest.mark.root
def test_no_window_no_limit(dp, maps):
    maps.open_bank(5, NCH, LAST, token=tok(5), flows=2, window=0)
    h = ack_of(run(dp, clocked_data(chunk=0, stamp=(500, 0))))
    assert h.rate == 0xffff and not h.flags.stop


@pytest.mark.root
def test_unclocked_data_gets_a_rate_not_a_credit(dp, maps):
    maps.set_share(5, 900_000)
    pkt = clocked_data(chunk=0, stamp=(9, 0))
    pkt[W.LTP].flags = 0
    h = ack_of(run(dp, pkt))
    assert h.rate == 450_000 and not h.flags.stop


# --- a round through both programs --------------------------------------------

@pytest.mark.root
@pytest.mark.parametrize("lose", [(), (5, 17)], ids=["no loss", "two DATA lost"])
def test_a_round_clocked_through_two_programs_is_bit_exact(small_geometry, lose):
    """A worker's program and a PS's program, their frames handed across by
    hand: four primed DATA packets, then the clock alone carries the round;
    the PS's memory holds the gradient bit for bit, and every ACK past the
    last chunk is consumed. With DATA frames lost on the way (the clock's
    5th and 17th: each takes one of the four packets in flight with it),
    XDP alone re-sends them from later ACKs (RACK over its send log): no
    control plane at all."""
    from ltpx.control.transport.layout import ChunkLayout
    from ltpx.dataplane.xdp.loader import Dataplane, Geometry
    g = Geometry(slots=2, max_chunks=64)
    grad = gradient(40 * CHUNK // 4 + 6, seed=3)
    lay = ChunkLayout(grad.size, CHUNK)
    order = np.random.default_rng(5).permutation(lay.nchunks).tolist()
    with Dataplane(g, job=JOB) as wk, Dataplane(g, job=JOB) as ps:
        wm, pm = wk.maps(), ps.maps()
        wm.set_peers({3: 0})
        pm.set_peers({3: 0})
        pm.open_bank(9, lay.nchunks, lay.last_len, token=tok(9), flows=1, window=8)
        wm.tx_start(9, 0, tok(9))
        clockmaps.load(wm, 9, grad.view(np.uint8), order, np.zeros(lay.nchunks, bool), CHUNK)
        clockmaps.start(wm, 9, 0, nchunks=lay.nchunks, last_len=lay.last_len, flags=0, primed=4,
                    rack=True)
        raw = grad.view(np.uint8)
        wire = [clocked_data(round_=9, chunk=c, nchunks=lay.nchunks, stamp=(4, 0),
                             body=raw[c * CHUNK:c * CHUNK + lay.chunk_len(c)].tobytes())
                for c in order[:4]]
        tx_frames = 0
        while wire:
            a = run_xdp(ps.prog_fd, bytes(wire.pop(0)), grow=GROW)
            assert a.verdict == XDP_TX
            d = run_xdp(wk.prog_fd, a.data, grow=GROW)
            if d.verdict == XDP_TX:
                tx_frames += 1
                if tx_frames not in lose:
                    wire.append(Ether(d.data))
        assert pm.done_mask(9, 0, lay.nchunks).all()
        assert np.array_equal(pm.slot_values(9, 0, grad.size), grad)
        t = wm.tx_state(9, 0)
        assert tx_frames == lay.nchunks - 4 + len(lose)
        assert int(t["rexmit"]) == pm.progress[1, 0]["retx"] == len(lose)
        # in flight at the end: none. The 4 primed, less an ACK consumed at the end
        # by each flow that lived, less each ACK that carried a re-send
        assert int(t["added"]) - int(t["consumed"]) == 0
        assert wm.acked_mask(9, 0, lay.nchunks).all()
        assert pm.counters()["malformed"] == 0 and pm.counters()["credit_stop"] == 0


# --- real packets on a rig -----------------------------------------------------
# One star rig (prefix he: namespaces ltp-heclk-*), 4 workers, 1 Gbit/s and a
# 30 kB buffer toward the PS, the loss injector on every switch port (DATA
# toward the PS, ACKs toward the workers), off until a test turns it on.

NEL = 65_536  # 256 KiB per worker and round
RIG_WORKERS = 4


@pytest.fixture(scope="module")
def rig():
    yield from star_rig(name="heclk", workers=RIG_WORKERS, rate_bps=10**9, buffer_bytes=30_000,
                        loss=0.0, loss_on="all")


@pytest.fixture(scope="module")
def cluster(rig):
    from ltpx.control.bench.cluster import LtpCluster
    from ltpx.control.transport.early_close import EarlyCloseConfig
    with LtpCluster(rig, NEL, sender="xdp",
                    early_close=EarlyCloseConfig(min_deadline_s=0.05, hard_timeout_s=10.0)) as cl:
        yield cl


@pytest.fixture
def fresh(rig, cluster):
    from ltpx.control.transport.early_close import EarlyClose, EarlyCloseConfig
    rig.set_loss(0.0)
    cluster.ps.early = EarlyClose(cluster.capacity, EarlyCloseConfig(min_deadline_s=0.05,
                                                                     hard_timeout_s=10.0))
    yield cluster
    rig.set_loss(0.0)


_rounds = iter(range(1, 10_000))


def expected(cl, r):
    from ltpx.control.bench.cluster import worker_tensor
    return np.stack([worker_tensor(7, w, r, NEL) for w in cl.ids])


@pytest.mark.rig
def test_rig_round_through_the_clock_is_bit_exact(fresh):
    cl = fresh
    for _ in range(3):
        r = next(_rounds)
        res, reps = cl.run_round(r, NEL, seed=7)
        assert res.reason == "complete" and res.masks.all()
        assert np.array_equal(res.values, expected(cl, r))
        for rep in reps.values():
            assert rep.sender == "xdp" and rep.acked == rep.chunks
            # the clock, not the socket, sent most of it
            assert rep.clock_tx >= rep.chunks // 2, rep


@pytest.mark.rig
def test_rig_early_close_at_5_percent_loss_keeps_its_threshold(rig, fresh):
    """At 5 % loss a round closes complete, or early with every flow at the
    round's threshold (0.95 or more), what arrived bit-exact. (It asserted
    99 % delivered, which the re-sends reach within the grace on a quiet
    machine; under load a close at 95-99 % is the rule's, and it failed once.)"""
    cl = fresh
    rig.set_loss(0.05)
    rig.reset_loss_counters()
    for _ in range(4):
        r = next(_rounds)
        res, reps = cl.run_round(r, NEL, seed=7)
        exp = expected(cl, r)
        for i in range(len(cl.ids)):  # what arrived is bit-exact
            m = res.layout.elem_mask(res.masks[i])
            assert np.array_equal(res.values[i][m], exp[i][m])
        flows = [float(res.masks[i].mean()) for i in range(len(cl.ids))]
        thr = cl.ps.early.threshold            # this round's (the next open sets another)
        assert thr >= 0.95
        assert res.reason in ("complete", "early", "deadline"), res.reason
        if res.reason == "complete":
            assert min(flows) == 1.0
        elif res.reason == "early":            # no flow cut below the threshold
            assert min(flows) >= thr - 1e-9, (flows, thr)
    assert rig.loss_counters()["dropped"] > 0


@pytest.mark.rig
def test_rig_lost_data_and_lost_acks_both_recover(rig, fresh):
    """At 10% loss on both directions, with no Early Close before
    everything is in (threshold 1, a long deadline): every round completes.
    DATA was lost (chunks arrived only as re-sends) and ACKs were lost
    (re-sends of chunks the PS had: duplicates)."""
    from ltpx.control.transport.early_close import EarlyCloseConfig
    cl = fresh
    cl.ps.early.cfg = EarlyCloseConfig(threshold_max=1.0, threshold_min=1.0, min_deadline_s=5.0,
                                       hard_timeout_s=10.0)
    rig.set_loss(0.10)
    retx = dups = 0
    for _ in range(2):
        r = next(_rounds)
        res, reps = cl.run_round(r, NEL, seed=7)
        assert res.reason == "complete" and res.masks.all()
        assert np.array_equal(res.values, expected(cl, r))
        # each push ended on its own: all acked, or told CLOSED (its last ACKs lost)
        assert all(p.acked == p.chunks or p.closed_by_receiver for p in reps.values())
        retx += res.retx_chunks
        dups += res.duplicates
    assert retx > 0 and dups > 0, (retx, dups)


@pytest.mark.rig
def test_rig_window_never_exceeds_the_credit(fresh):
    """Past its first ACK, no flow keeps more in flight than the credit the
    PS's latest ACK gave it; the PS's window is shared by 4 flows. Rounds
    close only when complete: Early Close may cut a round whose tail waits
    5 ms for a re-send (a busy machine, a failed grow), and a cut round's
    flows stop before the window is tried to its end."""
    from ltpx.control.transport.early_close import EarlyClose, EarlyCloseConfig
    cl = fresh
    cl.ps.early = EarlyClose(cl.capacity, EarlyCloseConfig(
        threshold_min=1.0, threshold_max=1.0, min_deadline_s=5.0, hard_timeout_s=10.0))
    for _ in range(3):
        res, reps = cl.run_round(next(_rounds), NEL, seed=7)
        assert res.reason == "complete"
        assert all(p.max_over_credit <= 0 for p in reps.values()), reps


@pytest.mark.rig
@pytest.mark.parametrize("group", [False, True], ids=["unicast", "group"])
def test_rig_reliable_downlink_through_the_clock(rig, fresh, group):
    """The PS pushes the reliable class through its clock to every worker
    (primed once to the rig's broadcast address with group=True); at 5%
    loss every worker gets every byte."""
    import hashlib
    cl = fresh
    rig.set_loss(0.05)
    params = np.random.default_rng(11).standard_normal(NEL).astype(np.float32)
    rep, digests = cl.downlink(next(_rounds), params, group=group)
    want = hashlib.sha256(params.tobytes()).hexdigest()
    assert digests == dict.fromkeys(cl.ids, want)
    assert rep.sender == "xdp" and rep.clock_tx > 0


@pytest.mark.root
def test_doctor_reports_that_frames_grow_on_veth():
    """`ltp doctor`'s ack-clock check runs the clock on a veth pair of its own
    (namespaces ltp-g<pid>-*) and leaves nothing behind."""
    import subprocess
    from ltpx.dataplane.doctor.checks import clock_check
    chk = clock_check("native")
    assert chk.ok, chk.detail
    assert "7 of 7 ACKs grown" in chk.detail and "0 failed grows" in chk.detail
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"ltp-g{__import__('os').getpid()}" not in left
