# SPDX-License-Identifier: Apache-2.0
"""Streamed answers (control/transport/stream.py, issue 40): a step's answer
sent part by part as its rounds are summed, signed as it fills.

Here: the streamed signature is the signature of the whole answer; DDP's
buckets cut into rounds; on a rig, an answer streamed through real
endpoints to the group address arrives whole and verified, each part
proving its rounds over to a worker only once it was sent; a stream whose
worker is gone stops with the error the server falls back on; and DDP
training with buckets cut small (several rounds a step, so streamed
answers) keeps the replicas bit-identical and trains to the same digest
as whole answers.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import star_rig
from ltpx.control.torchapi.ddp import cut
from ltpx.control.trust import signing, tokens
from ltpx.control.trust.signing import SIG_ELEMS, Signer, StreamSigner, Verifier

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
RIG = f"st{os.getpid() % 100000}"
JOB = 0x4040


@pytest.mark.unit
@pytest.mark.parametrize("n", [0, 1, 1023, 1024, 1025, 5000])
def test_a_streamed_signature_is_the_whole_answers(monkeypatch, n):
    """Whatever prefixes were fed, and in whatever steps, the streamed
    signature is the bytes Signer.sign appends, and a worker's Verifier
    takes it; a changed element is refused."""
    monkeypatch.setattr(signing, "PIECE_BYTES", 1024)   # many pieces from a small answer
    secret = tokens.bind(tokens.new_secret(), b"run-1")
    signer = Signer(secret, JOB)
    body = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    whole = signer.sign(7, body)
    for feeds in ([], [n], [1, 255, 256, 300, 700], [n // 3, n // 3, 2 * n // 3 + 1]):
        buf = np.zeros(n + SIG_ELEMS, dtype=np.float32)
        st = StreamSigner(signer, 7, n)
        for k in feeds:          # what is final is written before it is fed
            k = min(k, n)
            buf[:k] = body[:k]
            st.feed(buf, k)
        buf[:n] = body
        st.sign_into(buf)
        assert buf.tobytes() == whole.tobytes(), feeds
    ver = Verifier(tokens.answer_pub(secret), JOB, b"run-1")
    assert np.array_equal(ver.check(7, buf), body)
    if n:
        buf[n // 2] += 1.0
        with pytest.raises(signing.ForgedAnswerError):
            ver.check(7, buf)


@pytest.mark.unit
def test_a_streamed_signature_needs_room_for_itself():
    st = StreamSigner(Signer(tokens.new_secret(), JOB), 1, 10)
    with pytest.raises(ValueError, match="room for its signature"):
        st.sign_into(np.zeros(10, dtype=np.float32))


@pytest.mark.unit
@pytest.mark.parametrize("n,most", [(1, 4), (4, 4), (5, 4), (17_400_000, 1 << 20), (7, 1), (3, 0)])
def test_a_bucket_is_cut_into_as_few_even_rounds_as_hold_it(n, most):
    parts = cut(n, most)
    assert sum(parts) == n
    assert max(parts) - min(parts) <= 1
    assert max(parts) <= max(1, most)
    assert len(parts) == max(1, -(-n // max(1, most)))


# --------------------------------------------------------------------------- on a rig

@pytest.fixture(scope="module")
def rig():
    yield from star_rig(name=RIG, workers=2, buffer_bytes=2_000_000)


def _endpoints(rig, n, secret):
    from ltpx.control.transport import Endpoint
    mode, ps_h = rig.config.mode, rig.ps
    eps = [Endpoint(ps_h.ifname, ps_h.ip, {0: 0, 1: 1}, n, ns=ps_h.netns, mode=mode, job=JOB,
                    secret=secret, publish=False, sender="socket")]
    for w in range(len(rig.workers)):
        eps.append(_worker_endpoint(rig, w, n, secret))
    return eps


def _worker_endpoint(rig, w, n, secret, **kw):
    from ltpx.control.transport import Endpoint
    h = rig.workers[w]
    return Endpoint(h.ifname, h.ip, {w: 0}, n, ns=h.netns, mode=rig.config.mode, job=JOB,
                    secret=tokens.member(secret, w, group=True), self_id=w,
                    publish=False, liveness_s=None, **kw)


@pytest.mark.rig
def test_a_remade_endpoint_acks_the_late_resends_of_an_answer_it_took(rig):
    """A worker that took answer d and then made its endpoint anew (a larger
    op came) while the server still re-sends d's tail (its ACKs lost):
    retire(d) makes the new program ACK d's DATA CLOSED, so the server's push
    ends at once; a new program without it drops them unheard, and the push
    takes the worker for dead (DeadPeerError), the job's server with it."""
    from ltpx.control.transport import DeadPeerError, Peer
    secret = tokens.bind(tokens.new_secret(), b"retire-run")
    n, d = 5000, 3
    eps = _endpoints(rig, n + 4096, secret)
    try:
        ps, wk = eps[0], eps[1:]
        peers = [Peer(w, h.ip) for w, h in enumerate(rig.workers)]
        answer = np.random.default_rng(41).standard_normal(n).astype(np.float32)
        for w, e in enumerate(wk):
            e.expect(d, n, w)
        ps.push_reliable(d, answer, peers, timeout_s=10.0)
        for e in wk:
            assert np.array_equal(e.receive(d, timeout_s=10.0), answer)
        for w in (0, 1):                  # both make their endpoints anew
            eps[1 + w].close()
            eps[1 + w] = _worker_endpoint(rig, w, 2 * n + 4096, secret)
        eps[1].retire(d, 0)               # only worker 0 says it took d
        rep = ps.push_reliable(d, answer, [peers[0]], timeout_s=5.0)   # d's re-sends, again
        assert rep.closed_by_receiver and rep.duration_s < 2.0, rep
        with pytest.raises(DeadPeerError):
            ps.push_reliable(d, answer, [peers[1]], timeout_s=1.0)
    finally:
        for e in eps:
            e.close()


@pytest.mark.rig
def test_a_push_to_an_endpoint_being_remade_ends_when_it_is_back(rig):
    """A one-chunk answer re-sent while its worker makes its endpoint anew
    (no program on the device for a while; under load, seconds): the
    server's probes go on until the push's timeout, so the new program's
    CLOSED ends the push once it is up. (Probes that stopped at two
    passes' worth of chunks, 30 ms for one chunk, left such a push blind
    until its timeout: DeadPeerError against a live worker.)"""
    import threading

    from ltpx.control.transport import Peer
    secret = tokens.bind(tokens.new_secret(), b"remade-run")
    n, d = 8, 5
    eps = _endpoints(rig, 4096, secret)
    try:
        ps = eps[0]
        answer = np.arange(n, dtype=np.float32)
        eps[1].expect(d, n, 0)
        ps.push_reliable(d, answer, [Peer(0, rig.workers[0].ip)], timeout_s=10.0)
        assert np.array_equal(eps[1].receive(d, timeout_s=10.0), answer)
        eps[1].close()                    # its ACKs lost, say: the server re-sends d
        out = {}

        def resend():
            try:
                out["rep"] = ps.push_reliable(d, answer, [Peer(0, rig.workers[0].ip)],
                                              timeout_s=30.0)
            except Exception as e:       # noqa: BLE001 - the assertion below names it
                out["err"] = e
        t = threading.Thread(target=resend)
        t.start()
        time.sleep(0.5)                   # well past the old probes' end
        eps[1] = _worker_endpoint(rig, 0, 2 * 4096, secret)
        eps[1].retire(d, 0)
        t.join(60.0)
        assert not t.is_alive()
        assert "err" not in out, out
        assert out["rep"].closed_by_receiver, out["rep"]
    finally:
        for e in eps:
            e.close()


@pytest.mark.rig
@pytest.mark.parametrize("shared", [False, True], ids=["own-device", "mux-seat"])
def test_a_successor_takes_its_predecessors_place_at_once(rig, shared):
    """Endpoint(..., succeeds=old), a worker's room grown: its program is on
    the device (the old link updated, or written into the old seat) before
    the old endpoint closes, so at no moment does the device carry none;
    the old one's close leaves it there, and an answer too large for the old
    room arrives whole. A successor that cannot take the place (another
    port) is refused before its compile, the old endpoint still working;
    the successor's close frees the device."""
    from ltpx.control.transport import Endpoint, Peer
    from ltpx.dataplane.xdp import lookup, mux
    secret = tokens.bind(tokens.new_secret(), b"succession-run")
    h, port = rig.workers[0], 7499
    seat = {"port": port, "shared": True} if shared else {}
    ps = Endpoint(rig.ps.ifname, rig.ps.ip, {0: 0}, 30_000, ns=rig.ps.netns,
                  mode=rig.config.mode, job=JOB, secret=secret, publish=False, sender="socket")
    to = [Peer(0, h.ip, port) if shared else Peer(0, h.ip)]
    old = _worker_endpoint(rig, 0, 4096, secret, **seat)
    eps = [ps, old]
    try:
        def answered(ep, d, n):
            answer = np.random.default_rng(d).standard_normal(n).astype(np.float32)
            ep.expect(d, n, 0)
            ps.push_reliable(d, answer, to, timeout_s=10.0)
            return np.array_equal(ep.receive(d, timeout_s=10.0), answer)

        assert answered(old, 1, 1000)
        on_dev = lookup.xdp_on(h.ifname, h.netns)["prog_id"]
        link = None if shared else old.dp.link_id()
        with pytest.raises(ValueError, match="succeeds: that endpoint is on"):
            _worker_endpoint(rig, 0, 20_000, secret, succeeds=old, port=port + 1,
                             shared=not shared)
        assert lookup.xdp_on(h.ifname, h.netns)["prog_id"] == on_dev and answered(old, 2, 1000)
        new = _worker_endpoint(rig, 0, 20_000, secret, succeeds=old, **seat)
        eps.append(new)
        now = lookup.xdp_on(h.ifname, h.netns)["prog_id"]
        if shared:     # the mux stays, the seat (one, on the port) is this process's still
            assert now == on_dev and new.seat is not None and old.seat is None
            assert [(s["port"], s["pid"]) for s in mux.seats(h.ifname, h.netns)] == \
                [(port, os.getpid())]
        else:          # the same link, now running the new program
            assert now == lookup.prog_id(new.dp.prog_fd) != on_dev
            assert new.dp.link_id() == link and old.dp.attached is None
        old.close()
        eps.remove(old)
        assert lookup.xdp_on(h.ifname, h.netns)["prog_id"] == now
        assert answered(new, 3, 15_000)          # larger than the old room
        with pytest.raises(ValueError, match="holds no device"):
            _worker_endpoint(rig, 0, 20_000, secret, succeeds=old, **seat)
        new.close()
        eps.remove(new)
        assert lookup.xdp_on(h.ifname, h.netns) is None
    finally:
        for e in eps:
            e.close()


def _until(cond, s=10.0) -> bool:
    end = time.monotonic() + s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.002)
    return cond()


@pytest.mark.rig
def test_an_answer_streamed_in_parts_arrives_whole_and_signed(rig):
    """Three rounds' parts fed in turn, then the report and the signature:
    both workers end with the answer bit-exact and verified. A worker sees
    a round over (answered_from at the chunk where its part starts) only
    once that part was fed, never from an earlier part; the first part's
    chunks all arrive before the last round's are fed."""
    from ltpx.control.transport import Peer
    from ltpx.control.transport.stream import AnswerStream, answered_from
    from ltpx.dataplane.rig.star import BROADCAST
    from ltpx.dataplane.xdp import wire as W
    secret = tokens.bind(tokens.new_secret(), b"stream-run")
    sizes, report = (30_000, 25_001, 20_000), 77
    n = sum(sizes) + report
    d = 9
    eps = _endpoints(rig, n + SIG_ELEMS + 4096, secret)
    try:
        ps, wk = eps[0], eps[1:]
        for w, e in enumerate(wk):
            e.expect(d, n + SIG_ELEMS, w)
        answer = np.random.default_rng(40).standard_normal(n).astype(np.float32)
        buf = np.zeros(n + SIG_ELEMS, dtype=np.float32)
        ce = ps.sender.chunk_bytes // 4
        starts = np.cumsum((0,) + sizes[:-1]).tolist()
        stream = AnswerStream(ps, d, buf, [Peer(w, h.ip) for w, h in enumerate(rig.workers)],
                              group=(BROADCAST, W.PORT), timeout_s=30.0,
                              signer=StreamSigner(Signer(secret, JOB), d, n), share=0.5)
        try:
            for i, (lo, m) in enumerate(zip(starts, sizes)):
                assert not any(answered_from(e, d, lo // ce) for e in wk), i
                buf[lo:lo + m] = answer[lo:lo + m]   # round i summed: its part is final
                stream.feed(lo + m)
                assert _until(lambda lo=lo: all(answered_from(e, d, lo // ce) for e in wk)), i
                if i + 1 < len(sizes):   # the next round's part is not out
                    nxt = starts[i + 1] + sizes[i + 1]
                    assert not any(answered_from(e, d, -(-nxt // ce)) for e in wk), i
            first = (sizes[0] // ce)
            assert _until(lambda: all(e.maps.done_mask(d, 0, first).all() for e in wk))
            buf[:n] = answer                         # the report
            stream.finish()
        finally:
            stream.abort()
        assert stream.parts >= 2
        ver = Verifier(tokens.answer_pub(secret), JOB, b"stream-run")
        for e in wk:
            got = e.receive(d, timeout_s=30.0)
            assert np.array_equal(ver.check(d, got), answer)
    finally:
        for e in reversed(eps):
            e.close()


@pytest.mark.rig
def test_a_stream_to_a_silent_worker_stops_with_the_error(rig):
    """Worker 1 never opens the answer's round: the stream's part goes
    unacknowledged by it, and finish raises DeadPeerError naming it (the
    server then sends the answer whole to those still there)."""
    from ltpx.control.transport import Peer
    from ltpx.control.transport.stream import AnswerStream
    from ltpx.dataplane.rig.star import BROADCAST
    from ltpx.dataplane.xdp import wire as W
    from ltpx.errors import DeadPeerError
    secret = tokens.new_secret()
    n, d = 20_000, 3
    eps = _endpoints(rig, n + 4096, secret)
    try:
        ps, wk = eps[0], eps[1:]
        wk[0].expect(d, n, 0)                       # worker 1 does not
        buf = np.ones(n, dtype=np.float32)
        stream = AnswerStream(ps, d, buf, [Peer(w, h.ip) for w, h in enumerate(rig.workers)],
                              group=(BROADCAST, W.PORT), timeout_s=1.0)
        stream.feed(n // 2)
        with pytest.raises(DeadPeerError, match="worker 1") as e:
            stream.finish()
        assert [p.worker for p in e.value.peers] == [1]
    finally:
        for e in reversed(eps):
            e.close()


@pytest.mark.rig
@pytest.mark.slow
def test_ddp_with_buckets_in_many_rounds_trains_as_with_whole_answers(rig):
    """DDP over LTP with its buckets cut into rounds of 64 kB (LTP_BUCKET_MB),
    so each step's answer streams in parts, against the same job with every
    answer sent whole (LTP_STREAM_SHARE=0): replicas bit-identical in each,
    and the same final digest."""
    digests = {}
    for share in ("0.5", "0"):
        env = dict(os.environ, LTP_BUCKET_MB="0.0625", LTP_STREAM_SHARE=share)
        out = subprocess.run([str(BIN / "ltp"), "train", "--transport", "ddp-ltp", "--name", RIG,
                              "--workers", "2", "--iterations", "12", "--loss", "0", "-j"],
                             capture_output=True, text=True, timeout=400, cwd=ROOT, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        res = json.loads(out.stdout)
        assert res["replicas_identical"], res
        assert res["ltp"]["buckets"] < res["ltp"]["rounds"], res["ltp"]   # cut: rounds > buckets
        assert (res["streamed_answers"] > 0) == (share != "0"), res["streamed_answers"]
        digests[share] = res["ps_digest"]
    assert digests["0.5"] == digests["0"]
