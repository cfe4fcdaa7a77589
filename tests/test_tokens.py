# SPDX-License-Identifier: Apache-2.0
"""Round tokens against blind spoofing (issue 16, finding 4).

Without the job's secret, a host off the path knows the job cookie, the
round, the worker ids and the chunk count (all in clear on the wire, or easy
to guess), but not the round's token. Here: the derivation on its own (no
root), the dissector on a token, and on the rig, from a third namespace, a
spoofed DATA round sent before the real one and spoofed CLOSED ACKs sent to
a worker about to push (real endpoints, real packets). The per-packet rules
are in tests/test_xdp_packets.py's table.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import star_rig
from ltpx.control.trust import tokens
from ltpx.dataplane.xdp import wire as W

RIG = f"tok{os.getpid() % 100000}"
JOB = 0x5107
NEL = 20_000                       # 57 chunks of 1424 bytes
GUESSES = 300                      # random tokens a blind spoofer tries per attack


# --------------------------------------------------------------- the derivation

@pytest.mark.unit
def test_tokens_are_per_round_per_job_per_secret_and_never_zero():
    a, b = tokens.new_secret(), tokens.new_secret()
    assert len(a) == tokens.SECRET_BYTES == 16 and a != b
    t = tokens.derive(a, JOB, 7)
    assert t == tokens.derive(a, JOB, 7) and 0 < t < 2**64
    others = {tokens.derive(a, JOB, r) for r in range(1000)}
    assert len(others) == 1000 and 0 not in others        # 64 bits: no collision expected
    assert t != tokens.derive(b, JOB, 7) and t != tokens.derive(a, JOB + 1, 7)
    assert tokens.derive(a, JOB, 2**32 + 7) == t          # rounds are u32 on the wire
    assert tokens.derive(None, JOB, 7) == 0


@pytest.mark.unit
def test_tokens_are_per_worker_and_direction_and_a_member_key_makes_only_its_own():
    s = tokens.new_secret()
    kinds = (tokens.UP, tokens.UP_ACK, tokens.DOWN, tokens.DOWN_ACK)
    every = {tokens.derive(s, JOB, 7, w, k) for w in (0, 1, 2) for k in kinds}
    every.add(tokens.derive(s, JOB, 7, kind=tokens.GROUP))
    assert len(every) == 13 and 0 not in every
    m1 = tokens.member(s, 1)
    assert len(m1.key) == 32 and m1.key != s
    assert [tokens.derive(m1, JOB, 7, 1, k) for k in kinds] == \
        [tokens.derive(s, JOB, 7, 1, k) for k in kinds]
    with pytest.raises(ValueError, match="worker 2"):
        tokens.derive(m1, JOB, 7, 2, tokens.UP)
    assert tokens.derive(m1, JOB, 7, kind=tokens.GROUP) is None
    # the two ends of each flow agree: a worker's uplink is the server's to
    # receive, the server's answer the worker's
    server, worker = tokens.RoundTokens(s, JOB), tokens.RoundTokens(m1, JOB, self_id=1)
    assert worker.send(7, 1) == server.receive(7, 1) != server.send(7, 1) == worker.receive(7, 1)
    assert worker.bank(7, {1: 0, 2: 1}) == {0: server.send(7, 1)}
    assert worker.group(7) is None and server.group(7) == tokens.derive(s, JOB, 7, 0, tokens.GROUP)
    with pytest.raises(ValueError, match="self_id=1"):
        tokens.RoundTokens(m1, JOB, self_id=2)


@pytest.mark.unit
@pytest.mark.parametrize("bad,err,word", [
    (b"short", ValueError, "16..64 bytes"), (b"x" * 65, ValueError, "16..64 bytes"),
    ("0123456789abcdef0123", TypeError, "bytes"), (1234, TypeError, "bytes"),
])
def test_a_bad_secret_is_refused_in_one_line(bad, err, word):
    with pytest.raises(err, match=word) as e:
        tokens.RoundTokens(bad, JOB)
    assert "\n" not in str(e.value)


@pytest.mark.unit
def test_no_secret_warns_once_per_process(monkeypatch):
    monkeypatch.setattr(tokens.RoundTokens, "_warned", False)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        first, second = tokens.RoundTokens(None, JOB), tokens.RoundTokens(None, JOB)
        tokens.RoundTokens(tokens.new_secret(), JOB)
    assert [w.category for w in got] == [tokens.UnprotectedWarning]
    assert "no secret" in str(got[0].message) and "new_secret" in str(got[0].message)
    assert not first.protected and first.send(5, 0) == second.receive(5, 0) == (0, 0)
    assert first.group(5) == 0
    assert tokens.RoundTokens(bytearray(range(32)), JOB).protected


TSHARK = shutil.which("tshark")
LUA = Path(__file__).resolve().parent.parent / "tools" / "wireshark" / "ltp.lua"


@pytest.mark.unit
@pytest.mark.skipif(TSHARK is None, reason="needs tshark (scripts/setup.sh installs it)")
def test_tshark_shows_the_token(tmp_path):
    """The dissector reads the 64-bit token whole (above 2**63 too)."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from ltpx.dataplane.xdp import pcap
    tok = 0xF123456789ABCDEF
    frame = bytes(Ether() / IP(src="198.18.0.10", dst="198.18.0.1") /
                  UDP(sport=40000, dport=W.PORT) /
                  W.LTP(worker=3, job=JOB, round=9, chunk=0, nchunks=1, token=tok) / (b"\0" * 8))
    path = str(tmp_path / "tok.pcap")
    w = pcap.Writer(path)
    w.write(1_790_000_000_000_000_000, frame)
    w.close()
    res = subprocess.run([TSHARK, "-X", f"lua_script:{LUA}", "-r", path, "-T", "fields",
                          "-e", "ltpx.token", "-e", "ltpx.version", "-e", "ltpx.payload_len"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    got_tok, version, payload = res.stdout.strip().split("\t")
    assert (int(got_tok, 0), int(version), int(payload)) == (tok, W.VERSION, 8)


# --------------------------------------------------------------------- on the rig

@pytest.fixture(scope="module")
def rig():
    # a deep PS queue: every spoof must reach the PS's program to be counted
    yield from star_rig(name=RIG, workers=2, buffer_bytes=2_000_000)


@pytest.fixture(scope="module")
def job(rig):
    """PS and worker 0 share a secret; worker 1's namespace is the spoofer's."""
    from ltpx.control.transport import Endpoint
    secret, ps_h, w_h = tokens.new_secret(), rig.ps, rig.workers[0]
    mode = rig.config.mode
    ps = Endpoint(ps_h.ifname, ps_h.ip, {0: 0}, NEL, ns=ps_h.netns, mode=mode, job=JOB,
                  secret=secret, publish=False)
    try:
        wk = Endpoint(w_h.ifname, w_h.ip, {0: 0}, NEL, ns=w_h.netns, mode=mode, job=JOB,
                      secret=secret, self_id=0, publish=False)
    except BaseException:
        ps.close()
        raise
    spoofer = rig.socket(rig.workers[1])
    try:
        yield ps, wk, spoofer
    finally:
        spoofer.close()
        wk.close()
        ps.close()


def _nchunks() -> int:
    return -(-NEL * 4 // 1424)


def _guesses(n: int) -> list[int]:
    """A blind spoofer's tokens: none (0), then random 64-bit guesses."""
    rng = np.random.default_rng(16)
    return [0] + [int(x) for x in rng.integers(1, 2**64, size=n - 1, dtype=np.uint64)]


def _until(pred, seconds: float = 5.0) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if pred():
            return True
        time.sleep(0.002)
    return pred()


def _grad(round_: int) -> np.ndarray:
    return np.random.default_rng([JOB, round_]).standard_normal(NEL).astype(np.float32)


def _forged_round_then_the_real_one(rig, ps, wk, sock, r: int, toks, fill: bytes):
    """Round r opened; worker 0's whole round sent from `sock` once per token
    in toks (payload bytes `fill`): every frame counted bad_token, none
    written or ACKed; then worker 0's real push completes bit-exact with no
    chunk taken for a duplicate. Returns the round's result, the frames
    forged, and the counters before and after."""
    from ltpx.control.transport import Peer
    nch = _nchunks()
    ps.open_round(r, NEL)
    before = ps.counters()
    sent = 0
    for tok in toks:
        for c in range(nch):
            n = 1424 if c < nch - 1 else NEL * 4 - 1424 * (nch - 1)
            sock.sendto(W.pack_header(worker=0, job=JOB, round=r, chunk=c, nchunks=nch,
                                      length=n, token=tok) + fill * n, (rig.ps.ip, W.PORT))
            sent += 1
    assert _until(lambda: ps.counters()["bad_token"] - before["bad_token"] == sent)
    mid = ps.counters()
    assert (mid["data"], mid["ack_tx"]) == (before["data"], before["ack_tx"])
    assert not ps.maps.done[ps.maps.bank_index(r)].any()
    g = _grad(r)
    rep = wk.push(r, g, Peer(0, rig.ps.ip), timeout_s=10.0)
    res = ps.wait_round(r)
    after = ps.counters()
    assert res.reason == "complete" and np.array_equal(res.values[0], g)
    assert rep.acked == nch and after["dup"] == before["dup"]
    return res, sent, before, after


@pytest.mark.rig
def test_spoofed_data_sent_first_is_dropped_and_the_real_round_lands(rig, job):
    """Every chunk of worker 0's round, with the right job, round, worker,
    chunk count and lengths, sent from another host before worker 0 pushes,
    without the token (then with guessed ones): none is written or ACKed,
    each is counted bad_token, and the real round completes bit-exact with
    no chunk taken for a duplicate."""
    ps, wk, spoofer = job
    spoofer.bind((rig.workers[1].ip, 0))
    res, sent, before, after = _forged_round_then_the_real_one(
        rig, ps, wk, spoofer, 11, _guesses(GUESSES // _nchunks() + 1), b"\xff")
    assert res.bad_token == sent and after["bad_token"] - before["bad_token"] == sent


@pytest.mark.rig
def test_spoofed_closed_acks_do_not_stop_a_workers_push(rig, job):
    """CLOSED ACKs for worker 0's next round, from the PS's port to the
    worker's socket, sent from another host after the worker planned its
    push, without the token (then with guessed ones): the worker's round
    stays open, each is counted bad_token, and the push sends and delivers
    every chunk. The same ACK with the round's token (an on-path attacker,
    out of scope) would close it: the spoof did reach the program."""
    from ltpx.control.transport import Peer
    ps, wk, _ = job
    r, nch = 12, _nchunks()
    attacker = rig.socket(rig.workers[1])
    try:
        attacker.bind((rig.workers[1].ip, W.PORT))
        g = _grad(r)
        plan = wk.prepare_push(r, g, Peer(0, rig.ps.ip), timeout_s=10.0)  # tx state set
        to = (rig.workers[0].ip, wk.sock.getsockname()[1])
        before = wk.counters()
        guesses = _guesses(GUESSES)
        for i, tok in enumerate(guesses):
            attacker.sendto(W.pack_header(type=W.T_ACK, worker=0, job=JOB, round=r,
                                          chunk=i % nch, nchunks=nch, state=W.RS_CLOSED,
                                          token=tok), to)
        assert _until(lambda: wk.counters()["bad_token"] - before["bad_token"] == len(guesses))
        tx = wk.maps.tx_state(r, 0)
        assert (tx["closed"], tx["acked"]) == (0, 0)
        assert wk.counters()["ack_rx"] == before["ack_rx"]
        ps.open_round(r, NEL)
        rep = wk.send(plan)
        res = ps.wait_round(r)
        assert rep.sent >= nch and rep.acked == nch and not rep.closed_by_receiver
        assert res.reason == "complete" and np.array_equal(res.values[0], g)

        # what the token stops: the same CLOSED ACK, token known
        r2 = r + 2
        wk.prepare_push(r2, g, Peer(0, rig.ps.ip))
        attacker.sendto(W.pack_header(type=W.T_ACK, worker=0, job=JOB, round=r2, chunk=0,
                                      nchunks=nch, state=W.RS_CLOSED,
                                      token=tokens.derive(wk.sender.tokens.secret, JOB, r2,
                                                          0, tokens.UP_ACK)),
                        to)
        assert _until(lambda: wk.maps.tx_state(r2, 0)["closed"] == 1)
    finally:
        attacker.close()


@pytest.mark.rig
def test_a_peer_with_another_secret_is_not_heard(rig, job):
    """A worker holding another secret (another job's, or a stale one):
    the PS counts its packets bad_token and takes none; its push gets no
    ACK and ends in DeadPeerError naming the secret as a cause."""
    from ltpx.control.transport import DeadPeerError, Endpoint, Peer
    ps, wk, _ = job
    r = 21
    h = rig.workers[1]
    other = Endpoint(h.ifname, h.ip, {0: 0}, NEL, ns=h.netns, mode=rig.config.mode, job=JOB,
                     secret=tokens.new_secret(), publish=False)
    try:
        ps.open_round(r, NEL)
        before = ps.counters()
        with pytest.raises(DeadPeerError, match="secret"):
            other.push(r, _grad(r), Peer(0, rig.ps.ip), timeout_s=1.0)
        after = ps.counters()
        assert after["bad_token"] > before["bad_token"] and after["data"] == before["data"]
        assert not ps.maps.done[ps.maps.bank_index(r)].any()
        ps.cancel_round(r)
    finally:
        other.close()


@pytest.mark.rig
def test_a_member_holding_its_own_key_cannot_write_another_workers_round(rig, job):
    """From worker 1's namespace, a member given only its own key
    (tokens.member) sends worker 0's whole round before worker 0 pushes, once
    with each token its key makes (every kind, round r): the PS counts every
    frame bad_token and writes or ACKs none; worker 0's real push then
    completes bit-exact, no chunk taken for a duplicate."""
    ps, wk, _ = job
    r = 31
    m1 = tokens.member(wk.sender.tokens.secret, 1)
    own = [tokens.derive(m1, JOB, r, 1, k)
           for k in (tokens.UP, tokens.UP_ACK, tokens.DOWN, tokens.DOWN_ACK)]
    member = rig.socket(rig.workers[1])
    try:
        member.bind((rig.workers[1].ip, 0))
        _forged_round_then_the_real_one(rig, ps, wk, member, r, own, b"\xee")
    finally:
        member.close()
