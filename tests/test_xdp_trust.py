# SPDX-License-Identifier: Apache-2.0
"""Tokens bound to who sends what, on the real program (BPF_PROG_TEST_RUN).

Here the maps hold what endpoints write: each slot's (DATA, ACK) tokens
derived from its worker's own key and the flow's direction
(tokens.RoundTokens.bank), the ACK token a sender expects and its DATA token
(tx_start). The attacker is a member, worker 9, given only its own key
(tokens.member): every token it can make, of any kind, for any round. It
must not write worker 3's chunks, close worker 3's push, nor have a worker
take a downlink answer from it, GROUP or not. Also here: the rest of issue
26's per-packet rules (an ACK's chunk bound, a dropped worker's slot, what an
unauthenticated frame may change, fragments, the clock and bad tokens).
"""
from __future__ import annotations

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP, Ether
from scapy.packet import Raw

from conftest import requires_bpf
from ltpx.control.trust import tokens
from ltpx.dataplane.xdp import clockmaps
from ltpx.dataplane.xdp import wire as W
from ltpx.dataplane.xdp.testrun import XDP_DROP, XDP_PASS, XDP_TX, run_xdp
from test_xdp_packets import (CHUNK, JOB, LAST, NCHUNKS, PS_IP, PS_MAC, SECRET, WORKER_IP,
                              WORKER_MAC, assert_same_state, payload, shared_state)

pytestmark = [requires_bpf, pytest.mark.root]

PEERS = {3: 1, 9: 2}                      # worker id -> slot
SERVER = tokens.RoundTokens(SECRET, JOB)  # the server's side of every flow
MEMBER9 = tokens.member(SECRET, 9)        # all the attacker holds


def own_tokens(round_: int) -> list[int]:
    """Every token worker 9 can make for round_ (its own flows, every kind)."""
    return [tokens.derive(MEMBER9, JOB, round_, 9, k)
            for k in (tokens.UP, tokens.UP_ACK, tokens.DOWN, tokens.DOWN_ACK)]


def frame(*, type_=W.T_DATA, worker=3, round_=5, chunk=1, token=0, flags=0, state=0,
          to_port=True, body=None, nchunks=NCHUNKS) -> Ether:
    """DATA (or an ACK, type_=W.T_ACK) to the LTP port (to_port), or an ACK
    from it, with exactly the token given."""
    if type_ == W.T_DATA and body is None:
        body = payload(LAST if chunk == nchunks - 1 else CHUNK, 66.0)
    macs = (WORKER_MAC, PS_MAC) if to_port else (PS_MAC, WORKER_MAC)
    ips = (WORKER_IP, PS_IP) if to_port else (PS_IP, WORKER_IP)
    ports = (40000, W.PORT) if to_port else (W.PORT, 40000)
    pkt = (Ether(src=macs[0], dst=macs[1]) / IP(src=ips[0], dst=ips[1], id=7) /
           UDP(sport=ports[0], dport=ports[1]) /
           W.LTP(type=type_, worker=worker, job=JOB, round=round_, chunk=chunk,
                 nchunks=nchunks, flags=flags, state=state, token=token,
                 **({"len": 0} if type_ == W.T_ACK else {})))
    return pkt / Raw(body) if body is not None else pkt


def run(dp, pkt, **kw):
    return run_xdp(dp.prog_fd, bytes(pkt), **kw)


@pytest.fixture(scope="module")
def dp(small_geometry):
    from ltpx.dataplane.xdp.loader import Dataplane
    with Dataplane(small_geometry, job=JOB) as d:
        d.maps().set_peers(PEERS)
        yield d


def server_opens(m, round_, **kw):
    """Open round_ as a server's receiver does: per-slot tokens, group token."""
    return m.open_bank(round_, NCHUNKS, LAST, slot_tokens=SERVER.bank(round_, PEERS),
                       group_token=SERVER.group(round_), **kw)


@pytest.fixture
def maps(dp):
    m = dp.maps()
    m.mem_bytes[:] = 0
    m.live[0] = 0
    server_opens(m, 4)
    server_opens(m, 5)
    return m


def delta(m, before):
    after = m.counters()
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


# --- 1. tokens bound to a sender ------------------------------------------------

def test_a_member_cannot_write_another_workers_chunk(dp, maps):
    """Worker 9, with every token its own key makes (and the plain round
    token of old), claims worker 3's chunk: each is counted bad_token and
    nothing anywhere changes; worker 3's own DATA then lands, and worker 9's
    own chunk with its own UP token lands in its own slot."""
    maps.live[0] = 0
    before, c0 = shared_state(maps), maps.counters()
    forged = own_tokens(5) + [tokens.derive(MEMBER9, JOB, 5, 9, tokens.UP) ^ 1]
    for t in forged:
        assert run(dp, frame(worker=3, chunk=1, token=t)).verdict == XDP_DROP
    assert delta(maps, c0) == {"bad_token": len(forged)}
    assert_same_state(before, shared_state(maps))

    up3, ack3 = SERVER.receive(5, 3)
    res = run(dp, frame(worker=3, chunk=1, token=up3, body=payload(CHUNK, 3.0)))
    assert res.verdict == XDP_TX and not Ether(res.data)[W.LTP].flags.dup
    assert Ether(res.data)[W.LTP].token == ack3   # the receiver's ACK token, not the DATA's
    assert maps.mem_bytes[1, 1, CHUNK:2 * CHUNK].tobytes() == payload(CHUNK, 3.0)
    own = run(dp, frame(worker=9, chunk=1, token=own_tokens(5)[0], body=payload(CHUNK, 9.0)))
    assert own.verdict == XDP_TX
    assert maps.mem_bytes[1, 2, CHUNK:2 * CHUNK].tobytes() == payload(CHUNK, 9.0)


def test_a_member_cannot_close_another_workers_push(dp, maps):
    """Worker 3 pushes round 9 (its tx holds the server's ACK token of its
    flow). Worker 9's CLOSED ACKs, with every token it can make, and the
    ACK the server's program builds for worker 9's own DATA, change nothing;
    the ACK the server's program builds from worker 3's DATA is recorded."""
    up3, ack3 = tokens.RoundTokens(tokens.member(SECRET, 3), JOB, self_id=3).send(9, 3)
    assert (up3, ack3) == SERVER.receive(9, 3)
    maps.tx_start(9, 1, ack3, nchunks=NCHUNKS, dtoken=up3)
    before, c0 = shared_state(maps), maps.counters()
    for t in own_tokens(9):
        pkt = frame(type_=W.T_ACK, worker=3, round_=9, chunk=2, state=W.RS_CLOSED,
                    token=t, to_port=False)
        assert run(dp, pkt).verdict == XDP_DROP
    assert delta(maps, c0) == {"bad_token": 4}
    assert_same_state(before, shared_state(maps))

    server_opens(maps, 9)
    real = run(dp, frame(worker=3, round_=9, chunk=2, token=up3))
    assert real.verdict == XDP_TX and Ether(real.data)[W.LTP].token == ack3
    assert run(dp, real.data).verdict == XDP_DROP          # fed back as worker 3's host
    t = maps.tx_state(9, 1)
    assert (int(t["acked"]), int(t["closed"])) == (1, 0)
    assert maps.acked_mask(9, 1, NCHUNKS).tolist() == [False, False, True, False]


def worker_opens(m, round_, secret, self_id=3):
    """Open round_ as worker self_id's receiver does for its downlink."""
    tk = tokens.RoundTokens(secret, JOB, self_id=self_id)
    return m.open_bank(round_, NCHUNKS, LAST, slot_tokens=tk.bank(round_, {self_id: 1}),
                       group_token=tk.group(round_), slots=[1])


def group_answer(round_, token, seed=1.0):
    return (Ether(src=PS_MAC, dst="ff:ff:ff:ff:ff:ff") /
            IP(src=PS_IP, dst="198.18.0.255", id=5) / UDP(sport=40000, dport=W.PORT) /
            W.LTP(worker=0, job=JOB, round=round_, chunk=1, nchunks=NCHUNKS,
                  flags="reliable+group", token=token) / Raw(payload(CHUNK, seed)))


@pytest.mark.parametrize("holds", ["member key", "member and group key", "job secret"])
def test_no_member_can_send_an_answer_a_worker_takes(dp, maps, holds):
    """Worker 3 waits for downlink answer 7 (its own key only, with the group
    key, or the job secret). Worker 9's answers, GROUP or unicast, with every
    token its member key makes, are counted bad_token and change nothing.
    The server's unicast answer lands; its GROUP answer lands only where the
    worker holds the group key: a member key's endpoint without it refuses
    every GROUP frame, and the server's repair then reaches it alone."""
    secret = {"member key": tokens.member(SECRET, 3),
              "member and group key": tokens.member(SECRET, 3, group=True)}.get(holds, SECRET)
    maps.set_self(3, WORKER_IP, WORKER_MAC)
    worker_opens(maps, 7, secret)
    before, c0 = shared_state(maps), maps.counters()
    n = 0
    for t in own_tokens(7) + [0]:
        assert run(dp, group_answer(7, t)).verdict == XDP_DROP
        assert run(dp, frame(worker=3, round_=7, chunk=1, token=t)).verdict == XDP_DROP
        n += 2
    assert delta(maps, c0) == {"bad_token": n}
    assert_same_state(before, shared_state(maps))

    group = run(dp, group_answer(7, SERVER.group(7), seed=7.0))
    if holds == "member key":
        assert group.verdict == XDP_DROP and not maps.done.any()
    else:
        assert group.verdict == XDP_TX
        assert maps.mem_bytes[1, 1, CHUNK:2 * CHUNK].tobytes() == payload(CHUNK, 7.0)
    down3, dack3 = SERVER.send(7, 3)
    res = run(dp, frame(worker=3, round_=7, chunk=2, token=down3, body=payload(CHUNK, 8.0)))
    assert res.verdict == XDP_TX and Ether(res.data)[W.LTP].token == dack3
    assert maps.mem_bytes[1, 1, 2 * CHUNK:3 * CHUNK].tobytes() == payload(CHUNK, 8.0)
    # an uplink token of the same round and worker is no answer (directions apart)
    assert run(dp, frame(worker=3, round_=7, chunk=0, token=SERVER.receive(7, 3)[0])
               ).verdict == XDP_DROP


# --- 2. the other per-packet rules ----------------------------------------------

def test_an_acks_chunk_is_bounded_by_the_rounds_chunk_count(dp, maps):
    """An ACK with the flow's token but a chunk past the round's count (the
    bitmap has room for it) records nothing: not acked, not closed, no rate."""
    maps.tx_start(9, 1, 99, nchunks=NCHUNKS)
    c0 = maps.counters()
    for chunk, state in ((NCHUNKS, W.RS_OPEN), (63, W.RS_CLOSED), (2**31, W.RS_OPEN)):
        pkt = frame(type_=W.T_ACK, round_=9, chunk=chunk, state=state, token=99, to_port=False)
        assert run(dp, pkt).verdict == XDP_DROP
    assert delta(maps, c0) == {"out_of_range": 3}
    t = maps.tx_state(9, 1)
    assert (int(t["acked"]), int(t["closed"]), int(t["rate_kbps"])) == (0, 0, 0)
    assert not maps.acked.any()
    assert run(dp, frame(type_=W.T_ACK, round_=9, chunk=NCHUNKS - 1, token=99,
                         to_port=False)).verdict == XDP_DROP
    assert int(maps.tx_state(9, 1)["acked"]) == 1


def test_a_dropped_workers_slot_is_closed_in_xdp(dp, maps):
    """Round 5 taking worker 3 only: worker 9's DATA, with its token, is ACKed
    CLOSED, never written, and counts no flow down. A worker dropped in the
    middle of a round (close_slot): the same from then on, what it sent
    before stays."""
    server_opens(maps, 5, flows=1, slots=[1])
    c0 = maps.counters()
    up9, ack9 = SERVER.receive(5, 9)
    res = run(dp, frame(worker=9, chunk=NCHUNKS - 1, token=up9))
    assert res.verdict == XDP_TX
    got = Ether(res.data)[W.LTP]
    assert (got.type, got.state, got.token) == (W.T_ACK, W.RS_CLOSED, ack9)
    assert delta(maps, c0) == {"slot_closed": 1, "ack_tx": 1}
    assert not maps.done.any() and not maps.claim.any() and not maps.mem_bytes.any()
    assert maps.active_flows(5) == 1

    server_opens(maps, 5, flows=2)
    up3 = SERVER.receive(5, 3)[0]
    assert run(dp, frame(worker=3, chunk=0, token=up3, body=payload(CHUNK, 1.0))
               ).verdict == XDP_TX
    maps.close_slot(5, 1)
    c1 = maps.counters()
    for c in (1, 2, 3):
        assert run(dp, frame(worker=3, chunk=c, token=up3)).verdict == XDP_TX
    assert delta(maps, c1) == {"slot_closed": 3, "ack_tx": 3}
    assert maps.done_mask(5, 1, NCHUNKS).tolist() == [True, False, False, False]
    assert maps.mem_bytes[1, 1, :CHUNK].tobytes() == payload(CHUNK, 1.0)
    assert not maps.mem_bytes[1, 1, CHUNK:].any()
    assert maps.active_flows(5) == 2     # its last chunk took no flow off


UNAUTHENTICATED = [
    ("DATA of a round before the bank's", dict(round_=3), "stale"),
    ("DATA of a round not opened", dict(round_=7), "future"),
    ("DATA of a round two banks on", dict(round_=9), "future"),
    ("ACK of a round not being sent", dict(type_=W.T_ACK, round_=11, to_port=False,
                                           state=W.RS_CLOSED), "ack_stale"),
]


@pytest.mark.parametrize("desc,kw,counter", UNAUTHENTICATED,
                         ids=[d for d, *_ in UNAUTHENTICATED])
def test_a_frame_that_cannot_be_authenticated_changes_only_its_count(dp, maps, desc, kw,
                                                                     counter):
    """A round whose token the program does not hold: whatever token the
    frame carries (even the right one), only the per-CPU count moves: no
    per-slot count, no kept header, no `late` for a report."""
    maps.tx_start(9, 1, 99, nchunks=NCHUNKS)
    before, c0 = shared_state(maps), maps.counters()
    r = kw.get("round_", 5)
    for t in (0, SERVER.receive(r, 3)[0], SERVER.receive(r, 3)[1]):
        assert run(dp, frame(token=t, **kw)).verdict == XDP_DROP
    assert delta(maps, c0) == {counter: 3}
    assert_same_state(before, shared_state(maps))


def test_a_later_fragment_is_never_taken_for_ltp(dp, maps):
    """An IP fragment after the first carries no UDP header: bytes that read
    like one to the LTP port, with a whole valid DATA after them, are passed
    up untouched (classified before the port match), never parsed or
    counted as LTP; a first fragment to the port is malformed."""
    inner = bytes(frame(worker=3, chunk=1, token=SERVER.receive(5, 3)[0])[UDP])
    later = (Ether(src=WORKER_MAC, dst=PS_MAC) /
             IP(src=WORKER_IP, dst=PS_IP, proto=17, frag=185, flags=0) / Raw(inner))
    c0 = maps.counters()
    res = run(dp, later)
    assert res.verdict == XDP_PASS and res.data == bytes(later)
    assert delta(maps, c0) == {"pass": 1} and not maps.done.any()
    first = frame(worker=3, chunk=1, token=SERVER.receive(5, 3)[0])
    first[IP].flags = "MF"
    assert run(dp, first).verdict == XDP_DROP and delta(maps, c0) == {"pass": 1, "malformed": 1}


def test_the_clock_grows_only_an_ack_whose_token_verified(dp, maps):
    """A clocked flow with DATA left to send: ACKs without its ACK token
    (none, worker 9's, the DATA token echoed) are dropped bad_token and grow
    nothing; the real one grows into the next DATA, which carries the
    flow's DATA token, not the ACK's."""
    up3, ack3 = SERVER.receive(9, 3)
    grad = np.random.default_rng(2).standard_normal((3 * CHUNK + LAST) // 4).astype(np.float32)
    maps.tx_start(9, 1, ack3, nchunks=NCHUNKS, dtoken=up3)
    clockmaps.load(maps, 9, grad.view(np.uint8), [0, 1, 2, 3], np.zeros(NCHUNKS, bool), CHUNK)
    clockmaps.start(maps, 9, 1, nchunks=NCHUNKS, last_len=LAST, flags=0, primed=1)
    c0 = maps.counters()
    for t in [0, up3] + own_tokens(9):
        pkt = frame(type_=W.T_ACK, round_=9, chunk=0, flags=W.F_CLOCK, state=W.RS_OPEN,
                    token=t, to_port=False)
        assert run(dp, pkt, grow=CHUNK + 64).verdict == XDP_DROP
    assert delta(maps, c0) == {"bad_token": 6}
    t = maps.tx_state(9, 1)
    assert (int(t["sent"]), int(t["next"]), int(t["acked"])) == (0, 1, 0)
    res = run(dp, frame(type_=W.T_ACK, round_=9, chunk=0, flags=W.F_CLOCK, state=W.RS_OPEN,
                        token=ack3, to_port=False), grow=CHUNK + 64)
    assert res.verdict == XDP_TX
    h = Ether(res.data)[W.LTP]
    assert (h.type, h.chunk, h.token) == (W.T_DATA, 1, up3)


# --- 3. integrity: a corrupted frame is never used ---------------------------------

PAY_OFF = 14 + 20 + 8 + W.HDR_LEN


@pytest.fixture
def csum_on(maps):
    maps.set_verify_csum(True)
    try:
        yield maps
    finally:
        maps.set_verify_csum(False)


def flipped(pkt: Ether, at: int, bit: int = 0) -> bytes:
    raw = bytearray(bytes(pkt))     # scapy fills in the whole UDP checksum
    raw[at] ^= 1 << bit
    return bytes(raw)


@pytest.mark.parametrize("chunk,at,bit", [
    (1, PAY_OFF, 0), (1, PAY_OFF + 700, 5), (1, PAY_OFF + CHUNK - 1, 7),
    (NCHUNKS - 1, PAY_OFF + LAST - 1, 3), (1, PAY_OFF - 12, 1),   # a bit of `rate` in the header
], ids=["first payload byte", "second piece", "last byte", "short last chunk", "header"])
def test_a_frame_with_one_flipped_bit_is_never_used(dp, csum_on, chunk, at, bit):
    """With checksums verified: one flipped bit, and the frame is counted
    bad_csum, not ACKed, its chunk neither delivered nor claimed; the same
    chunk arriving intact is then written and ACKed (not a duplicate)."""
    m = csum_on
    up3 = SERVER.receive(5, 3)[0]
    good = frame(worker=3, chunk=chunk, token=up3)
    c0 = m.counters()
    res = run_xdp(dp.prog_fd, flipped(good, at, bit))
    assert res.verdict == XDP_DROP and delta(m, c0) == {"bad_csum": 1}
    assert not m.done.any() and not m.claim.any() and not m.progress["chunks"].any()
    ok = run(dp, good)
    assert ok.verdict == XDP_TX and not Ether(ok.data)[W.LTP].flags.dup
    assert delta(m, c0) == {"bad_csum": 1, "data": 1, "ack_tx": 1}
    n = LAST if chunk == NCHUNKS - 1 else CHUNK
    assert m.mem_bytes[1, 1, chunk * CHUNK:chunk * CHUNK + n].tobytes() == bytes(good[Raw])
    assert m.done_mask(5, 1, NCHUNKS).sum() == 1


def test_a_frame_without_a_checksum_is_refused_only_while_checksums_are_verified(dp, maps):
    """UDP checksum 0 (none): counted bad_csum with verification on; taken
    with it off (the default: a veth hands socket-sent frames over with
    the sum left to offload)."""
    raw = bytearray(bytes(frame(worker=3, chunk=2, token=SERVER.receive(5, 3)[0])))
    raw[14 + 20 + 6:14 + 20 + 8] = b"\0\0"
    maps.set_verify_csum(True)
    try:
        c0 = maps.counters()
        assert run_xdp(dp.prog_fd, bytes(raw)).verdict == XDP_DROP
        assert delta(maps, c0) == {"bad_csum": 1} and not maps.done.any()
    finally:
        maps.set_verify_csum(False)
    assert run_xdp(dp.prog_fd, bytes(raw)).verdict == XDP_TX
    assert maps.done_mask(5, 1, NCHUNKS).tolist() == [False, False, True, False]


@pytest.mark.parametrize("kind", ["uplink", "re-send", "last chunk", "clocked", "answer",
                                  "group answer"])
def test_each_data_kind_verifies_as_sent_with_checksums_on(dp, csum_on, kind):
    """Every DATA frame a peer sends, as a NIC hands it over (scapy's whole
    UDP sum), is taken with checksums verified: written, ACKed, no bad_csum.
    A GROUP answer too, although the program rewrites its destination and
    worker id before the check sums them (it corrects the sum by what it
    rewrote); the same frames with a bit flipped are refused."""
    m = csum_on
    up3 = SERVER.receive(5, 3)[0]
    if kind in ("answer", "group answer"):
        m.set_self(3, WORKER_IP, WORKER_MAC)
        worker_opens(m, 7, SECRET)
    good = {"uplink": frame(worker=3, chunk=1, token=up3),
            "re-send": frame(worker=3, chunk=1, token=up3, flags="retx"),
            "last chunk": frame(worker=3, chunk=NCHUNKS - 1, token=up3, flags="last"),
            "clocked": frame(worker=3, chunk=1, token=up3, flags="clock"),
            "answer": frame(worker=3, round_=7, chunk=1, token=SERVER.send(7, 3)[0],
                            flags="reliable"),
            "group answer": group_answer(7, SERVER.group(7), seed=7.0)}[kind]
    round_, chunk = good[W.LTP].round, good[W.LTP].chunk
    c0 = m.counters()
    assert run_xdp(dp.prog_fd, flipped(good, PAY_OFF + 3, 2)).verdict == XDP_DROP
    assert delta(m, c0) == {"bad_csum": 1} and not m.done.any()
    res = run(dp, good)
    assert res.verdict == XDP_TX, delta(m, c0)
    assert delta(m, c0) == {"bad_csum": 1, "data": 1, "ack_tx": 1}
    n = len(good[Raw])
    assert m.done_mask(round_, 1, NCHUNKS).tolist() == [c == chunk for c in range(NCHUNKS)]
    assert m.mem_bytes[m.bank_index(round_), 1,
                       chunk * CHUNK:chunk * CHUNK + n].tobytes() == bytes(good[Raw])


def test_a_frame_of_an_earlier_run_is_a_bad_token(dp, maps):
    """The same secret in two runs (tokens.bind): round 6 opened in run B
    refuses worker 3's DATA recorded in run A's round 6 (bad_token, nothing
    changes) and takes run B's."""
    run_a = tokens.RoundTokens(tokens.bind(SECRET, b"run-a"), JOB)
    run_b = tokens.RoundTokens(tokens.bind(SECRET, b"run-b"), JOB)
    maps.open_bank(6, NCHUNKS, LAST, slot_tokens=run_b.bank(6, PEERS),
                   group_token=run_b.group(6))
    before, c0 = shared_state(maps), maps.counters()
    assert run(dp, frame(worker=3, round_=6, token=run_a.receive(6, 3)[0])).verdict == XDP_DROP
    assert delta(maps, c0) == {"bad_token": 1}
    assert_same_state(before, shared_state(maps))
    res = run(dp, frame(worker=3, round_=6, token=run_b.receive(6, 3)[0]))
    assert res.verdict == XDP_TX and Ether(res.data)[W.LTP].token == run_b.receive(6, 3)[1]
