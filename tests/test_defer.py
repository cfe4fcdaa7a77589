# SPDX-License-Identifier: Apache-2.0
"""Tolerant answers (control/transport/defer.py) without the kernel: the
verdict's bytes, the receiver's test and zeroing, and the server carrying
what an answer left out into the next one (torchapi/server.py). On the rig:
tests/test_transport.py (every worker agrees) and tests/test_train.py
(training with it)."""
from __future__ import annotations

import numpy as np
import pytest

from ltpx.control.transport import defer
from ltpx.errors import CommError, TransportError

CB = 1424
CE = CB // 4


@pytest.mark.unit
@pytest.mark.parametrize("data, sig", [(1, 0), (54, 64), (11_392 * 2, 64)])
def test_a_verdict_round_trips_through_its_chunks(data, sig):
    rng = np.random.default_rng(data)
    deferred = rng.random(data) < 0.3
    signature = rng.bytes(sig)
    raw = defer.encode(deferred, signature, CB)
    assert raw.shape == (defer.extra_chunks(data, CB, sig), CB)
    got, got_sig = defer.decode(raw, data)
    assert got.tolist() == deferred.tolist() and got_sig == signature
    # one chunk holds the header, the signature and the bitmap of 10,752 chunks (15 MB)
    assert defer.extra_chunks(10_752, CB, 64) == 1 and defer.extra_chunks(10_753, CB, 64) == 2


@pytest.mark.unit
def test_a_verdict_for_another_answer_or_garbled_is_refused():
    deferred = np.zeros(54, dtype=bool)
    deferred[[3, 9]] = True
    raw = defer.encode(deferred, b"", CB)
    with pytest.raises(TransportError, match="does not describe its 60 chunks"):
        defer.decode(raw, 60)
    bad = raw.copy()
    bad[0, 16] ^= 0x01                  # a bit of the bitmap flipped: the count disagrees
    with pytest.raises(TransportError, match="garbled"):
        defer.decode(bad, 54)
    with pytest.raises(TransportError, match="does not describe"):
        defer.decode(np.zeros((1, CB), dtype=np.uint8), 54)


@pytest.mark.unit
def test_a_tolerant_round_completes_once_the_verdict_and_what_it_keeps_are_in():
    data = 10
    plan = defer.Plan(data, defer.extra_chunks(data, CB))
    chunks = np.full((plan.nchunks, CB), 7, dtype=np.uint8)
    deferred = np.zeros(data, dtype=bool)
    deferred[[2, 5]] = True
    chunks[data:] = defer.encode(deferred, b"", CB)
    mask = np.ones(plan.nchunks, dtype=bool)
    mask[[2, 5]] = False                   # lost, and deferred
    mask[data] = False
    assert not plan.complete(mask, chunks)  # the verdict is not in yet
    mask[data] = True
    mask[7] = False                         # lost, not deferred: a worker waits for it
    assert not plan.complete(mask, chunks)
    mask[7] = True
    assert plan.complete(mask, chunks)
    assert plan.rebuild(chunks, mask) == 0
    assert not chunks[[2, 5]].any() and (chunks[[0, 1, 3, 4, 6, 7, 8, 9]] == 7).all()


@pytest.mark.unit
def test_the_answer_as_used_has_its_deferred_chunks_zero():
    buf = np.arange(3 * CE - 10, dtype=np.float32) + 1     # 3 chunks, the last short
    deferred = np.array([False, False, True])
    used = defer.zeroed(buf, deferred, CE)
    assert not used[2 * CE:].any() and (used[:2 * CE] == buf[:2 * CE]).all()
    assert buf.all()                                        # a copy: buf unchanged


def _server(answer_elems: int):
    from ltpx.control.torchapi.server import Server
    srv = Server.__new__(Server)           # carry_in/out read only these
    srv.answer = np.zeros(answer_elems, dtype=np.float32)
    srv.carry = None
    srv.deferral = dict.fromkeys(("answers", "values", "dropped"), 0)
    return srv


@pytest.mark.unit
def test_the_server_carries_what_an_answer_left_out_into_the_next_of_its_shape():
    from ltpx.control.torchapi.ops import STEP, Op
    op = Op(kind=STEP, sizes=(6, 4))
    srv = _server(10 + 3)                  # 10 aggregate elements, then the report
    srv.answer[:] = np.arange(1, 14)
    left = np.zeros(13, dtype=bool)
    left[[1, 2, 8]] = True
    srv.carry_out(op, left)
    assert srv.deferral == {"answers": 1, "values": 3, "dropped": 0}
    srv.answer[:] = 100                    # the next step's aggregate and report
    srv.carry_in(op)
    want = np.full(13, 100.0)
    want[[1, 2, 8]] += [2, 3, 9]           # applied a step late, the report untouched
    assert srv.answer.tolist() == want.tolist() and srv.carry is None
    srv.carry_out(op, np.zeros(13, dtype=bool))     # nothing left out: nothing carried
    assert srv.carry is None


@pytest.mark.unit
def test_a_carry_the_next_answer_cannot_take_is_dropped_and_counted():
    from ltpx.control.torchapi.ops import STEP, Op
    srv = _server(10)
    srv.answer[:] = 5
    srv.carry_out(Op(kind=STEP, sizes=(10,)), np.arange(10) < 4)
    srv.carry_in(Op(kind=STEP, sizes=(4, 6)))        # another shape
    assert srv.deferral["dropped"] == 4 and srv.carry is None
    assert (srv.answer == 5).all()


@pytest.mark.unit
@pytest.mark.parametrize("given", [{"compress": "uint8"}, {"downlink_code": "rs"}])
def test_a_deferred_downlink_refuses_what_it_cannot_leave_out(given):
    from ltpx.control.torchapi.link_ltp import LtpServerLink
    from ltpx.control.torchapi.settings import Settings
    s = Settings(loss_policy="defer", **given)
    with pytest.raises(CommError, match="loss_policy defer needs compress none"):
        LtpServerLink(s, 2, None)
