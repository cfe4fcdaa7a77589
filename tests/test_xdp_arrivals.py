# SPDX-License-Identifier: Apache-2.0
"""Arrival times at the NIC (issue 28): per bank and slot the XDP program
stamps its progress with the first chunk's time, the latest chunk's and the
time of the chunk that brought the count to the bank's threshold, from the
one clock reading a frame has (the heartbeat's staleness check).

Run on the real program through BPF_PROG_TEST_RUN; the packets are
test_xdp_packets' (worker 3 in slot 1, round 5 in bank 1, 4 chunks)."""
from __future__ import annotations

import time

import pytest

from conftest import requires_bpf
from test_xdp_packets import JOB, NCHUNKS, data, open_bank, run
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


def _deliver(dp, m, chunks) -> list[int]:
    """Deliver chunks in order; the progress's last_ns after each."""
    lasts = []
    for c in chunks:
        m.live[0] = m.live[0] and time.monotonic_ns()   # a fresh beat, if beating
        assert run(dp, data(chunk=c)).verdict == XDP_TX
        lasts.append(int(m.progress[1, 1]["last_ns"]))
    return lasts


def test_first_last_and_threshold_times_with_a_heartbeat(dp):
    m = _round(dp, thresh=3, beat=True)
    t0 = time.monotonic_ns()
    lasts = _deliver(dp, m, [0, 2, 1, 3])
    t1 = time.monotonic_ns()
    p = m.progress[1, 1]
    first, thresh = int(p["first_ns"]), int(p["thresh_ns"])
    # one clock (CLOCK_MONOTONIC) on both sides: the stamps lie between the
    # test's own readings, in the order the chunks came
    assert t0 <= first == lasts[0] < lasts[1] < lasts[2] < lasts[3] <= t1
    assert thresh == lasts[2]          # the third distinct chunk reached thresh 3
    assert int(p["last_ns"]) == lasts[3]
    # a duplicate is not a delivery: no stamp moves
    assert run(dp, data(chunk=3)).verdict == XDP_TX
    assert int(m.progress[1, 1]["last_ns"]) == lasts[3]
    # another slot's stamps are its own
    assert int(m.progress[1, 2]["first_ns"]) == 0


def test_no_threshold_no_stamp_and_reopen_clears(dp):
    m = _round(dp, thresh=0, beat=True)
    _deliver(dp, m, [0, 1, 2, 3])
    assert int(m.progress[1, 1]["thresh_ns"]) == 0 and int(m.progress[1, 1]["last_ns"]) > 0
    m = _round(dp, thresh=NCHUNKS, beat=True)
    assert int(m.progress[1, 1]["first_ns"]) == int(m.progress[1, 1]["last_ns"]) == 0


def test_without_a_heartbeat_only_the_first_chunk_is_timed(dp):
    """No heartbeat (a worker's downlink, `ltp load`): the clock is read for
    the first chunk only, as before; last_ns is that one's."""
    m = _round(dp, thresh=2, beat=False)
    lasts = _deliver(dp, m, [0, 1, 2])
    p = m.progress[1, 1]
    assert lasts == [int(p["first_ns"])] * 3 and int(p["thresh_ns"]) == 0
