# SPDX-License-Identifier: Apache-2.0
"""One key file, many runs: what the key derives is bound to the run (issue 39).

Reusing one job key across runs is the documented setup, and rounds restart
at 0 every run. So every store value signature, round token, answer
signature and TCP hello covers the run's id (control/trust/jobkey.py says where
it comes from), and each kind recorded in run A is refused in run B under
the same key: a value with a StoreValueError, a hello as a stray, an answer
with ForgedAnswerError, a frame as bad_token (tests/test_xdp_trust.py runs
that one through the XDP program). Real stores and sockets, no mocks.
"""
from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from ltpx.control.trust import jobkey
from ltpx.control.accept import accept_workers
from ltpx.control.trust.hello import MAC_HELLO, mac_hello, mac_parser
from ltpx.control.torchapi import storevalues
from ltpx.control.trust import sealing
from ltpx.control.torchapi.coord import KEY, Coord
from ltpx.control.torchapi.job import agree_run
from ltpx.control.launcher.storehost import loopback_store
from ltpx.control.trust import signing, tokens
from ltpx.errors import UsageError

A, B = b"run-a", b"run-b"
JOB = 0x7472


@pytest.fixture
def store():
    return loopback_store(30.0)


@pytest.mark.unit
def test_a_store_value_of_an_earlier_run_is_refused(store):
    """Run A's floor (the server's) and a state (its donor's) copied into
    run B's store, same key: both refused; run B's own are taken."""
    key = jobkey.new_key()
    srv_a = Coord(store, 3, 5.0, key=jobkey.store_auth(key, None, A))
    w0_a = Coord(store, 3, 5.0, key=jobkey.store_auth(jobkey.member_keys(key, 0), 0, A))
    srv_a.put("floor", "7")
    w0_a.put("sync/1", b"run A's model")
    recorded = {k: store.get(KEY + k) for k in ("floor", "sync/1")}
    srv_b = Coord(store, 3, 5.0, key=jobkey.store_auth(key, None, B))
    for name, raw in recorded.items():
        with pytest.raises(sealing.StoreValueError, match=f"store key {KEY}{name}: the value's "
                           "signature is not .* in this run: .*replayed from an earlier run"):
            srv_b.seal.open(KEY + name, raw)
    srv_b.put("floor", "9")
    assert srv_b.take("floor", storevalues.text_int(0, 99, "floor")) == 9
    assert srv_a.seal.open(KEY + "floor", recorded["floor"]) == b"7"   # in its own run


@pytest.mark.unit
def test_a_hello_of_an_earlier_run_is_a_stray():
    """A worker's hello recorded in run A (its member file's key) says
    nothing in run B: the server counts it a stray and takes the run-B
    hello of the same worker."""
    key = jobkey.new_key()
    own = jobkey.hello_key(jobkey.member_keys(key, 0))
    recorded = mac_hello(0, own._replace(run=A))
    assert recorded == mac_hello(0, jobkey.hello_key(key, A))     # the server's view agrees
    ls = socket.create_server(("127.0.0.1", 0))
    out = {}
    t = threading.Thread(target=lambda: out.update(got=accept_workers(
        ls, 1, MAC_HELLO.size, mac_parser([0], jobkey.hello_key(key, B)), 10.0)))
    t.start()
    socks = [socket.create_connection(ls.getsockname()) for _ in range(2)]
    try:
        socks[0].sendall(recorded)
        socks[1].sendall(mac_hello(0, own._replace(run=B)))
        t.join(10)
        got = out["got"]
        assert list(got.conns) == [0] and got.strays == 1
    finally:
        for s in socks:
            s.close()
        ls.close()
        for c in (out["got"].conns.values() if "got" in out else ()):
            c.close()


@pytest.mark.unit
def test_a_signed_answer_of_an_earlier_run_is_refused():
    secret = jobkey.token_secret(jobkey.new_key())
    m = tokens.member(secret, 0)
    buf = np.arange(100, dtype=np.float32)
    recorded = signing.Signer(tokens.bind(secret, A), JOB).sign(5, buf)
    with pytest.raises(signing.ForgedAnswerError, match="replay of an earlier run"):
        signing.Verifier(m.server_pub, JOB, B).check(5, recorded)
    fresh = signing.Signer(tokens.bind(secret, B), JOB).sign(5, buf)
    assert np.array_equal(signing.Verifier(m.server_pub, JOB, B).check(5, fresh), buf)


@pytest.mark.unit
def test_tokens_differ_per_run_and_agree_between_server_and_member():
    key = jobkey.new_key()
    for run in (b"", A, B):
        srv = tokens.RoundTokens(jobkey.token_secret(key, 0, run), JOB)
        w = tokens.RoundTokens(jobkey.token_secret(jobkey.member_keys(key, 3), 0, run), JOB,
                               self_id=3)
        assert w.send(4, 3) == srv.receive(4, 3) and w.receive(4, 3) == srv.send(4, 3)
    ups = {run: tokens.derive(jobkey.token_secret(key, 0, run), JOB, 4, 3) for run in (A, B)}
    assert ups[A] != ups[B]
    assert "run" in repr(jobkey.token_secret(key, 0, A)) and key.hex() not in \
        repr(jobkey.token_secret(key, 0, A))


@pytest.mark.unit
def test_the_run_id_comes_from_the_environment_or_rank_zero(store, monkeypatch):
    """LTP_RUN_ID, else torchrun's run id (not its default "none"), else
    rank 0 draws one; the others take rank 0's from the store, the
    server's only, and one given another id stops naming both; a bad one
    is a usage error naming the variable."""
    from ltpx.control.torchapi.settings import Settings
    assert Settings.resolve({}, {"LTP_RUN_ID": "abc"}).run_id == "abc"
    assert jobkey.given_run("abc", {"TORCHELASTIC_RUN_ID": "x"}) == b"abc"
    assert jobkey.given_run(None, {"TORCHELASTIC_RUN_ID": "job-17"}) == b"job-17"
    assert jobkey.given_run(None, {"TORCHELASTIC_RUN_ID": "none"}) is None
    for bad in ("x" * 129, "tab\there"):
        with pytest.raises(UsageError, match=r"run_id \(LTP_RUN_ID\)=.*printable ASCII"):
            jobkey.given_run(bad, {})
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    key = jobkey.new_key()
    run = agree_run(store, key, 0, None, 1, 5.0)
    assert len(run) == 16 and agree_run(store, jobkey.member_keys(key, 0), 1, 0, 1, 5.0) == run
    w1 = sealing.Seal(jobkey.store_auth(jobkey.member_keys(key, 1)), prefix=KEY)
    store.set(KEY + "run", w1.seal(KEY + "run", b"chosen-by-worker-1"))
    with pytest.raises(sealing.StoreValueError, match="written by worker 1, who may not"):
        agree_run(store, jobkey.member_keys(key, 0), 1, 0, 1, 5.0)
    assert agree_run(store, key, 0, None, 1, 5.0, "given") == b"given"
    assert agree_run(store, jobkey.member_keys(key, 0), 1, 0, 1, 5.0, "given") == b"given"
    with pytest.raises(UsageError, match="this rank's run id is 'other', rank 0's 'given'"):
        agree_run(store, jobkey.member_keys(key, 0), 1, 0, 1, 5.0, "other")
