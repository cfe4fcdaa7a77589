# SPDX-License-Identifier: Apache-2.0
"""The TCP server link's large pieces (link_tcp.py): a round or an answer of
PARALLEL_BYTES or more moves on a thread per worker, a smaller one in the
epoll loop (LTP_TCP_THREADS=0: always the loop). Real sockets on loopback:
every byte arrives in place both ways, a worker that sends a wrong header
fails the call with its name, the other worker's thread stopped, and one
that hangs up mid-piece is gone: a tolerant round goes on without it, one
that must be whole fails."""
from __future__ import annotations

import socket

import numpy as np
import pytest

from ltpx.control.torchapi.link_tcp import HDR, PARALLEL_BYTES, TCP_MAGIC
from ltpx.errors import CommError
from tcp_links import again, in_threads, pair

pytestmark = pytest.mark.unit

N = PARALLEL_BYTES // 4 * 3 + 5       # elements: a few MB, more than a socket buffer holds


@pytest.fixture(params=["1", "0"], ids=["threads", "epoll"])
def mode(request, monkeypatch):
    monkeypatch.setenv("LTP_TCP_THREADS", request.param)
    return request.param


def push_ones(workers, r: int):
    """Every worker pushes round r (N ones) on a thread of its own: the threads."""
    ts, _ = in_threads(*[lambda w=w: workers[w].push(r, np.ones(N, np.float32), False)
                         for w in range(2)])
    return ts


def gather_one_with_two_ahead(server, workers) -> None:
    """Round 1 gathered with round 2 named ahead: round 2's read starts."""
    server.ensure(N)
    server.ahead(2, N, [0, 1])
    ts = push_ones(workers, 1)
    server.gather(1, N, [0, 1])
    for t in ts:
        t.join()


@pytest.mark.parametrize("threads", ["1", "0"])
def test_a_large_round_and_its_answer_arrive_whole_both_ways(monkeypatch, threads):
    monkeypatch.setenv("LTP_TCP_THREADS", threads)
    with pair() as (server, workers):
        rows = [np.arange(N, dtype=np.float32) * (w + 1) + w for w in range(2)]
        server.ensure(N)
        server.open(1, N, [0, 1], False)
        ts, errors = in_threads(*[lambda w=w: workers[w].push(1, rows[w].copy(), False)
                                  for w in range(2)])
        got = server.gather(1, N, [0, 1])
        for t in ts:
            t.join()
        assert not errors
        assert np.array_equal(got.values[0], rows[0]) and np.array_equal(got.values[1], rows[1])
        answer = got.values.sum(axis=0)
        outs = [np.zeros(N, np.float32) for _ in range(2)]
        ts, errors = in_threads(*[lambda w=w: workers[w].pull(2, outs[w]) for w in range(2)])
        server.send(2, answer, False)
        for t in ts:
            t.join()
        assert not errors
        assert all(np.array_equal(o, answer) for o in outs)
        assert (server.pool is not None) == (threads == "1")   # the threads were used, or not


def test_a_wrong_header_in_a_large_round_fails_naming_the_worker(mode):
    with pair() as (server, workers):
        server.ensure(N)
        body = np.ones(N, np.float32)
        ts, _ = in_threads(lambda: workers[0].push(1, body.copy(), False),
                           lambda: workers[1].sock.sendall(HDR.pack(TCP_MAGIC, 7, N * 4)))
        with pytest.raises(CommError, match=r"worker 1: bad header \(round 7"):
            server.gather(1, N, [0, 1])
    for t in ts:
        t.join(5)


def test_a_worker_that_hangs_up_mid_round_fails_the_gather_not_hangs_it(mode):
    with pair() as (server, workers):
        server.ensure(N)
        server.open(1, N, [0, 1], True)
        w1 = workers[1].sock
        w1.sendall(HDR.pack(TCP_MAGIC, 1, N * 4) + b"\0" * 4096)
        w1.shutdown(socket.SHUT_RDWR)
        # worker 0 sends nothing: its thread is stopped once worker 1's fails
        with pytest.raises(CommError, match=r"round 1 must be whole, and worker\(s\) \[1\] "
                           "closed their connection"):
            server.gather(1, N, [0, 1])


def test_a_dead_workers_rows_of_a_tolerant_round_are_filled_and_it_gets_no_answer(mode):
    """A worker's connection ends (it died) in a tolerant round: the round
    is gathered from the others, its rows filled with their mean (Bubble
    Filling, as a dead worker's over LTP) and counted filled, not
    delivered; the answer goes to the others, and the next round is read
    from them alone."""
    with pair(workers=3) as (server, workers):
        server.ensure(N)
        server.open(1, N, [0, 1, 2], False)
        w2 = workers[2].sock
        w2.sendall(HDR.pack(TCP_MAGIC, 1, N * 4) + b"\7" * 4096)   # half a round, then gone
        w2.shutdown(socket.SHUT_RDWR)
        rows = [np.full(N, w + 1, np.float32) for w in range(2)]
        ts, errors = in_threads(*[lambda w=w: workers[w].push(1, rows[w].copy(), False)
                                  for w in range(2)])
        got = server.gather(1, N, [0, 1, 2])
        for t in ts:
            t.join()
        assert not errors and server.gone == {2}
        assert got.delivered.tolist() == [1, 1, 0] and got.filled.tolist() == [0, 0, 1]
        assert got.reason == "early"
        assert np.array_equal(got.values[0], rows[0]) and np.array_equal(got.values[1], rows[1])
        assert np.array_equal(got.values[2], np.full(N, 1.5, np.float32))   # their mean
        outs = [np.zeros(N, np.float32) for _ in range(2)]
        ts, errors = in_threads(*[lambda w=w: workers[w].pull(2, outs[w]) for w in range(2)])
        server.send(2, np.full(N, 3, np.float32), False)
        for t in ts:
            t.join()
        assert not errors and all(np.array_equal(o, np.full(N, 3, np.float32)) for o in outs)
        assert server.conns[2].fileno() != -1
        server.ensure(N)                          # the next op: its dead connection is closed
        assert server.conns[2].fileno() == -1 and server.conns[0].fileno() != -1
        server.open(3, N, [0, 1, 2], False)
        ts, errors = in_threads(*[lambda w=w: workers[w].push(3, rows[w] * 2, False)
                                  for w in range(2)])
        again = server.gather(3, N, [0, 1, 2])
        for t in ts:
            t.join()
        assert not errors and again.delivered.tolist() == [1, 1, 0]
        assert np.array_equal(again.values[2], np.full(N, 3, np.float32))
        server.open(4, N, [0, 1, 2], True)        # a round that must be whole cannot be
        ts, _ = in_threads(*[lambda w=w: workers[w].push(4, rows[w].copy(), True)
                             for w in range(2)])
        with pytest.raises(CommError, match=r"round 4 must be whole, and worker\(s\) \[2\]"):
            server.gather(4, N, [0, 1, 2])
        for t in ts:
            t.join(5)


def test_a_restarted_worker_is_read_from_its_new_connection_once_admitted_again(mode):
    """Worker 1 dies (its connection ends) and is restarted: its new
    connection waits, unread and sent nothing, until the server admits it
    again (`readmit`, the step that takes its join ticket); from the next
    op's start it is in place: that op's answer reaches it even with no
    round of it read first (an op that begins with the answer), and its
    rounds are read from it."""
    with pair() as (server, workers):
        server.ensure(N)
        workers[1].sock.close()                       # worker 1 dies
        rows = [np.full(N, w + 1, np.float32) for w in range(2)]
        server.open(1, N, [0, 1], False)
        ts, errors = in_threads(lambda: workers[0].push(1, rows[0].copy(), False))
        assert server.gather(1, N, [0, 1]).delivered.tolist() == [1, 0]
        for t in ts:
            t.join()
        back = again(server, 1, 2)                    # restarted: connected, not yet admitted
        try:
            server.ensure(N)                          # the next op: its connection is parked
            assert server.gone == {1} and server.back.parked.keys() == {1}
            out = np.zeros(N, np.float32)
            ts, errors2 = in_threads(lambda: workers[0].pull(2, out))
            server.send(2, np.full(N, 2, np.float32), False)   # not for worker 1
            for t in ts:
                t.join()
            assert np.array_equal(out, np.full(N, 2, np.float32))
            server.readmit(1)                         # admitted at this op's step
            server.ensure(N)                          # its first op
            assert server.gone == set() and server.back.parked == {}
            outs = [np.zeros(N, np.float32) for _ in range(2)]
            ts, errors3 = in_threads(lambda: workers[0].pull(3, outs[0]),
                                     lambda: back.pull(3, outs[1]))
            server.send(3, np.full(N, 3, np.float32), False)
            for t in ts:
                t.join()
            assert all(np.array_equal(o, np.full(N, 3, np.float32)) for o in outs)
            server.open(4, N, [0, 1], False)
            ts, errors4 = in_threads(lambda: workers[0].push(4, rows[0].copy(), False),
                                     lambda: back.push(4, rows[1].copy(), False))
            got = server.gather(4, N, [0, 1])
            for t in ts:
                t.join()
            assert got.delivered.tolist() == [1, 1] and np.array_equal(got.values[1], rows[1])
            assert not (errors or errors2 or errors3 or errors4)
        finally:
            back.close()


def test_a_restarted_workers_closed_connection_is_not_taken_back():
    """A restarted worker whose new process died as well: its parked
    connection is found closed when it is admitted, and it stays gone; a
    third start's connection, newer, is taken."""
    with pair() as (server, workers):
        server.ensure(N)
        workers[1].sock.close()
        server.open(1, N, [0, 1], False)
        ts, _ = in_threads(lambda: workers[0].push(1, np.ones(N, np.float32), False))
        server.gather(1, N, [0, 1])
        for t in ts:
            t.join()
        again(server, 1, 2).close()                   # restarted, and died again
        server.ensure(N)
        server.readmit(1)
        server.ensure(N)
        assert server.gone == {1} and server.back.parked == {}
        third = again(server, 1, 2)
        try:
            server.ensure(N)
            server.readmit(1)
            server.ensure(N)
            assert server.gone == set() and server.conns[1].fileno() >= 0
        finally:
            third.close()


def test_the_next_round_is_read_in_while_the_last_one_is_summed():
    """`ahead` names the op's next round: gather(1) returns round 1's rows
    and starts reading round 2 into the other buffer, so round 1's rows stay
    as they came while round 2 arrives, and gather(2) returns round 2's."""
    with pair() as (server, workers):
        one = [np.full(N, w + 1, np.float32) for w in range(2)]
        two = [np.arange(N, dtype=np.float32) - w for w in range(2)]
        server.ensure(N)
        server.ahead(2, N, [0, 1])
        ts, errors = in_threads(*[lambda w=w: workers[w].push(1, one[w].copy(), False)
                                  for w in range(2)])
        first = server.gather(1, N, [0, 1])
        for t in ts:
            t.join()
        assert server.pre is not None and server.pre[0][0] == 2     # round 2 on its way in
        ts, errors2 = in_threads(*[lambda w=w: workers[w].push(2, two[w].copy(), False)
                                   for w in range(2)])
        for t in ts:
            t.join()
        server.pre[2].result(timeout=20)                  # read in, before anyone asked
        assert np.array_equal(first.values[0], one[0]) and np.array_equal(first.values[1], one[1])
        second = server.gather(2, N, [0, 1])
        assert not errors and not errors2
        assert np.array_equal(second.values[0], two[0]) and np.array_equal(second.values[1], two[1])


def test_a_gather_of_another_round_than_the_one_read_ahead_fails():
    with pair() as (server, workers):
        gather_one_with_two_ahead(server, workers)
        ts = push_ones(workers, 2)
        with pytest.raises(CommError, match=r"round 3 asked for, round 2 .* read ahead"):
            server.gather(3, N, [0, 1])
    for t in ts:
        t.join(5)


def test_an_answer_to_workers_that_read_nothing_fails_after_the_timeout(mode):
    """Workers alive but not reading (a frozen process: its kernel keeps the
    connection, its window shut): the send gives up after the link's
    timeout with no byte moved, in either mode, naming them."""
    with pair(timeout=1.0) as (server, workers):
        big = np.zeros(16 * 2**20, np.float32)         # 64 MB: far past the sockets' buffers
        with pytest.raises(CommError, match=r"answer 2 stalled for 1s"):
            server.send(2, big, False)


def test_a_round_read_ahead_that_failed_and_was_never_gathered_stops_the_next_op():
    """The server gave an op up after `ahead` named its next round: the
    read in flight meets the next op's data (or an error), and the next op
    must not read from connections now out of step: ensure() says so."""
    with pair() as (server, workers):
        gather_one_with_two_ahead(server, workers)
        ts = push_ones(workers, 5)       # round 2 never comes: the next op's round 5 does
        with pytest.raises(CommError, match=r"round 2, read ahead and never gathered, failed "
                           r"\(worker \d: bad header \(round 5"):
            server.ensure(N)
        assert server.pre is None
    for t in ts:
        t.join(5)


@pytest.mark.slow
def test_ddp_over_the_tcp_transport_with_rounds_of_megabytes_equals_gloo():
    """The server's hints and the link's threads in a real job: DDP over the
    `ltp` backend's TCP transport on loopback (tests/ddp_local.py), an MLP
    whose 4 MB rounds are each read in while the last is summed, ends with
    parameters equal to gloo's bit for bit, on every replica."""
    from ddp_local import ROOT as root, run_local
    args = ("--hidden", "1536", "--steps", "5")
    script = root / "scripts" / "ddp_width.py"
    ltp = run_local(2, *args, script=script, timeout=240)["results"]
    gloo = run_local(2, *args, script=script, backend="gloo", timeout=240)["results"]
    assert ltp[0]["params"] > 2 * 2**20        # rounds of 4 MB: read ahead on threads
    assert len({r["digest"] for r in ltp + gloo}) == 1, [r["digest"] for r in ltp + gloo]
    assert all(r["tcp_local"] == [True] for r in ltp)   # on its server's host: a Unix socket
