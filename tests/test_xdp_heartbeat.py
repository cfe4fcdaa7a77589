# SPDX-License-Identifier: Apache-2.0
"""The heartbeat's verdict at the NIC (issues 16, 45). ltp_xdp judges the
receiving control plane's heartbeat (ltp_cfg.beat_ns against limit_ns) with
a clock read once a jiffy per CPU, or when the beat or the limit changed,
not for every DATA; in between it keeps its verdict (ltp_beatchk). What it
promises: an owner that stops beating is refused within its limit plus one
jiffy; a beat or limit written is judged by the first frame that sees it
(test_xdp_packets' liveness cases rely on that).

Run on the real program through BPF_PROG_TEST_RUN; the packets are
test_xdp_packets' (worker 3 in slot 1, round 5 in bank 1, 4 chunks)."""
from __future__ import annotations

import time

import pytest

from conftest import requires_bpf
from test_xdp_packets import JOB, data, open_bank, run
from ltpx.dataplane.xdp.testrun import XDP_DROP, XDP_TX

pytestmark = [requires_bpf, pytest.mark.root]

LIMIT_S = 0.05
JIFFY_S = 0.01      # 1/HZ at HZ 100, the coarsest kernel tick (this one's: 250)


@pytest.fixture(scope="module")
def dp(small_geometry):
    from ltpx.dataplane.xdp.loader import Dataplane
    with Dataplane(small_geometry, job=JOB) as d:
        d.maps().set_peers({3: 1, 9: 2})
        yield d


@pytest.fixture
def m(dp):
    m = dp.maps()
    open_bank(m, 5)
    m.set_liveness(LIMIT_S)
    m.live[0] = time.monotonic_ns()
    return m


def _stale(m) -> int:
    return m.counters()["stale_owner"]


def test_an_owner_that_stops_beating_is_refused_within_its_limit_plus_a_jiffy(dp, m):
    assert run(dp, data(chunk=0)).verdict == XDP_TX      # fresh: judged, and kept
    time.sleep(LIMIT_S + JIFFY_S + 0.005)
    before = _stale(m)
    # the beat is the one judged fresh, but the limit and a jiffy have passed
    assert run(dp, data(chunk=1)).verdict == XDP_DROP
    assert _stale(m) == before + 1
    assert m.progress[1, 1]["chunks"] == 1                # chunk 1 not written
    # beating again: the next frame is judged afresh and ACKed
    m.live[0] = time.monotonic_ns()
    assert run(dp, data(chunk=1)).verdict == XDP_TX


def test_a_beat_or_limit_written_is_judged_at_the_next_frame(dp, m):
    """Within the jiffy of a fresh verdict, a beat older than the limit, or
    a limit shorter than the beat's age, is refused at once."""
    assert run(dp, data(chunk=0)).verdict == XDP_TX
    m.live[0] = time.monotonic_ns() - int(2 * LIMIT_S * 1e9)
    assert run(dp, data(chunk=1)).verdict == XDP_DROP
    m.live[0] = time.monotonic_ns()
    assert run(dp, data(chunk=1)).verdict == XDP_TX
    m.live[0] = time.monotonic_ns() - int(0.02 * 1e9)
    assert run(dp, data(chunk=2)).verdict == XDP_TX
    m.set_liveness(0.01)
    assert run(dp, data(chunk=3)).verdict == XDP_DROP
