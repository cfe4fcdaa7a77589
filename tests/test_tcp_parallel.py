# SPDX-License-Identifier: Apache-2.0
"""The TCP server link's large pieces (link_tcp.py): a round or an answer of
PARALLEL_BYTES or more moves on a thread per worker, a smaller one in the
epoll loop (LTP_TCP_THREADS=0: always the loop). Real sockets on loopback:
every byte arrives in place both ways, and a worker that sends a wrong
header or hangs up mid-piece fails the call with its name, the other
worker's thread stopped."""
from __future__ import annotations

import socket
import threading
from pathlib import Path

import numpy as np
import pytest

from ltpx.control.torchapi.link_tcp import HDR, PARALLEL_BYTES, TCP_MAGIC, TcpServerLink, \
    TcpWorkerLink
from ltpx.control.torchapi.settings import Settings
from ltpx.errors import CommError

pytestmark = pytest.mark.unit

N = PARALLEL_BYTES // 4 * 3 + 5       # elements: a few MB, more than a socket buffer holds


def pair(timeout: float = 20.0):
    cc = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    s = Settings.resolve({"ip": "127.0.0.1", "cc": cc, "timeout": timeout})
    server = TcpServerLink(s, 2)
    workers = [TcpWorkerLink(s, w, 2) for w in range(2)]
    for w in workers:
        w.connect({**server.address(), "ip": "127.0.0.1"})
    server.connect({i: w.address() for i, w in enumerate(workers)})
    return server, workers


def in_threads(*calls):
    errors = []

    def run(c):
        try:
            c()
        except BaseException as e:
            errors.append(e)
    ts = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in ts:
        t.start()
    return ts, errors


@pytest.mark.parametrize("threads", ["1", "0"])
def test_a_large_round_and_its_answer_arrive_whole_both_ways(monkeypatch, threads):
    monkeypatch.setenv("LTP_TCP_THREADS", threads)
    server, workers = pair()
    try:
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
    finally:
        for w in workers:
            w.close()
        server.close()


def test_a_wrong_header_in_a_large_round_fails_naming_the_worker():
    server, workers = pair()
    try:
        server.ensure(N)
        body = np.ones(N, np.float32)
        ts, _ = in_threads(lambda: workers[0].push(1, body.copy(), False),
                           lambda: workers[1].sock.sendall(HDR.pack(TCP_MAGIC, 7, N * 4)))
        with pytest.raises(CommError, match=r"worker 1: bad header \(round 7"):
            server.gather(1, N, [0, 1])
    finally:
        for w in workers:
            w.close()
        server.close()
        for t in ts:
            t.join(5)


def test_a_worker_that_hangs_up_mid_round_fails_the_gather_not_hangs_it():
    server, workers = pair()
    try:
        server.ensure(N)
        w1 = workers[1].sock
        w1.sendall(HDR.pack(TCP_MAGIC, 1, N * 4) + b"\0" * 4096)
        w1.shutdown(socket.SHUT_RDWR)
        # worker 0 sends nothing: its thread is stopped once worker 1's fails
        with pytest.raises(CommError, match="worker 1 closed its connection"):
            server.gather(1, N, [0, 1])
    finally:
        for w in workers:
            w.close()
        server.close()


def test_the_next_round_is_read_in_while_the_last_one_is_summed():
    """`ahead` names the op's next round: gather(1) returns round 1's rows
    and starts reading round 2 into the other buffer, so round 1's rows stay
    as they came while round 2 arrives, and gather(2) returns round 2's."""
    server, workers = pair()
    try:
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
    finally:
        for w in workers:
            w.close()
        server.close()


def test_a_gather_of_another_round_than_the_one_read_ahead_fails():
    server, workers = pair()
    try:
        server.ensure(N)
        server.ahead(2, N, [0, 1])
        ts, _ = in_threads(*[lambda w=w: workers[w].push(1, np.ones(N, np.float32), False)
                             for w in range(2)])
        server.gather(1, N, [0, 1])
        ts2, _ = in_threads(*[lambda w=w: workers[w].push(2, np.ones(N, np.float32), False)
                              for w in range(2)])
        with pytest.raises(CommError, match=r"round 3 asked for, round 2 .* read ahead"):
            server.gather(3, N, [0, 1])
    finally:
        for w in workers:
            w.close()
        server.close()
        for t in ts + ts2:
            t.join(5)
