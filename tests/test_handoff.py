# SPDX-License-Identifier: Apache-2.0
"""The TCP transport's hop inside one process (handoff.py): a co-located
trainer's worker link and the server link beside it meet in memory, with
the stream's order and checks: every byte in place both ways, a large piece
lent until it is taken, a small one held as a socket's buffer would, a
piece out of step or a closed end a CommError (at once, not after the
link's timeout), and each side tells a peer in its own process from one in
another (a forked child is another)."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from ltpx.control.torchapi import handoff
from ltpx.control.torchapi.link_tcp import PARALLEL_BYTES
from ltpx.errors import CommError
from tcp_links import in_threads, pair, round_trip

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("n", [1000, PARALLEL_BYTES // 4 * 3 + 5], ids=["small", "large"])
def test_links_in_one_process_meet_in_memory_with_every_byte_in_place(n):
    with pair(near=True) as (server, workers):
        assert server.conns == [None, None] and sorted(server.near) == [0, 1]
        assert [w.sock for w in workers] == [None, None] and all(w.local for w in workers)
        round_trip(server, workers, n)
        round_trip(server, workers, n)     # and again: the stream goes on in order


def test_a_large_piece_is_lent_until_taken_and_a_small_one_is_held():
    slot = handoff.Slot("test")
    big = np.arange(handoff.SMALL_BYTES // 4 + 1, dtype=np.float32)
    given = threading.Event()
    th = threading.Thread(target=lambda: (slot.give(3, memoryview(big).cast("B"), 10),
                                          given.set()))
    th.start()
    assert not given.wait(0.3)          # lent: the giver waits for the taker
    into = np.zeros_like(big)
    slot.take(3, memoryview(into).cast("B"), 10)
    assert given.wait(5) and np.array_equal(into, big)
    th.join()
    small = np.arange(10, dtype=np.float32)
    slot.give(4, memoryview(small).cast("B"), 10)    # returns at once: held
    small[:] = -1                                     # the giver's buffer is its own again
    out = np.zeros(10, np.float32)
    slot.take(4, memoryview(out).cast("B"), 10)
    assert out.tolist() == list(range(10))


def test_a_piece_taken_into_several_buffers_fills_them_in_turn():
    slot = handoff.Slot("test")
    body = np.arange(10, dtype=np.float32)
    slot.give(7, memoryview(body).cast("B"), 10)
    a, b, c = np.zeros(3, np.float32), np.zeros(0, np.float32), np.zeros(7, np.float32)
    slot.take(7, [memoryview(x).cast("B") for x in (a, b, c)], 10)
    assert a.tolist() == [0, 1, 2] and c.tolist() == list(range(3, 10))


def test_a_piece_out_of_step_or_of_another_size_closes_the_stream():
    slot = handoff.Slot("test")
    slot.give(5, memoryview(np.ones(4, np.float32)).cast("B"), 10)
    with pytest.raises(CommError, match="5 of 16 bytes given where 4 of 16 was expected"):
        slot.take(4, memoryview(np.zeros(4, np.float32)).cast("B"), 10)
    with pytest.raises(CommError, match="out of step"):     # and it stays closed
        slot.give(6, memoryview(np.ones(4, np.float32)).cast("B"), 10)
    other = handoff.Slot("test")
    other.give(1, memoryview(np.ones(4, np.float32)).cast("B"), 10)
    with pytest.raises(CommError, match="1 of 16 bytes given where 1 of 12"):
        other.take(1, memoryview(np.zeros(3, np.float32)).cast("B"), 10)


def test_a_closed_end_wakes_the_other_side_at_once_and_a_silent_one_times_out():
    with pair(near=True, timeout=30) as (server, workers):
        server.ensure(100)
        server.open(1, 100, [0, 1], False)
        t0 = time.monotonic()
        ts, errors = in_threads(lambda: server.gather(1, 100, [0, 1]))
        time.sleep(0.2)
        workers[0].close()
        for t in ts:
            t.join(10)
        assert len(errors) == 1 and isinstance(errors[0], CommError), errors
        assert "worker 0 closed its end" in str(errors[0])
        assert time.monotonic() - t0 < 5      # not the link's 30 s
    slot = handoff.Slot("quiet")
    t0 = time.monotonic()
    with pytest.raises(CommError, match="nothing given within 0.3s"):
        slot.take(1, memoryview(bytearray(4)), 0.3)
    assert time.monotonic() - t0 < 3
    with pytest.raises(CommError, match="2 not taken within 0.3s"):
        slot.give(2, memoryview(bytearray(handoff.SMALL_BYTES)), 0.3)


def test_a_pair_is_one_for_both_sides_and_forgotten_once_closed():
    a = handoff.pair("127.0.0.1", 5000, 1)
    assert handoff.pair("127.0.0.1", 5000, 1) is a
    assert handoff.pair("127.0.0.1", 5000, 2) is not a
    a.close("the test")
    assert handoff.pair("127.0.0.1", 5000, 1) is not a
    handoff.pair("127.0.0.1", 5000, 1).close("the test")
    handoff.pair("127.0.0.1", 5000, 2).close("the test")


def test_a_forked_child_is_another_process():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:      # the child: its proc(), then gone without the parent's teardown
        os.write(w, handoff.proc().encode())
        os._exit(0)
    os.close(w)
    child = os.read(r, 200).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert child and child != handoff.proc()
    assert handoff.proc() == handoff.proc()
