# SPDX-License-Identifier: Apache-2.0
"""Arrival times at the NIC (issues 28, 45): per bank and slot the XDP
program stamps its progress with a flow's first arrival, its last, and the
arrival of the chunk that brought the count to the bank's threshold. The
clock is read for a flow's edges, not for every DATA: its first chunk, its
re-sends and every chunk from the threshold on, so first_ns, thresh_ns and
(for a flow that completed or passed its threshold) last_ns are exact, with
a heartbeat or without. A chunk between the edges stamps last_ns only with
a reading the frame has anyway (the heartbeat check's, once a jiffy).

Run on the real program through BPF_PROG_TEST_RUN; the packets are
test_xdp_packets' (worker 3 in slot 1, round 5 in bank 1, 4 chunks)."""
from __future__ import annotations

import time

import pytest

from conftest import requires_bpf
from test_xdp_packets import JOB, NCHUNKS, data, open_bank, run
from ltpx.dataplane.xdp import wire as W
from ltpx.dataplane.xdp.testrun import XDP_TX

pytestmark = [requires_bpf, pytest.mark.root]


@pytest.fixture(scope="module")
def dp(small_geometry):
    from ltpx.dataplane.xdp.loader import Dataplane
    with Dataplane(small_geometry, job=JOB) as d:
        d.maps().set_peers({3: 1, 9: 2})
        yield d


def _round(dp, thresh: int, beat: bool):
    m = dp.maps()
    open_bank(m, 5, thresh=thresh)
    m.set_liveness(1.0)
    m.live[0] = time.monotonic_ns() if beat else 0
    return m


def _timed(dp, chunks, **kw) -> list[tuple[int, int]]:
    """Deliver chunks in order; per chunk the (before, after) window of its
    run on CLOCK_MONOTONIC, the program's clock."""
    out = []
    for c in chunks:
        t0 = time.monotonic_ns()
        assert run(dp, data(chunk=c, **kw)).verdict == XDP_TX
        out.append((t0, time.monotonic_ns()))
    return out


def _stamps(m) -> tuple[int, int, int]:
    p = m.progress[1, 1]
    return int(p["first_ns"]), int(p["thresh_ns"]), int(p["last_ns"])


@pytest.mark.parametrize("beat", [True, False], ids=["heartbeat", "no-heartbeat"])
def test_first_threshold_and_last_arrival_are_exact(dp, beat):
    """Each stamp lies inside its own chunk's run: first_ns the first
    chunk's, thresh_ns the third distinct one's (thresh 3), last_ns the one
    that completed the flow. The heartbeat is written once, as an endpoint
    beats per poll, not per packet."""
    m = _round(dp, thresh=3, beat=beat)
    win = _timed(dp, [0, 2, 1, 3])
    first, thresh, last = _stamps(m)
    assert win[0][0] <= first <= win[0][1]
    assert win[2][0] <= thresh <= win[2][1]
    assert win[3][0] <= last <= win[3][1]
    # a duplicate is not a delivery: no stamp moves
    assert run(dp, data(chunk=3)).verdict == XDP_TX
    assert _stamps(m) == (first, thresh, last)
    # another slot's stamps are its own
    assert int(m.progress[1, 2]["first_ns"]) == 0


def test_a_resend_is_stamped_at_its_arrival(dp):
    """A re-send (LTP_F_RETX) is an edge of its flow: last_ns is its
    arrival, below any threshold and without a heartbeat."""
    m = _round(dp, thresh=0, beat=False)
    (w0,) = _timed(dp, [0])
    time.sleep(0.002)
    (w1,) = _timed(dp, [2], flags=W.F_RETX)
    first, thresh, last = _stamps(m)
    assert w0[0] <= first <= w0[1] and w1[0] <= last <= w1[1] and thresh == 0
    assert int(m.progress[1, 1]["retx"]) == 1


def test_a_chunk_between_the_edges_keeps_last_inside_the_flow(dp):
    """Below its threshold, not a re-send, not the last: whether the chunk
    is stamped depends on a reading the frame has anyway (not pinned), but
    last_ns never leaves the flow's span."""
    for beat in (True, False):
        m = _round(dp, thresh=NCHUNKS, beat=beat)
        win = _timed(dp, [0, 1, 2])
        first, thresh, last = _stamps(m)
        assert win[0][0] <= first <= win[0][1] and first <= last <= win[2][1] and thresh == 0


def test_no_threshold_no_stamp_and_reopen_clears(dp):
    m = _round(dp, thresh=0, beat=True)
    _timed(dp, [0, 1, 2, 3])
    assert int(m.progress[1, 1]["thresh_ns"]) == 0 and int(m.progress[1, 1]["last_ns"]) > 0
    m = _round(dp, thresh=NCHUNKS, beat=True)
    assert int(m.progress[1, 1]["first_ns"]) == int(m.progress[1, 1]["last_ns"]) == 0
