# SPDX-License-Identifier: Apache-2.0
"""compress="uint8": the 8-bit min-max codec, its settings, and compressed jobs.

Unit tests of the codec (no privileges), a compressed job over TCP on
loopback (three real processes), and on a rig: a round whose one chunk is
lost, through the real XDP program and the server's real link, and
`ltp train --compress uint8` at 1 % loss.
"""
from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

from conftest import requires_bpf, star_rig
from ltp_cli import LTP
from ltpx.control.torchapi.codec import (MinMaxUInt8, ServerCodec, WorkerCodec, check_peer,
                                         make_codec)
from ltpx.control.torchapi.settings import Settings
from ltpx.errors import UsageError

CB = 1432                 # the LTP chunk at a 1500-byte MTU
Q = CB - 8                # elements per chunk


def roundtrip(x: np.ndarray, codec=None):
    """(decoded, words, residual) of x through encode and decode."""
    c = codec or MinMaxUInt8(CB)
    words = np.zeros(c.words(len(x)), dtype=np.float32)
    res = np.zeros_like(x)
    c.encode(x, words, residual=res)
    out = np.zeros((1, len(x)), dtype=np.float32)
    c.decode(words[None], len(x), out)
    return out[0], words, res


def chunk_scales(words: np.ndarray, n: int) -> np.ndarray:
    """Each element's chunk scale, read from the words (every chunk's second word)."""
    return np.repeat(words[1::CB // 4], Q)[:n]


# --------------------------------------------------------------------------- the codec

@pytest.mark.unit
@pytest.mark.parametrize("n", [1, 3, Q, Q + 1, 10_000])
@pytest.mark.parametrize("scale, shift", [(1.0, 0.0), (1e-6, 0.0), (1e4, 3e4), (1.0, -7.0)])
def test_every_element_is_within_half_a_step(n, scale, shift):
    x = (np.random.default_rng(n).standard_normal(n) * scale + shift).astype(np.float32)
    dec, words, res = roundtrip(x)
    s = chunk_scales(words, n)
    # half a step, and float32 rounding of base + code * scale
    ulp = np.spacing(np.abs(x).max() + np.abs(s).max() * 255)
    assert np.all(np.abs(dec - x) <= s / 2 + 2 * ulp)
    assert np.array_equal(res, x - dec)          # the residual is what rounding left out
    assert len(words) == MinMaxUInt8(CB).words(n) and len(words) * 4 < n + 8 * (n // Q + 1) + 4


@pytest.mark.unit
def test_constant_chunks_and_zeros_decode_exactly():
    x = np.full(3 * Q + 10, 0.3, dtype=np.float32)
    x[Q:2 * Q] = 0.0                              # a constant chunk of zeros
    x[2 * Q:2 * Q + 100] = np.linspace(-1, 2, 100, dtype=np.float32)
    x[2 * Q + 100:2 * Q + 200] = 0.0              # zeros inside a chunk spanning 0
    dec, words, _ = roundtrip(x)
    assert np.array_equal(dec[:2 * Q], x[:2 * Q]) and words[1] == 0.0
    assert np.all(dec[2 * Q + 100:2 * Q + 200] == 0.0)
    assert np.array_equal(dec[3 * Q:], x[3 * Q:])


@pytest.mark.unit
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_element_makes_its_own_chunk_nan_and_nothing_else(bad):
    x = np.random.default_rng(1).standard_normal(3 * Q).astype(np.float32)
    x[Q + 5] = bad
    dec, _, res = roundtrip(x)
    assert np.isnan(dec[Q:2 * Q]).all()
    assert np.isfinite(dec[:Q]).all() and np.isfinite(dec[2 * Q:]).all()
    assert np.all(res[Q:2 * Q] == 0.0)            # error feedback carries nothing of it


@pytest.mark.unit
def test_a_quarter_of_the_bytes_and_pieces_fill_whole_chunks():
    c = MinMaxUInt8(CB)
    n = 234_122                                   # the built-in job's gradient
    assert 3.9 < n / c.words(n) < 4.0
    assert c.words(5 * Q) == 5 * CB // 4          # whole pieces are whole LTP chunks
    with pytest.raises(ValueError):
        MinMaxUInt8(6)
    assert make_codec("none", CB) is None


@pytest.mark.unit
def test_server_and_worker_codecs_agree_on_the_wire():
    """A worker's piece, the server's decode, the answer with a raw tail and
    the worker's decode of it (error feedback on both sides)."""
    n, tail = 5000, 7
    x = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    wk, srv = WorkerCodec(CB), ServerCodec(CB)
    buf = x.copy()
    words = wk.piece(buf, "uint8").copy()
    assert srv.open(9, n, reliable=False, wire="uint8") == len(words)
    assert srv.open(10, n, reliable=True, wire="uint8") == n        # reliable: as it is
    assert srv.open(11, n, reliable=False, wire="none") == n        # a float32 step
    assert srv.compressed(9) is not None and srv.compressed(11) is None
    rows = srv.decode(9, np.stack([words, words]), np.ones((2, 4), bool), "mean")
    assert np.array_equal(rows[0], x - buf) and np.array_equal(rows[1], rows[0])
    answer = np.concatenate([rows[0], np.arange(tail, dtype=np.float32)])
    wire = srv.answer(answer)
    wk.expect(3, n, "uint8")
    assert wk.wire_elems(3, n + tail) == len(wire)
    out = np.zeros(n + tail, dtype=np.float32)
    wk.decode(3, wire, out)
    assert np.array_equal(out[n:], np.arange(tail)) and np.abs(out[:n] - rows[0]).max() < 0.02
    assert np.array_equal(srv.answer(answer), answer)   # no compressed round before it


@pytest.mark.unit
def test_bad_settings_are_refused_by_name(monkeypatch):
    with pytest.raises(UsageError, match="compress"):
        Settings.resolve({"compress": "int4"})
    monkeypatch.setenv("LTP_ERROR_FEEDBACK", "maybe")
    with pytest.raises(UsageError, match="LTP_ERROR_FEEDBACK"):
        Settings.resolve({})
    monkeypatch.setenv("LTP_ERROR_FEEDBACK", "0")
    monkeypatch.setenv("LTP_COMPRESS", "uint8")
    s = Settings.resolve({})
    assert (s.compress, s.error_feedback) == ("uint8", False)
    assert Settings.resolve({"compress": "none"}).compress == "none"
    monkeypatch.delenv("LTP_COMPRESS")
    assert Settings.resolve({}).compress == "auto"                 # the default
    check_peer("auto", CB, {"compress": "auto", "chunk_bytes": CB})
    with pytest.raises(UsageError, match="the server 'none'"):
        check_peer("uint8", CB, {"compress": "none", "chunk_bytes": CB})
    with pytest.raises(UsageError, match="mtu"):
        check_peer("uint8", CB, {"compress": "uint8", "chunk_bytes": 1424})
    # float32 over TCP: the chunk size is nobody's business; over LTP always
    check_peer("none", CB, {"compress": "none", "chunk_bytes": 1424})
    with pytest.raises(UsageError, match="mtu"):
        check_peer("none", CB, {"compress": "none", "chunk_bytes": 1424}, chunks=True)


# --------------------------------------------------------------------------- a job over TCP

@pytest.mark.root
@pytest.mark.slow
def test_compressed_tcp_job_keeps_replicas_identical_and_unused_gradients_zero(monkeypatch):
    from test_torch_api import run_local_job
    monkeypatch.setenv("LTP_COMPRESS", "uint8")
    res = run_local_job("set_to_none,unused")
    cases = [r["cases"] for r in res]
    for name in ("set_to_none", "unused"):
        assert len({c[name]["digest"] for c in cases}) == 1, name
    c = cases[0]
    assert c["set_to_none"]["last_loss"] < 0.7 * c["set_to_none"]["first_loss"]
    # 8-bit codes: close to the float32 run's result, not equal to it
    assert 1e-5 < c["set_to_none"]["max_diff_to_single"] < 0.05
    assert c["unused"]["never_unchanged"] and c["unused"]["never_grad_zero"]


# --------------------------------------------------------------------------- on a rig

RIG = f"hbc{os.getpid() % 100000}"
NEL = 6 * Q + 100         # 7 chunks of codes


@pytest.fixture(scope="module")
def rig():
    yield from star_rig(name=RIG, workers=2, buffer_bytes=2_000_000)


@pytest.mark.rig
@requires_bpf
def test_a_lost_chunk_changes_only_its_own_slice(rig):
    """Two workers' compressed pieces sent as DATA to the server's real XDP
    program, worker 0's chunk 3 never: the server's link decodes what
    arrived bit for bit and fills chunk 3's elements alone, with worker 1's
    decoded values (Bubble Filling "mean" over those that delivered)."""
    from ltpx.control.torchapi.link_ltp import LtpServerLink
    from ltpx.control.trust import tokens
    from ltpx.dataplane.xdp import wire as W
    s = Settings(dev=rig.ps.ifname, ip=rig.ps.ip, netns=rig.ps.netns,
                 xdp_mode=rig.config.mode, mtu=rig.config.mtu, compress="uint8", timeout=10)
    link = LtpServerLink(s, 2, None)
    socks = [rig.socket(h) for h in rig.workers]
    try:
        link.ensure(NEL)
        link.configure("mean", json.dumps({"threshold_min": 0.5, "threshold_max": 0.5,
                                           "grace_factor": 0.0, "min_deadline_s": 0.3,
                                           "hard_timeout_s": 5.0}), "uint8")
        r, lost = 5, 3
        link.open(r, NEL, [0, 1], reliable=False, key=("step", 0, NEL))
        rng = np.random.default_rng(4)
        grads = [rng.standard_normal(NEL).astype(np.float32) * (w + 1) for w in (0, 1)]
        codec = MinMaxUInt8(CB)
        words = [WorkerCodec(CB).piece(g.copy(), "uint8").copy() for g in grads]
        data = [w.tobytes() for w in words]
        nch = -(-len(data[0]) // CB)
        for w in (0, 1):
            for c in range(nch):
                if (w, c) == (0, lost):
                    continue
                body = data[w][c * CB:(c + 1) * CB]
                hdr = W.pack_header(worker=w, job=s.job, round=r, chunk=c, nchunks=nch,
                                    length=len(body),
                                    token=tokens.derive(link.secret, s.job, r, w, tokens.UP),
                                    flags=W.F_LAST if c == nch - 1 else 0)
                socks[w].sendto(hdr + body, (rig.ps.ip, W.PORT))
        g = link.gather(r, NEL, [0, 1])
    finally:
        for sk in socks:
            sk.close()
        link.close()
    assert g.masks[1].all() and g.masks[0].sum() == nch - 1 and not g.masks[0, lost]
    dec = np.zeros((2, NEL), dtype=np.float32)
    codec.decode(np.stack(words), NEL, dec)
    lo, hi = lost * Q, (lost + 1) * Q
    assert g.values.shape == (2, NEL) and g.chunk_elems == Q
    assert np.array_equal(g.values[1], dec[1])
    assert np.array_equal(g.values[0, :lo], dec[0, :lo])
    assert np.array_equal(g.values[0, hi:], dec[0, hi:])
    assert np.array_equal(g.values[0, lo:hi], dec[1, lo:hi])
    assert list(g.filled) == [1, 0]


@pytest.mark.rig
@requires_bpf
@pytest.mark.parametrize("kind", ["uint8", "bf16"])
def test_ltp_train_compressed_reaches_its_target_with_identical_replicas(kind):
    """`ltp train --compress uint8` (and bf16: codec.Half) at 1 % loss on
    every port: the built-in job reaches 90 % test accuracy and every
    replica ends bit-identical."""
    name = f"hbt{os.getpid() % 100000}"
    out = subprocess.run([LTP, "train", "--name", name,
                          "--workers", "2", "--epochs", "2", "--compress", kind,
                          "--loss", "0.01", "--target-accuracy", "0.9", "-j"],
                         capture_output=True, text=True, timeout=600)
    subprocess.run([LTP, "rig", "down", "--name", name], capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    assert r["compress"] == kind and r["replicas_identical"]
    assert r["final_accuracy"] >= 0.9 and r["time_to_target"]


def compressed_answer(srv: ServerCodec, n: int, tail: int) -> np.ndarray:
    """One compressed round gathered by srv, and the answer that follows it."""
    wk = WorkerCodec(CB)
    buf = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    words = wk.piece(buf, "uint8").copy()
    srv.open(4, n, reliable=False, wire="uint8")
    rows = srv.decode(4, words[None, :], np.ones((1, MinMaxUInt8(CB).chunks(n)), bool), "zero")
    return np.concatenate([rows[0], np.arange(tail, dtype=np.float32)])


@pytest.mark.unit
def test_a_retried_answer_goes_out_in_the_same_words():
    """server.answer_to sends an answer again when a worker was slow: the
    retry must be the compressed words the workers opened d for, not the raw
    floats, and error feedback must count it once."""
    n, tail = 5000, 7
    srv = ServerCodec(CB)
    answer = compressed_answer(srv, n, tail)
    first = srv.answer(answer, 11).copy()
    again = srv.answer(answer, 11)
    assert len(first) == MinMaxUInt8(CB).words(n) + tail < len(answer)
    assert np.array_equal(first.view(np.uint32), again.view(np.uint32))
    residual = srv.residual[("uint8", n)].copy()
    srv.answer(answer, 11)
    assert np.array_equal(srv.residual[("uint8", n)], residual)
    nxt = compressed_answer(srv, n, tail)   # the next answer is encoded afresh
    assert not np.shares_memory(srv.answer(nxt, 12), nxt) and srv.sent[0] == 12


@pytest.mark.root
@pytest.mark.slow
def test_tcp_server_link_sends_a_retried_answer_in_the_same_bytes():
    import socket
    import struct
    from ltpx.control.trust.hello import mac_hello
    from ltpx.control.torchapi.link_tcp import TcpServerLink
    n, tail = 5000, 7
    link = TcpServerLink(Settings.resolve({"compress": "uint8", "ip": "127.0.0.1",
                                           "timeout": 30}), 1)
    c = socket.create_connection(("127.0.0.1", link.port), timeout=10)
    try:
        c.sendall(mac_hello(0, None))      # worker 0's hello (a keyless job)
        link.connect({})
        link.codec.codec = MinMaxUInt8(CB)
        answer = compressed_answer(link.codec, n, tail)
        link.send(11, answer, group=False)
        link.send(11, answer, group=False)   # the retry
        f = c.makefile("rb")
        got = []
        for _ in range(2):
            magic, d, size = struct.unpack(">III", f.read(12))
            got.append((d, f.read(size)))
        assert got[0] == got[1] and got[0][0] == 11
        assert len(got[0][1]) == 4 * (MinMaxUInt8(CB).words(n) + tail)
    finally:
        c.close()
        link.close()
