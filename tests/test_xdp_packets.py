# SPDX-License-Identifier: Apache-2.0
"""Packet-level tests of bpf/ltp_xdp.c through BPF_PROG_TEST_RUN.

A table of (description, input packet, expected verdict, expected counter
changes, extra check) run on the real program. Before each case the receiver
holds round 4 in bank 0 and round 5 in bank 1, both open, 4 chunks each, with
workers 3 -> slot 1 and 9 -> slot 2 known; job cookie 7. Every round's token
is derived from SECRET, as an endpoint's are; packets carry their round's
token unless a case says otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import time
from collections.abc import Callable

import numpy as np
import pytest
from scapy.layers.inet import IP, TCP, UDP, Ether
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP
from scapy.packet import Raw

from conftest import requires_bpf
from ltpx.control.trust import tokens
from ltpx.dataplane.xdp import wire as W
from ltpx.dataplane.xdp.testrun import XDP_DROP, XDP_PASS, XDP_TX, run_xdp

pytestmark = requires_bpf

JOB = 7
CHUNK = 1424
LAST = 8  # bytes in the last chunk (chunk 3)
NCHUNKS = 4
WORKER_MAC, PS_MAC = "02:00:00:00:00:0a", "02:00:00:00:00:01"
WORKER_IP, PS_IP = "198.18.0.10", "198.18.0.1"
SECRET = bytes(range(16))
ACK_LEN = 14 + 20 + 8 + W.HDR_LEN  # an ACK frame: headers only (CLOSED, or built here)
SACK_ACK_LEN = ACK_LEN + W.SACK_LEN  # an OPEN ACK the program sends: its block's bits too


def tok(round_: int) -> int:
    """The token of round_ of this job."""
    return tokens.derive(SECRET, JOB, round_)


def payload(n: int, seed: float = 0.0) -> bytes:
    return (np.arange(n // 4, dtype=np.float32) + seed).tobytes()


def data(worker=3, round_=5, chunk=1, nchunks=NCHUNKS, job=JOB, body=None, seed=0.0,
         sport=40000, dport=W.PORT, token=None, **ltp) -> Ether:
    if body is None:
        body = payload(LAST if chunk == nchunks - 1 else CHUNK, seed)
    return (Ether(src=WORKER_MAC, dst=PS_MAC) / IP(src=WORKER_IP, dst=PS_IP, id=99) /
            UDP(sport=sport, dport=dport) /
            W.LTP(worker=worker, job=job, round=round_, chunk=chunk, nchunks=nchunks,
                  token=tok(round_) if token is None else token, **ltp) /
            Raw(body))


def ack(worker=3, round_=9, chunk=2, state=W.RS_OPEN, rate=0, flags=0, token=None) -> Ether:
    return (Ether(src=PS_MAC, dst=WORKER_MAC) / IP(src=PS_IP, dst=WORKER_IP) /
            UDP(sport=W.PORT, dport=40000) /
            W.LTP(type=W.T_ACK, worker=worker, job=JOB, round=round_, chunk=chunk,
                  nchunks=NCHUNKS, state=state, rate=rate, flags=flags, len=0,
                  token=tok(round_) if token is None else token))


def sack_ack(bits: set[int], sack_bytes: int | None = None, **kw) -> Ether:
    """An ACK (as ack(**kw)) carrying the delivered bits `bits` of its block
    (LTP_F_SACK); sack_bytes: cut the SACK bytes to that many (a short frame)."""
    p = ack(**kw)
    p[W.LTP].flags = int(p[W.LTP].flags) | W.F_SACK
    p[W.LTP].len = W.SACK_LEN
    raw = sum(1 << b for b in bits).to_bytes(W.SACK_LEN, "little")
    return p / raw[:W.SACK_LEN if sack_bytes is None else sack_bytes]


def sack_recorded(acked: list[bool], closed=False):
    def check(m, res, pkt):
        tx = m.tx_state(9, 1)
        assert tx["closed"] == int(closed)
        assert m.acked_mask(9, 1, NCHUNKS).tolist() == acked
        assert tx["acked"] == sum(acked)      # counted once each: the bits that were new
        assert not m.acked[m.bank_index(9), 1, 1:].any()   # no other block touched
    return check


def expected_ack(pkt: Ether, state=W.RS_OPEN, flags=0, rate=0, sack: int | None = None
                 ) -> Ether:
    """What the program must turn `pkt` into, with checksums scapy computes;
    `sack`: the delivered bits of the chunk's block an OPEN ACK carries."""
    ip, udp, ltp = pkt[IP], pkt[UDP], pkt[W.LTP]
    tail = b"" if sack is None else sack.to_bytes(W.SACK_LEN, "little")
    return (Ether(src=pkt.dst, dst=pkt.src) /
            IP(src=ip.dst, dst=ip.src, id=ip.id, ttl=64, flags=ip.flags) /
            UDP(sport=udp.dport, dport=udp.sport) /
            W.LTP(type=W.T_ACK, flags=int(ltp.flags) | flags | (W.F_SACK if tail else 0),
                  worker=ltp.worker, job=ltp.job, round=ltp.round, chunk=ltp.chunk,
                  nchunks=ltp.nchunks, len=len(tail), state=state, rate=rate,
                  token=ltp.token) / tail)


def sack_of(m, pkt: Ether) -> int:
    """The delivered bits of the block of pkt's chunk in its bank and slot,
    as the program reads them into an OPEN ACK."""
    ltp = pkt[W.LTP]
    slot = m.peers_of([int(ltp.worker)])[int(ltp.worker)]
    return int(m.done[m.bank_index(int(ltp.round)), slot][int(ltp.chunk) // 64])


@dataclass
class Case:
    desc: str
    packet: object  # Ether or raw bytes
    verdict: int
    counters: dict[str, int]
    check: Callable | None = None
    before: Callable | None = None  # runs after the standard set-up
    extra: dict = field(default_factory=dict)


@pytest.fixture(scope="module")
def dp(small_geometry):
    from ltpx.dataplane.xdp.loader import Dataplane
    with Dataplane(small_geometry, job=JOB) as d:
        d.maps().set_peers({3: 1, 9: 2})
        yield d


def open_bank(m, round_, nchunks=NCHUNKS, last_len=LAST, **kw):
    """Open round_ as a receiving endpoint does: with its token."""
    return m.open_bank(round_, nchunks, last_len, token=tok(round_), **kw)


def standard(m):
    """The set-up every case starts from (see the module's docstring)."""
    m.mem_bytes[:] = 0
    open_bank(m, 4)
    open_bank(m, 5)
    m.set_rate(1, 0)
    m.live[0] = 0           # no heartbeat yet, as after `ltp load` ...
    m.set_liveness(1.0)     # ... with an endpoint's limit: DATA is ACKed


def beat_at(age_s: float, limit_s: float = 1.0):
    """A heartbeat age_s old (negative: ahead of the program's clock)."""
    def before(m):
        m.set_liveness(limit_s)
        m.live[0] = time.monotonic_ns() - int(age_s * 1e9)
    return before


def written(m, res, pkt):
    """data()'s chunk is in memory and counted (lands_in_memory less the
    slot statistics, which add up over the module's cases)."""
    assert m.done_mask(5, 1, NCHUNKS).tolist() == [False, True, False, False]
    assert m.mem_bytes[1, 1, CHUNK:2 * CHUNK].tobytes() == payload(CHUNK)
    assert m.progress[1, 1]["chunks"] == 1


def nothing_written(m, res, pkt):
    unchanged_memory(m, res, pkt)
    assert not m.progress["chunks"].any() and res.data == bytes(pkt)


@pytest.fixture
def maps(dp):
    m = dp.maps()
    standard(m)
    return m


def run(dp, pkt):
    return run_xdp(dp.prog_fd, bytes(pkt))


# --- extra checks ------------------------------------------------------------

def lands_in_memory(m, res, pkt):
    mask = m.done_mask(5, 1, NCHUNKS)
    assert mask.tolist() == [False, True, False, False]
    got = m.mem_bytes[1, 1, CHUNK:2 * CHUNK].tobytes()
    assert got == payload(CHUNK)
    assert m.slot_stats(1)["delivered"] == 1
    p = m.progress[1, 1]
    assert p["chunks"] == 1 and p["bytes"] == CHUNK


def is_ack_of(state=W.RS_OPEN, flags=0, rate=0, src=None):
    def check(m, res, pkt):
        pkt = src or pkt
        sack = sack_of(m, pkt) if state == W.RS_OPEN else None
        exp = expected_ack(pkt, state=state, flags=flags, rate=rate, sack=sack)
        assert res.data == bytes(exp), (Ether(res.data).show2(dump=True), exp.show2(dump=True))
        # scapy recomputes both checksums from scratch and they agree
        got = Ether(res.data)
        del got[IP].chksum, got[UDP].chksum
        assert bytes(Ether(bytes(got))) == res.data
    return check


def last_chunk_lands(m, res, pkt):
    assert m.done_mask(5, 1, NCHUNKS).tolist() == [False, False, False, True]
    assert m.mem_bytes[1, 1, 3 * CHUNK:3 * CHUNK + LAST].tobytes() == payload(LAST)


def _eq(a, b):
    assert a == b


def unchanged_memory(m, res, pkt):
    assert not m.mem_bytes.any()
    assert not m.done.any() and not m.claim.any()


def dropped_header_kept(counter):
    def check(m, res, pkt):
        unchanged_memory(m, res, pkt)
        h = m.last_header(counter)
        assert h.worker == pkt[W.LTP].worker and h.round == pkt[W.LTP].round
    return check


def unauthenticated(counter):
    """A round this host does not hold: no token to check it by, so nothing
    but the per-CPU count moves (no header kept, no per-slot count)."""
    def check(m, res, pkt):
        unchanged_memory(m, res, pkt)
        assert bytes(m.last_header(counter)) == bytes(W.LtpHdr())
        assert all(m.slot_stats(s)[counter] == 0 for s in range(m.geometry.slots))
    return check


def ack_recorded(closed=False, rate=0):
    def check(m, res, pkt):
        tx = m.tx_state(9, 1)
        assert tx["closed"] == int(closed)
        assert tx["rate_kbps"] == rate
        assert m.acked_mask(9, 1, NCHUNKS).tolist() == ([False] * 4 if closed
                                                          else [False, False, True, False])
        assert tx["acked"] == (0 if closed else 1)
    return check


def tx_untouched(m, res, pkt):
    """The sender's state of round 9 is as tx_start left it."""
    tx = m.tx_state(9, 1)
    assert (tx["round"], tx["closed"], tx["rate_kbps"], tx["acked"]) == (9, 0, 0, 0)
    assert not m.acked.any()


def acks_with_token(m, res, pkt):
    is_ack_of()(m, res, pkt)
    assert Ether(res.data)[W.LTP].token == tok(5)


def untouched(m, res, pkt):
    assert res.data == bytes(pkt)


def start_tx(m):
    m.tx_start(9, 1, tok(9))


def start_tx_of_4(m):
    m.tx_start(9, 1, tok(9), nchunks=NCHUNKS)


def close_round_4(m):
    m.close_bank(4)


def frag(p):
    p[IP].flags = "MF"
    return p


CASES = [
    Case("valid DATA is written and turned into its ACK", data(), XDP_TX,
         {"data": 1, "ack_tx": 1}, lambda m, r, p: (lands_in_memory(m, r, p),
                                                    is_ack_of()(m, r, p))),
    Case("last chunk with its short length", data(chunk=3), XDP_TX, {"data": 1, "ack_tx": 1},
         last_chunk_lands),
    Case("ACK carries the advertised rate", data(chunk=0), XDP_TX, {"data": 1, "ack_tx": 1},
         is_ack_of(rate=250_000), before=lambda m: m.set_rate(1, 250_000)),
    Case("flags are echoed in the ACK", data(chunk=0, flags="critical+last"), XDP_TX,
         {"data": 1, "ack_tx": 1}, is_ack_of()),
    Case("a re-sent chunk is counted as loss seen", data(chunk=0, flags="retx"), XDP_TX,
         {"data": 1, "ack_tx": 1},
         lambda m, r, p: (is_ack_of()(m, r, p),
                          _eq(m.progress[1, 1]["retx"], 1), _eq(m.progress[1, 1]["chunks"], 1))),
    Case("too short for an LTP header",
         Ether(src=WORKER_MAC, dst=PS_MAC) / IP(src=WORKER_IP, dst=PS_IP) /
         UDP(sport=1, dport=W.PORT) / Raw(b"LT\x01\x01"), XDP_DROP, {"malformed": 1},
         unchanged_memory),
    Case("bad magic", data(magic=0x1234), XDP_DROP, {"bad_magic": 1},
         dropped_header_kept("bad_magic")),
    Case("bad version", data(version=9), XDP_DROP, {"bad_version": 1},
         dropped_header_kept("bad_version")),
    Case("foreign job cookie", data(job=8), XDP_DROP, {"foreign_job": 1},
         dropped_header_kept("foreign_job")),
    Case("unknown worker", data(worker=4), XDP_DROP, {"unknown_worker": 1},
         dropped_header_kept("unknown_worker")),
    Case("stale round (older than the bank holds): counted, nothing kept", data(round_=3),
         XDP_DROP, {"stale": 1}, unauthenticated("stale")),
    Case("future round (not opened): counted, nothing kept", data(round_=7), XDP_DROP,
         {"future": 1}, unauthenticated("future")),
    Case("chunk index out of range", data(chunk=4, body=payload(CHUNK)), XDP_DROP,
         {"out_of_range": 1}, dropped_header_kept("out_of_range")),
    Case("chunk count disagrees with the round", data(nchunks=5), XDP_DROP,
         {"out_of_range": 1}, unchanged_memory),
    Case("short payload on a middle chunk", data(body=payload(LAST)), XDP_DROP,
         {"out_of_range": 1}, unchanged_memory),
    Case("payload not whole float32 elements", data(chunk=3, body=b"\0" * 6), XDP_DROP,
         {"malformed": 1}, unchanged_memory),
    Case("length field longer than the packet",
         data(len=CHUNK + 4), XDP_DROP, {"malformed": 1}, unchanged_memory),
    Case("payload longer than a chunk", data(chunk=0, body=b"\0" * (CHUNK + 8)), XDP_DROP,
         {"malformed": 1}, unchanged_memory),
    Case("IP fragment to the LTP port", frag(data()), XDP_DROP, {"malformed": 1},
         unchanged_memory),
    Case("unknown packet type", data(type=0), XDP_DROP, {"malformed": 1}, unchanged_memory),
    Case("control type is passed up", data(type=W.T_CTRL_MIN), XDP_PASS, {"ctrl": 1},
         untouched),
    Case("late packet of a closed round: ACKed CLOSED, memory untouched",
         data(round_=4, chunk=1), XDP_TX, {"late": 1, "ack_tx": 1},
         lambda m, r, p: (unchanged_memory(m, r, p), is_ack_of(state=W.RS_CLOSED)(m, r, p)),
         before=close_round_4),
    Case("ACK is recorded for the sender", ack(rate=5000), XDP_DROP, {"ack_rx": 1},
         ack_recorded(rate=5000), before=start_tx),
    Case("ACK saying CLOSED stops the sender", ack(state=W.RS_CLOSED), XDP_DROP,
         {"ack_rx": 1}, ack_recorded(closed=True), before=start_tx),
    Case("an ACK's SACK bits mark each chunk they name acked, none past the round's end",
         sack_ack({0, 2, 3, 10, 63}), XDP_DROP, {"ack_rx": 1},
         sack_recorded([True, False, True, True]), before=start_tx_of_4),
    Case("a CLOSED ACK's SACK bits mark nothing", sack_ack({0, 1, 2}, state=W.RS_CLOSED),
         XDP_DROP, {"ack_rx": 1}, sack_recorded([False] * 4, closed=True), before=start_tx_of_4),
    Case("SACK bytes cut short: only the ACK's own chunk is marked",
         sack_ack({0, 1, 2, 3}, sack_bytes=4), XDP_DROP, {"ack_rx": 1},
         sack_recorded([False, False, True, False]), before=start_tx_of_4),
    Case("ACK of a round not being sent", ack(round_=7), XDP_DROP, {"ack_stale": 1},
         before=start_tx),
    Case("ACK from an unknown worker", ack(worker=4), XDP_DROP, {"unknown_worker": 1},
         before=start_tx),
    # --- the round token: a blind spoofer knows job, round, worker and chunk, not it
    Case("DATA with its round's token is written; its ACK carries the token", data(chunk=2),
         XDP_TX, {"data": 1, "ack_tx": 1}, acks_with_token),
    Case("DATA without a token: dropped, counted, memory unchanged", data(token=0), XDP_DROP,
         {"bad_token": 1}, unchanged_memory),
    Case("DATA with one bit of the token wrong", data(token=tok(5) ^ 1 << 63), XDP_DROP,
         {"bad_token": 1}, unchanged_memory),
    Case("DATA with another round's token (the other bank's)", data(token=tok(4)), XDP_DROP,
         {"bad_token": 1}, unchanged_memory),
    Case("DATA of a closed round without its token: dropped, not ACKed CLOSED",
         data(round_=4, token=0), XDP_DROP, {"bad_token": 1}, unchanged_memory,
         before=close_round_4),
    Case("ACK without the round's token is ignored: sender state unchanged",
         ack(rate=5000, token=0), XDP_DROP, {"bad_token": 1}, tx_untouched, before=start_tx),
    Case("CLOSED ACK without the round's token does not close the round",
         ack(state=W.RS_CLOSED, token=tok(9) ^ 1), XDP_DROP, {"bad_token": 1}, tx_untouched,
         before=start_tx),
    Case("CLOSED ACK with another round's token does not close it",
         ack(state=W.RS_CLOSED, token=tok(7)), XDP_DROP, {"bad_token": 1}, tx_untouched,
         before=start_tx),
    # --- liveness: a hung receiver (its heartbeat in ltp_cfg is stale) stops ACKing
    Case("fresh heartbeat: DATA is written and ACKed", data(), XDP_TX,
         {"data": 1, "ack_tx": 1}, lambda m, r, p: (written(m, r, p),
                                                    is_ack_of()(m, r, p)),
         before=beat_at(0.01)),
    Case("stale heartbeat: DATA dropped without an ACK, counted, nothing written", data(),
         XDP_DROP, {"stale_owner": 1}, nothing_written, before=beat_at(1.5)),
    Case("stale under a shorter limit", data(), XDP_DROP, {"stale_owner": 1}, nothing_written,
         before=beat_at(0.3, limit_s=0.2)),
    Case("heartbeat a little ahead of the program's clock is fresh", data(), XDP_TX,
         {"data": 1, "ack_tx": 1}, written, before=beat_at(-0.005)),
    Case("stale heartbeat but no limit (liveness off): ACKed", data(), XDP_TX,
         {"data": 1, "ack_tx": 1}, written, before=beat_at(5.0, limit_s=0)),
    Case("stale heartbeat: a late packet of a closed round is still ACKed CLOSED",
         data(round_=4, chunk=1), XDP_TX, {"late": 1, "ack_tx": 1},
         is_ack_of(state=W.RS_CLOSED),
         before=lambda m: (close_round_4(m), beat_at(1.5)(m))),
    Case("stale heartbeat: DATA without the token is counted bad_token first",
         data(token=0), XDP_DROP, {"bad_token": 1}, nothing_written, before=beat_at(1.5)),
    Case("stale heartbeat: ACKs are still recorded (the sender side)", ack(rate=5000),
         XDP_DROP, {"ack_rx": 1}, ack_recorded(rate=5000),
         before=lambda m: (start_tx(m), beat_at(1.5)(m))),
    Case("ARP passes", Ether(src=WORKER_MAC, dst="ff:ff:ff:ff:ff:ff") /
         ARP(psrc=WORKER_IP, pdst=PS_IP), XDP_PASS, {"pass": 1}, untouched),
    Case("TCP passes", Ether() / IP(src=WORKER_IP, dst=PS_IP) / TCP(dport=W.PORT) / Raw(b"x" * 40),
         XDP_PASS, {"pass": 1}, untouched),
    Case("UDP to another port passes",
         Ether() / IP(src=WORKER_IP, dst=PS_IP) / UDP(sport=5000, dport=53) / Raw(b"q" * 40),
         XDP_PASS, {"pass": 1}, untouched),
    Case("IPv6 passes", Ether() / IPv6() / UDP(dport=W.PORT) / Raw(b"z" * 40), XDP_PASS,
         {"pass": 1}, untouched),
    Case("IPv4 with options passes (LTP never sends options)",
         Ether() / IP(src=WORKER_IP, dst=PS_IP, options=b"\x01\x01\x01\x01") /
         UDP(dport=W.PORT) / Raw(b"z" * 40), XDP_PASS, {"pass": 1}, untouched),
]


@pytest.mark.root
@pytest.mark.parametrize("case", CASES, ids=[c.desc for c in CASES])
def test_packet_table(dp, maps, case):
    if case.before:
        case.before(maps)
    before = maps.counters()
    res = run(dp, case.packet)
    after = maps.counters()
    assert res.verdict_name == {XDP_DROP: "XDP_DROP", XDP_PASS: "XDP_PASS",
                                XDP_TX: "XDP_TX"}[case.verdict]
    delta = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    assert delta == case.counters
    if case.check:
        case.check(maps, res, case.packet)


@pytest.mark.root
def test_duplicate_is_counted_once_and_not_rewritten(dp, maps):
    first = run(dp, data(chunk=2, seed=1.0))
    before = maps.counters()
    second = run(dp, data(chunk=2, seed=100.0))
    third = run(dp, data(chunk=2, seed=200.0))
    after = maps.counters()
    assert first.verdict == second.verdict == third.verdict == XDP_TX
    assert after["dup"] - before["dup"] == 2 and after["data"] == before["data"]
    assert Ether(second.data)[W.LTP].flags.dup  # re-ACKed: the first ACK may have been lost
    # memory keeps the first copy
    assert maps.mem_bytes[1, 1, 2 * CHUNK:3 * CHUNK].tobytes() == payload(CHUNK, 1.0)
    assert maps.progress[1, 1]["chunks"] == 1
    assert maps.slot_stats(1)["dup"] >= 2


@pytest.mark.root
def test_late_packet_of_old_bank_leaves_new_round_intact(dp, maps):
    """Round 5 lives in bank 1; after it closes, round 7 reuses bank 1. A late
    packet of round 5 must not touch round 7's memory: with round 5's token
    it is ACKed CLOSED with round 5's ACK token (its push ends now), with
    another it is a spoof; round 3, two rounds back, is stale."""
    run(dp, data(round_=5, chunk=0, seed=1.0))
    maps.close_bank(5)
    open_bank(maps, 7)
    run(dp, data(round_=7, chunk=0, seed=7.0))
    snapshot = maps.mem_bytes[1].copy()
    before = maps.counters()
    res = run(dp, data(round_=5, chunk=0, seed=5.0))
    res2 = run(dp, data(round_=5, chunk=1, seed=5.0))
    spoof = run(dp, data(round_=5, chunk=2, seed=5.0, token=tok(7)))
    older = run(dp, data(round_=3, chunk=0, seed=3.0))
    after = maps.counters()
    assert res.verdict == res2.verdict == XDP_TX
    for r in (res, res2):
        a = Ether(r.data)[W.LTP]
        assert (a.type, a.state, a.round, a.token) == (W.T_ACK, W.RS_CLOSED, 5, tok(5)), a
    assert spoof.verdict == older.verdict == XDP_DROP
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == \
        {"late": 2, "ack_tx": 2, "bad_token": 1, "stale": 1}
    assert np.array_equal(maps.mem_bytes[1], snapshot)
    assert maps.done_mask(7, 1, NCHUNKS).tolist() == [True, False, False, False]


@pytest.mark.root
def test_only_the_round_a_bank_held_just_before_is_answered_closed(dp, maps):
    """Bank 0 held nothing before round 4: DATA of round 2 is stale. Once
    round 6 reuses it, round 4 (the one before) is ACKed CLOSED, round 2 is
    still stale."""
    assert maps.banks.get(0).prev == 0
    before = maps.counters()
    assert run(dp, data(round_=2, chunk=0)).verdict == XDP_DROP
    maps.close_bank(4)
    open_bank(maps, 6)
    assert (maps.banks.get(0).prev, maps.banks.get(0).prev_round) == (1, 4)
    assert run(dp, data(round_=4, chunk=0)).verdict == XDP_TX
    assert run(dp, data(round_=2, chunk=0)).verdict == XDP_DROP
    after = maps.counters()
    assert after["late"] - before["late"] == 1 and after["stale"] - before["stale"] == 2


@pytest.mark.root
def test_a_spoof_first_does_not_stop_the_real_chunk(dp, maps):
    """A spoofed copy of a chunk arriving before the real one claims nothing:
    the real one is written (not taken for a duplicate) and the round's
    memory holds its bytes."""
    before = maps.counters()
    assert run(dp, data(chunk=2, seed=666.0, token=0)).verdict == XDP_DROP
    res = run(dp, data(chunk=2, seed=1.0))
    after = maps.counters()
    assert res.verdict == XDP_TX and not Ether(res.data)[W.LTP].flags.dup
    assert maps.mem_bytes[1, 1, 2 * CHUNK:3 * CHUNK].tobytes() == payload(CHUNK, 1.0)
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == \
        {"bad_token": 1, "data": 1, "ack_tx": 1}
    assert maps.progress[1, 1]["chunks"] == 1


def shared_state(m) -> dict:
    """Every value of the program's maps but the drop counters: what a
    spoofer must not be able to change."""
    from ltpx.dataplane.xdp.maps import COUNTERS
    g = m.geometry
    out = {name: getattr(m, name).copy() for name in
           ("mem_bytes", "claim", "done", "acked", "tx", "progress", "share", "live",
            "sendbuf", "sendorder")}
    out["lasthdr"] = [bytes(m.lasthdr.get(i)) for i in range(len(COUNTERS))]
    out["banks"] = [bytes(m.banks.get(b)) for b in range(g.banks)]
    out["cfg"] = bytes(m.cfg.get(0))
    out["stats"] = [m.slot_stats(s) for s in range(g.slots)]
    out["rates"] = [m.rate.get(s).value for s in range(g.slots)]
    return out


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        same = np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k]
        assert same, f"{k} changed"


SPOOFS = [
    ("DATA of an open round", data(chunk=1, token=0)),
    ("DATA of an open round, a wrong token bit", data(chunk=2, token=tok(5) ^ 1)),
    ("DATA of a closed round", data(round_=4, chunk=1, token=tok(6))),
    ("DATA flagged GROUP", data(chunk=1, token=tok(4), flags="reliable+group")),
    ("CLOSED ACK", ack(state=W.RS_CLOSED, token=0)),
    ("OPEN ACK with a rate", ack(rate=5000, token=tok(9) ^ 1 << 40)),
    ("clocked STOP ACK", ack(flags=W.F_CLOCK | W.F_STOP, rate=3, token=tok(7))),
]


@pytest.mark.root
@pytest.mark.parametrize("desc,pkt", SPOOFS, ids=[d for d, _ in SPOOFS])
def test_a_spoof_writes_nothing_but_its_count(dp, maps, desc, pkt):
    """A packet without its round's token changes no value of any map (no
    kept header either: ltp_lasthdr is shared, and the operator's tools
    read it), only the per-CPU bad_token counter, whatever it claims to be."""
    close_round_4(maps)
    start_tx(maps)
    maps.set_self(3, WORKER_IP, WORKER_MAC)
    maps.live[0] = time.monotonic_ns()
    maps.lasthdr.set(maps_counter("bad_token"), W.LtpHdr())
    before, c0 = shared_state(maps), maps.counters()
    for _ in range(3):
        res = run(dp, pkt)
        assert res.verdict == XDP_DROP
    after = maps.counters()
    assert {k: after[k] - c0[k] for k in after if after[k] != c0[k]} == {"bad_token": 3}
    assert_same_state(before, shared_state(maps))
    assert bytes(maps.last_header("bad_token")) == bytes(W.LtpHdr())


def maps_counter(name: str) -> int:
    from ltpx.dataplane.xdp.maps import COUNTERS
    return COUNTERS.index(name)


@pytest.mark.root
def test_a_spoofed_ack_before_the_real_one_changes_nothing(dp, maps):
    """A spoofed CLOSED ACK, then the real OPEN ACK of the same chunk: the
    sender's state is the real one's."""
    start_tx(maps)
    run(dp, ack(state=W.RS_CLOSED, chunk=2, token=0))
    run(dp, ack(state=W.RS_OPEN, chunk=2, rate=7000))
    ack_recorded(rate=7000)(maps, None, None)


@pytest.mark.root
def test_without_a_secret_the_token_is_zero_and_still_checked(dp, maps):
    """An endpoint without a secret opens its rounds with token 0: packets
    with token 0 are taken (the job cookie is the only check), any other
    token is not."""
    maps.open_bank(5, NCHUNKS, LAST)   # token 0: no secret
    before = maps.counters()["bad_token"]
    assert run(dp, data(chunk=0, token=1)).verdict == XDP_DROP
    assert run(dp, data(chunk=0, token=tok(5))).verdict == XDP_DROP
    assert run(dp, data(chunk=0, token=0)).verdict == XDP_TX
    assert maps.counters()["bad_token"] - before == 2
    maps.tx_start(9, 1)
    assert run(dp, ack(token=tok(9))).verdict == XDP_DROP and not maps.tx_state(9, 1)["acked"]
    run(dp, ack(token=0))
    assert maps.tx_state(9, 1)["acked"] == 1


@pytest.mark.root
def test_workers_land_in_their_own_slots(dp, maps):
    run(dp, data(worker=3, chunk=0, seed=3.0))
    run(dp, data(worker=9, chunk=0, seed=9.0))
    assert maps.slot_values(5, 1, 2)[:2].tolist() == [3.0, 4.0]
    assert maps.slot_values(5, 2, 2)[:2].tolist() == [9.0, 10.0]
    assert maps.slot_stats(2)["rx_bytes"] == CHUNK


@pytest.mark.root
def test_malformed_input_leaves_receiver_usable(dp, maps):
    for junk in (b"", b"\x00" * 13, bytes(data())[:40], bytes(data())[:60]):
        if len(junk) >= 14:
            run(dp, junk)
    assert run(dp, data(chunk=0)).verdict == XDP_TX
    assert maps.done_mask(5, 1, NCHUNKS)[0]


@pytest.mark.root
def test_bitmaps_of_a_geometry_with_odd_word_count():
    """192 chunks = 3 bitmap words (not a power of two): every chunk gets its
    own bit and its own memory."""
    from ltpx.dataplane.xdp.loader import Dataplane, Geometry
    n = 192
    with Dataplane(Geometry(slots=1, max_chunks=n), job=JOB) as d:
        m = d.maps()
        m.set_peers({3: 0})
        open_bank(m, 5, n, CHUNK)
        for c in range(n):
            pkt = data(chunk=c, nchunks=n, body=payload(CHUNK, float(c)))
            assert run(d, pkt).verdict == XDP_TX
        assert m.done_mask(5, 0, n).all()
        assert m.counters()["dup"] == 0
        firsts = m.slot_values(5, 0, n * CHUNK // 4)[::CHUNK // 4]
        assert firsts.tolist() == [float(c) for c in range(n)]


@pytest.mark.root
def test_group_data_is_taken_for_the_hosts_own_id():
    """DATA flagged GROUP (sent to a broadcast address) lands in the slot of
    the host's own id and is ACKed from the host's own MAC and address, naming
    that id; before the host's identity is set (a server's endpoint, which
    another server's group answer reaches on one segment) it is dropped and
    counted no_group, not as a drop of this host's own traffic."""
    from ltpx.dataplane.xdp.loader import Dataplane, Geometry
    self_mac, self_ip = "02:00:00:00:00:0b", "198.18.0.11"
    pkt = (Ether(src=PS_MAC, dst="ff:ff:ff:ff:ff:ff") / IP(src=PS_IP, dst="198.18.0.255", id=5) /
           UDP(sport=40000, dport=W.PORT) /
           W.LTP(worker=0, job=JOB, round=5, chunk=1, nchunks=NCHUNKS, flags="reliable+group",
                 token=tok(5)) /
           Raw(payload(CHUNK, 2.0)))
    with Dataplane(Geometry(slots=2, max_chunks=64), job=JOB) as d:
        m = d.maps()
        m.set_peers({9: 1})
        open_bank(m, 5)
        res = run(d, pkt)
        assert res.verdict == XDP_DROP and m.counters()["no_group"] == 1
        assert m.counters()["unknown_worker"] == 0
        assert not m.done.any()
        m.set_self(9, self_ip, self_mac)
        m.set_job(JOB)  # keeps the identity
        spoof = pkt.copy()
        spoof[W.LTP].token = tok(6)  # another round's: the group's token is the round's
        assert run(d, spoof).verdict == XDP_DROP and m.counters()["bad_token"] == 1
        assert not m.done.any() and not m.claim.any()
        res = run(d, pkt)
        assert res.verdict == XDP_TX
        assert m.done_mask(5, 1, NCHUNKS).tolist() == [False, True, False, False]
        assert m.mem_bytes[1, 1, CHUNK:2 * CHUNK].tobytes() == payload(CHUNK, 2.0)
        got = Ether(res.data)
        assert (got.src, got.dst, got[IP].src, got[IP].dst) == (self_mac, PS_MAC, self_ip, PS_IP)
        assert (got[W.LTP].type, got[W.LTP].worker, got[W.LTP].chunk, got[W.LTP].token) == \
            (W.T_ACK, 9, 1, tok(5))
        del got[IP].chksum, got[UDP].chksum  # scapy recomputes both and agrees
        assert bytes(Ether(bytes(got))) == res.data
        with pytest.raises(ValueError, match="MAC"):
            m.set_self(9, self_ip, "02:00")


@pytest.mark.root
def test_ack_divides_the_share_among_unfinished_flows(dp, maps):
    """With a share set on the bank, each ACK carries share / (flows not yet
    finished): a flow's last chunk takes it off the count at once (the ACK of
    that very chunk already says so), duplicates change nothing, and the
    per-slot rate is not used."""
    open_bank(maps, 5, share_kbps=900_000, flows=2)
    maps.set_rate(1, 1234)  # ignored while the bank has a share

    def rate_of(res):
        return Ether(res.data)[W.LTP].rate

    assert maps.active_flows(5) == 2
    assert rate_of(run(dp, data(worker=3, chunk=0))) == 450_000
    assert rate_of(run(dp, data(worker=9, chunk=0))) == 450_000
    assert rate_of(run(dp, data(worker=3, chunk=0))) == 450_000  # duplicate
    for c in (1, 2):
        assert rate_of(run(dp, data(worker=3, chunk=c))) == 450_000
    # w3's last chunk ends its flow; the one left gets it all
    assert rate_of(run(dp, data(worker=3, chunk=3))) == 900_000
    assert maps.active_flows(5) == 1
    assert rate_of(run(dp, data(worker=3, chunk=3))) == 900_000  # dup of the last
    assert rate_of(run(dp, data(worker=9, chunk=1))) == 900_000
    assert maps.active_flows(5) == 1
    maps.set_share(5, 0)  # no share: back to the per-slot rate
    assert rate_of(run(dp, data(worker=3, chunk=2))) == 1234
    open_bank(maps, 5, share_kbps=900_000, flows=2)  # the next round
    assert maps.active_flows(5) == 2
    assert rate_of(run(dp, data(worker=3, chunk=0))) == 450_000


# --- the capture path (ltp_capcfg on: each LTP frame into ltp_capring) ----------

@pytest.fixture
def ring(dp):
    """The program's capture maps and its ring read through mmap, emptied;
    capture is switched off again afterwards."""
    from ltpx.dataplane.xdp import capring
    cm = capring.CaptureMaps.from_dataplane(dp)
    r = capring.Ring(cm.fds["ltp_capring"], cm.ring_bytes)
    r.skip()
    yield cm, r
    cm.cfg.set(0, capring.CapCfg())
    r.close()


def capture_on(cm, **cfg):
    """Capture on for a minute with `cfg` (CapCfg fields; flags by name)."""
    import time
    from ltpx.dataplane.xdp import capring
    flags = sum(getattr(capring, f"CAP_F_{f.upper()}") for f in cfg.pop("filters", ()))
    c = capring.CapCfg(until_ns=time.monotonic_ns() + 60 * 10**9, snaplen=cm.frame_max,
                       flags=flags)
    for k, v in cfg.items():
        setattr(c, k, v)
    cm.cfg.set(0, c)


SHORT = (Ether(src=WORKER_MAC, dst=PS_MAC) / IP(src=WORKER_IP, dst=PS_IP) /
         UDP(sport=1, dport=W.PORT) / Raw(b"LT\x01\x01"))


@dataclass
class CapCase:
    desc: str
    packet: object
    cfg: dict | None          # None: capture off; else capture_on's arguments
    records: list             # (direction, verdict, bytes kept) per record, in order


FULL = len(data())
CAP_CASES = [
    CapCase("capture off: nothing is recorded", data(), None, []),
    CapCase("DATA is recorded as it arrived, with its verdict", data(), {},
            [("in", XDP_TX, FULL)]),
    CapCase("snaplen cuts the snapshot (wire length kept)", data(), {"snaplen": 100},
            [("in", XDP_TX, 100)]),
    CapCase("tx: the ACK the program sent follows its DATA", data(), {"filters": ["tx"]},
            [("in", XDP_TX, FULL), ("out", XDP_TX, SACK_ACK_LEN)]),
    CapCase("a dropped frame is recorded with XDP_DROP", data(magic=0x1234), {},
            [("in", XDP_DROP, FULL)]),
    CapCase("an ACK coming in is recorded (XDP_DROP: consumed)", ack(), {},
            [("in", XDP_DROP, ACK_LEN)]),
    CapCase("a control frame is recorded with XDP_PASS", data(type=W.T_CTRL_MIN), {},
            [("in", XDP_PASS, FULL)]),
    CapCase("a frame that is not LTP is not recorded",
            Ether() / IP(src=WORKER_IP, dst=PS_IP) / UDP(sport=5000, dport=53) / Raw(b"q" * 40),
            {}, []),
    CapCase("too short for a header: recorded when no filter needs the header", SHORT, {},
            [("in", XDP_DROP, len(SHORT))]),
    CapCase("too short for a header: not recorded under a filter", SHORT,
            {"filters": ["job"], "job": JOB}, []),
    CapCase("worker filter: another worker's frame is not recorded", data(worker=3),
            {"filters": ["worker"], "worker": 9}, []),
    CapCase("worker filter: its own frame is", data(worker=9, chunk=0),
            {"filters": ["worker"], "worker": 9}, [("in", XDP_TX, FULL)]),
    CapCase("round filter", data(round_=5), {"filters": ["round"], "round": 4}, []),
    CapCase("job filter", data(job=8), {"filters": ["job"], "job": JOB}, []),
    CapCase("an expired lease records nothing", data(), {"until_ns": 1}, []),
]


@pytest.mark.root
@pytest.mark.parametrize("case", CAP_CASES, ids=[c.desc for c in CAP_CASES])
def test_capture_table(dp, maps, ring, case):
    import time
    cm, r = ring
    if case.cfg is not None:
        capture_on(cm, **case.cfg)
    before, stats0, t0 = maps.counters(), cm.stat_totals(), time.monotonic_ns()
    res = run(dp, case.packet)
    t1, recs = time.monotonic_ns(), r.drain()
    raw = bytes(case.packet)
    assert [(x.direction, x.verdict, len(x.frame)) for x in recs] == case.records
    captured, lost = (a - b for a, b in zip(cm.stat_totals(), stats0))
    assert (captured, lost) == (len(recs), 0)
    for x in recs:
        assert x.verdict == res.verdict and t0 <= x.ts_ns <= t1
        if x.direction == "in":      # the frame before the program touched it
            assert x.frame == raw[:len(x.frame)] and x.wire_len == len(raw)
        else:                        # the frame as XDP_TX sent it
            assert x.frame == res.data and x.wire_len == len(res.data)
    assert maps.counters() != before or not case.records




@pytest.mark.root
@pytest.mark.parametrize("case", CASES, ids=[c.desc for c in CASES])
def test_capture_changes_no_verdict_byte_or_counter(dp, maps, ring, case):
    """Every case of the packet table gives the same verdict, output frame
    and counter changes with capture on (ACKs included) as with it off."""
    cm, r = ring
    outcomes = []
    for on in (False, True):
        standard(maps)
        if case.before:
            case.before(maps)
        if on:
            capture_on(cm, filters=["tx"])
        before = maps.counters()
        res = run(dp, case.packet)
        after = maps.counters()
        outcomes.append((res.verdict, res.data,
                         {k: after[k] - before[k] for k in after if after[k] != before[k]}))
    assert outcomes[0] == outcomes[1]
    verdict, _, delta = outcomes[1]
    want = [] if delta == {"pass": 1} else ["in", "out"] if verdict == XDP_TX else ["in"]
    assert [x.direction for x in r.drain()] == want


@pytest.mark.root
def test_a_full_ring_counts_what_it_lost(dp, maps, ring):
    """More records than the ring holds: those it has no room for are counted
    lost, none is half-written, and the ring works again once drained."""
    from ltpx.dataplane.xdp.capring import RINGBUF_HDR
    cm, r = ring
    capture_on(cm)
    pkt = bytes(ack(worker=4))                 # dropped, unchanged: the same frame each run
    per = (RINGBUF_HDR + 24 + len(pkt) + 7) // 8 * 8
    fits = cm.ring_bytes // per
    stats0 = cm.stat_totals()
    run_xdp(dp.prog_fd, pkt, repeat=fits + 1000)
    captured, lost = (a - b for a, b in zip(cm.stat_totals(), stats0))
    recs = r.drain()
    assert captured + lost == fits + 1000 and lost >= 1000 and len(recs) == captured
    assert all(x.frame == pkt for x in recs)
    run(dp, ack(worker=4))
    assert len(r.drain()) == 1
