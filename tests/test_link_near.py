# SPDX-License-Identifier: Apache-2.0
"""The LTP links' way to a worker whose frames never reach a NIC
(control/torchapi/link_ltp_near.py): a co-located trainer's own slice, and
another trainer's on the same host.

Real sockets and the real in-memory pair; the rounds that also come over
XDP are tested on the rig (test_ddp_backend.py: co-located trainers sharing
one device, bit-identical to gloo).
"""
from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from ltpx.control.torchapi import link_ltp_near as near
from ltpx.control.torchapi import localsock
from ltpx.control.torchapi.handoff import proc
from ltpx.control.torchapi.link_tcp_worker import HDR, TCP_MAGIC
from ltpx.control.trust import jobkey
from ltpx.errors import CommError

pytestmark = pytest.mark.unit


def _channel():
    a, b = socket.socketpair()
    return near.SockChannel(a, 0), near.SockChannel(b, 0)


def test_a_piece_over_the_local_socket_arrives_whole_into_place_and_in_step():
    worker, server = _channel()
    body = np.arange(300_000, dtype=np.float32)         # more than a socket holds
    row = np.zeros(300_000, dtype=np.float32)
    t = threading.Thread(target=worker.up.give, args=(7, near.as_bytes(body), 10.0))
    t.start()
    server.up.take(7, near.as_bytes(row), 10.0)
    t.join(10)
    assert np.array_equal(row, body)
    # the answer back, then a piece out of step: refused, naming both
    server.down.give(8, near.as_bytes(body[:10]), 10.0)
    into = np.zeros(10, dtype=np.float32)
    worker.down.take(8, near.as_bytes(into), 10.0)
    assert np.array_equal(into, body[:10])
    worker.up.give(9, near.as_bytes(body[:10]), 10.0)
    with pytest.raises(CommError, match="9 of 40 bytes given where 10 of 40 was expected"):
        server.up.take(10, near.as_bytes(into), 10.0)
    # out of step is the end of it, on both sides
    with pytest.raises(CommError, match="out of step"):
        server.down.give(11, near.as_bytes(into), 2.0)
    with pytest.raises(CommError, match="closed by the peer|reset by peer"):
        worker.down.take(11, near.as_bytes(into), 2.0)
    worker.close("test")


def test_a_silent_local_worker_is_a_comm_error_within_the_wait():
    worker, server = _channel()
    with pytest.raises(CommError, match="pieces to the server on its host: 3"):
        server.up.take(3, near.as_bytes(np.zeros(4, dtype=np.float32)), 0.2)
    worker.close("test")
    server.close("test")


def test_rows_of_a_round_from_the_near_workers_alone_in_the_workers_order(tmp_path,
                                                                         monkeypatch):
    """Workers 0 (in this process) and 2 (on this host, by the Unix socket,
    its hello MAC'd under the job key); worker 1 over the wire, absent from
    this round: the rows come in the workers' order, whole, with arrival
    stamps, and the answer goes back to each."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    key = jobkey.hello_key(jobkey.new_key(), b"run-1")
    rows = NearRowsHere(key)
    metas = {0: {"proc": proc(), "host": "h", **localsock.here()},
             1: {"proc": proc(), "host": "h", "netns_id": 1},   # this process, another netns

             2: {"proc": "elsewhere", "host": "h", **localsock.here()}}
    server = {"ip": "198.18.9.1", "ltp_port": 9410, **rows.address()}
    got = {}
    t = threading.Thread(target=lambda: got.update(   # as from another process
        w2=near.worker_pair(dict(server, proc="elsewhere"), 2, "h", key, 10.0)))
    t.start()
    rows.connect(metas, [0, 1, 2], 10.0)
    t.join(10)
    w0 = near.worker_pair(server, 0, "h", key, 10.0)
    assert near.worker_pair(dict(server, proc="x", host="other"), 1, "h", key, 1.0) is None
    assert near.worker_pair(dict(server, netns_id=1), 1, "h", key, 1.0) is None
    # another machine of the same name (every root namespace has one inode) is not this one
    assert near.worker_pair(dict(server, proc="x", boot="another"), 1, "h", key, 1.0) is None
    assert sorted(rows.pairs) == [0, 2] and rows.far([0, 1, 2]) == [1]
    n = 1000
    rows.opened(5, n, wired=False)
    a, b = np.full(n, 1.5, dtype=np.float32), np.full(n, -2.0, dtype=np.float32)
    beats = []
    rows.beat = lambda: beats.append(1)   # the endpoint kept ACKing while a row is awaited
    t = threading.Thread(target=lambda: (threading.Event().wait(0.6),
                                         got["w2"].up.give(5, near.as_bytes(b), 10.0)))
    t.start()
    w0.up.give(5, near.as_bytes(a), 10.0)
    g = rows.gather(5, [0, 2], None, 356, 10.0)
    t.join(10)
    assert len(beats) >= 2
    assert g.workers == [0, 2] and g.reason == "complete" and g.chunks == 3
    assert np.array_equal(g.values, np.stack([a, b])) and g.masks.all()
    assert (g.arrivals.first_ns > 0).all() and list(g.delivered) == [3, 3]
    wait = rows.give(6, a[:7], [0, 2], 10.0)
    for p in (w0, got["w2"]):
        into = np.zeros(7, dtype=np.float32)
        p.down.take(6, near.as_bytes(into), 10.0)
        assert np.array_equal(into, a[:7])
    wait()
    # a retried answer (a far worker was slow) is not given again to those that took it
    assert rows.give(6, a[:7], [0, 2], 10.0) is None
    assert not got["w2"].down.ready(0.3) and not w0.down.ready(0.0)
    rows.close()
    with pytest.raises(CommError):
        w0.down.take(7, near.as_bytes(np.zeros(1, dtype=np.float32)), 1.0)


def NearRowsHere(key):   # noqa: N802 - a NearRows on host "h"
    return near.NearRows("198.18.9.1", 9410, "h", key)


def test_a_worker_on_the_host_with_a_wrong_key_is_not_taken(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    key = jobkey.hello_key(jobkey.new_key(), b"run-1")
    rows = NearRowsHere(key)
    server = {"ip": "198.18.9.1", "ltp_port": 9410, **rows.address()}
    stranger = jobkey.hello_key(jobkey.new_key(), b"run-1")
    t = threading.Thread(target=lambda: near.worker_pair(dict(server, proc="elsewhere"), 2,
                                                         "h", stranger, 5.0))
    t.start()
    with pytest.raises(CommError, match="only 0 of the 1 workers on this host"):
        rows.connect({2: {"proc": "x", "host": "h", **localsock.here()}}, [2], 1.0)
    t.join(10)
    rows.close()


def _far_round(r: int, n: int, ce: int, worker: int, value: float, threshold: float):
    """The XDP round's result as the receiver hands it over: one far
    worker's row, whole (transport/results.py)."""
    from ltpx.control.transport.layout import ChunkLayout
    from ltpx.control.transport.results import RoundResult
    nch = -(-n // ce)
    return RoundResult(round=r, reason="complete", duration_s=0.01, active_s=0.01,
                       workers=[worker], layout=ChunkLayout(n, ce * 4),
                       values=np.full((1, n), value, dtype=np.float32),
                       masks=np.ones((1, nch), dtype=bool), filled=np.zeros(1, dtype=np.int64),
                       threshold=threshold, deadline_s=0.3)


def _near_rows(kind: str):
    """(worker 0's end, a NearRows whose near worker 0 it is): by the local
    socket, or in memory (one process)."""
    from ltpx.control.torchapi.handoff import Pair
    if kind == "memory":
        pair = Pair(("198.18.9.1", 9410, 0))
        worker_end, server_end = pair, pair
    else:
        worker_end, server_end = _channel()
    rows = NearRowsHere(None)
    rows.pairs = {0: server_end}
    return worker_end, rows


@pytest.mark.parametrize("kind", ["memory", "socket"])
def test_a_late_local_row_is_left_out_as_a_far_straggler_is_and_let_go_after(kind):
    """A tolerant round: the far worker's row is in; the local worker's comes
    past a deadline after it, so the round goes on without it (its row
    Bubble-Filled from the far one's, counted as filled) and its late piece
    is let go as it comes; the next round's then arrives whole. A
    round that closes only whole (threshold 1.0) waits for it instead."""
    worker_end, rows = _near_rows(kind)
    n, ce = 700, 356
    rows.opened(3, n, wired=True, reliable=False)
    g = rows.gather(3, [0, 1], _far_round(3, n, ce, 1, 2.0, 0.9), ce, 30.0, fill="mean")
    assert g.workers == [0, 1] and list(g.delivered) == [0, 2] and list(g.filled) == [2, 0]
    assert np.array_equal(g.values[0], np.full(n, 2.0, np.float32))    # the mean of the rest
    late = np.full(n, 9.0, dtype=np.float32)
    worker_end.up.give(3, near.as_bytes(late[:100]), 10.0)   # round 3's piece, too late
    on_time = np.full(n, 5.0, dtype=np.float32)
    worker_end.up.give(4, near.as_bytes(on_time), 10.0)
    rows.opened(4, n, wired=True, reliable=False)
    g = rows.gather(4, [0, 1], _far_round(4, n, ce, 1, 1.0, 0.9), ce, 30.0, fill="mean")
    assert list(g.delivered) == [2, 2] and np.array_equal(g.values[0], on_time)
    # a round that closes only whole: the local row is awaited past the deadline
    t = threading.Thread(target=lambda: (threading.Event().wait(0.8),
                                         worker_end.up.give(5, near.as_bytes(on_time), 10.0)))
    t.start()
    rows.opened(5, n, wired=True, reliable=False)
    g = rows.gather(5, [0, 1], _far_round(5, n, ce, 1, 1.0, 1.0), ce, 30.0, fill="mean")
    t.join(10)
    assert list(g.delivered) == [2, 2] and np.array_equal(g.values[0], on_time)
    rows.close()


def test_a_local_piece_begun_before_a_soft_deadline_is_taken_whole_after_it():
    """A tolerant round (deadline 0.3 s): the local worker's piece has begun
    (its header is in) but its body comes 0.8 s later, as on a busy host.
    The row is taken whole, not cut short at the deadline (which ended the
    stream and the server: a 4 x 2 run on two busy cores), and the next
    round's piece follows in step."""
    worker_end, rows = _near_rows("socket")
    n, ce = 700, 356
    body = np.full(n, 7.0, dtype=np.float32)
    raw = near.as_bytes(body)
    worker_end.sock.sendall(HDR.pack(TCP_MAGIC, 6, len(raw)))
    t = threading.Thread(target=lambda: (threading.Event().wait(0.8),
                                         worker_end.sock.sendall(raw)))
    t.start()
    rows.opened(6, n, wired=True, reliable=False)
    g = rows.gather(6, [0, 1], _far_round(6, n, ce, 1, 1.0, 0.9), ce, 30.0, fill="mean")
    t.join(10)
    assert list(g.delivered) == [2, 2] and np.array_equal(g.values[0], body)
    worker_end.up.give(7, near.as_bytes(body + 1), 10.0)
    rows.opened(7, n, wired=True, reliable=False)
    g = rows.gather(7, [0, 1], _far_round(7, n, ce, 1, 1.0, 0.9), ce, 30.0, fill="mean")
    assert list(g.delivered) == [2, 2] and np.array_equal(g.values[0], body + 1)
    rows.close()


def _taken_whole(worker_end, rows, r: int, n: int, ce: int) -> None:
    """Round r's local piece, given as the round is gathered, is its row, whole."""
    on_time = np.full(n, 5.0, dtype=np.float32)
    t = threading.Thread(target=worker_end.up.give, args=(r, near.as_bytes(on_time), 10.0))
    t.start()
    rows.opened(r, n, wired=True, reliable=False)
    g = rows.gather(r, [0, 1], _far_round(r, n, ce, 1, 1.0, 0.9), ce, 30.0, fill="mean")
    t.join(10)
    assert list(g.delivered) == [-(-n // ce)] * 2 and np.array_equal(g.values[0], on_time)


@pytest.mark.parametrize("kind", ["memory", "socket"])
def test_a_large_late_local_piece_is_let_go_as_it_comes_so_its_worker_goes_on(kind):
    """A local row left out of a tolerant round whose piece, larger than a
    socket holds (or lent, in memory), comes after: its give returns without
    another take, as the server lets it go as it comes (its worker's next op
    waits for that give while the server waits for the worker: a 4 x 2 run
    hung so until the round's timeout), and the next round's piece is taken."""
    worker_end, rows = _near_rows(kind)
    n, ce = 300_000, 356
    rows.opened(3, n, wired=True, reliable=False)
    g = rows.gather(3, [0, 1], _far_round(3, n, ce, 1, 2.0, 0.9), ce, 30.0, fill="mean")
    assert list(g.filled) == [-(-n // ce), 0]
    late = np.full(n, 9.0, dtype=np.float32)
    t = threading.Thread(target=worker_end.up.give, args=(3, near.as_bytes(late), 10.0))
    t.start()
    t.join(8)
    assert not t.is_alive(), "the late piece's give waits for a take"
    _taken_whole(worker_end, rows, 4, n, ce)
    rows.close()


def test_two_rows_left_out_in_a_row_are_both_let_go_as_they_come():
    """A worker late for two tolerant rounds running: the drain started for
    the first lets go the second's piece too (its target raised while it is
    live); both gives return with no take, and the third round is taken."""
    worker_end, rows = _near_rows("socket")
    n, ce = 300_000, 356
    for r in (3, 4):
        rows.opened(r, n, wired=True, reliable=False)
        g = rows.gather(r, [0, 1], _far_round(r, n, ce, 1, 2.0, 0.9), ce, 30.0, fill="mean")
        assert list(g.filled) == [-(-n // ce), 0], r
    late = np.full(n, 9.0, dtype=np.float32)
    for r in (3, 4):
        t = threading.Thread(target=worker_end.up.give, args=(r, near.as_bytes(late), 10.0))
        t.start()
        t.join(8)
        assert not t.is_alive(), f"round {r}'s late piece waits for a take"
    _taken_whole(worker_end, rows, 5, n, ce)
    rows.close()


def test_a_take_waits_past_the_deadline_while_the_last_late_piece_is_read():
    """A row left out, its piece coming slowly (header in, body 0.6 s
    later, past the next round's 0.3 s deadline) with the next round's
    piece right behind it: the next take waits while that piece is being
    let go and takes its own, not leaving the worker out of every round
    after (which dropped it after 3 steps)."""
    worker_end, rows = _near_rows("socket")
    n, ce = 700, 356
    rows.opened(3, n, wired=True, reliable=False)
    g = rows.gather(3, [0, 1], _far_round(3, n, ce, 1, 2.0, 0.9), ce, 30.0, fill="mean")
    assert list(g.filled) == [2, 0]
    late, on_time = np.full(n, 9.0, dtype=np.float32), np.full(n, 5.0, dtype=np.float32)
    worker_end.sock.sendall(HDR.pack(TCP_MAGIC, 3, len(near.as_bytes(late))))
    t = threading.Thread(target=lambda: (threading.Event().wait(0.6),
                                         worker_end.sock.sendall(near.as_bytes(late)),
                                         worker_end.up.give(4, near.as_bytes(on_time), 10.0)))
    t.start()
    threading.Event().wait(0.1)          # the drain has the header: mid-piece
    rows.opened(4, n, wired=True, reliable=False)
    g = rows.gather(4, [0, 1], _far_round(4, n, ce, 1, 1.0, 0.9), ce, 30.0, fill="mean")
    t.join(10)
    assert list(g.delivered) == [2, 2] and np.array_equal(g.values[0], on_time)
    rows.close()


def test_a_local_worker_whose_socket_ended_is_missing_from_tolerant_rounds_only():
    """Its trainer died (the server serves on, childserver.py): in a tolerant
    round its row is missing, as a dead far worker's is, and no answer is
    given to it, while the far worker's is; a round that must be whole
    (reliable) still says the socket ended."""
    worker_end, rows = _near_rows("socket")
    n, ce = 700, 356
    worker_end.close("the trainer")               # as its process's death does
    rows.opened(3, n, wired=True, reliable=False)
    g = rows.gather(3, [0, 1], _far_round(3, n, ce, 1, 2.0, 1.0), ce, 30.0, fill="mean")
    assert g.workers == [0, 1] and list(g.delivered) == [0, 2] and list(g.filled) == [2, 0]
    assert 0 not in rows.live                     # nothing left to let go
    assert rows.give(3, np.zeros(4, np.float32), [0], 5.0) is None   # nobody to answer
    rows.opened(4, n, wired=True, reliable=True)
    with pytest.raises(CommError, match="closed"):
        rows.gather(4, [0, 1], _far_round(4, n, ce, 1, 2.0, 1.0), ce, 30.0)
    rows.close()
