# SPDX-License-Identifier: Apache-2.0
"""A step's answer over TCP in parts as its rounds are summed (tcpstream.py):
a worker reading early has each part while the later ones are not yet
final, and ends with the whole answer as a `send` would give it, over
sockets and in memory (a co-located trainer's); a stream is only for a
float32 answer; a part that fails ends the server (not a TransportError,
which the server would answer by sending the answer again into streams
already holding part of it). Real links in one process."""
from __future__ import annotations

import time

import numpy as np
import pytest

from ltpx.errors import CommError, LtpError, TransportError
from tcp_links import in_threads, pair

pytestmark = pytest.mark.unit


def arrived(out: np.ndarray, want: np.ndarray, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if np.array_equal(out, want):
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("near", [False, True], ids=["sockets", "in-memory"])
@pytest.mark.parametrize("n", [3000, 3 * (1 << 19)], ids=["small", "large"])
def test_a_worker_reading_early_has_each_part_as_it_is_fed(near, n):
    answer = np.arange(n, dtype=np.float32) + 0.5
    with pair(near=near) as (server, workers):
        outs = [[np.zeros(n // 3, np.float32), np.zeros(n - n // 3, np.float32)]
                for _ in workers]
        ts, errors = in_threads(*[lambda w=w: workers[w].pull_parts(9, outs[w])
                                  for w in range(2)])
        buf = np.zeros(n, np.float32)
        stream = server.stream(9, buf, False, to=[0, 1], wait_s=1.0)
        assert stream is not None
        buf[:n // 2] = answer[:n // 2]
        stream.feed(n // 2)
        for o in outs:      # the first part is in, the rest not sent yet
            assert arrived(o[0], answer[:n // 3]), o[0][:5]
            assert not o[1][n // 2 - n // 3:].any()
        buf[n // 2:] = answer[n // 2:]
        stream.finish()
        for t in ts:
            t.join(10)
        assert not errors, errors
        for o in outs:
            assert np.array_equal(np.concatenate(o), answer)
        assert stream.parts == 2


def test_a_stream_is_for_a_float32_answer_with_threads(monkeypatch):
    with pair() as (server, _):
        server.configure("zero", "{}", wire="bf16")
        assert server.stream(1, np.zeros(10, np.float32), False, to=[0, 1], wait_s=1) is None
    monkeypatch.setenv("LTP_TCP_THREADS", "0")
    with pair() as (server, _):
        assert server.stream(1, np.zeros(10, np.float32), False, to=[0, 1], wait_s=1) is None


def test_a_part_that_fails_ends_the_server_and_is_no_transport_error():
    with pair(near=True, timeout=5) as (server, workers):
        buf = np.ones(1000, np.float32)
        stream = server.stream(4, buf, False, to=[0, 1], wait_s=1.0)
        workers[0].close()          # its end is gone before the answer is
        stream.feed(1000)
        with pytest.raises(LtpError, match="answer 4's stream to the workers failed") as e:
            stream.finish()
        assert not isinstance(e.value, TransportError)
        assert isinstance(e.value.__cause__, CommError)
