# SPDX-License-Identifier: Apache-2.0
"""The ACK clock on a slow link (docs/transport.md, "The clock's RTO").

Two or four workers push 256 KiB each through the clock into a PS behind a
10 Mbit/s, 30 kB bottleneck: a flow's ACKs come 2.3-4.7 ms apart, in bursts
as its window crosses the shared queue, and a round trip through the full
queue takes ~23 ms, all longer than the clock's 2 ms RTO floor. The RTO
follows the flow's round trip (in flight x its mean ACK gap over the last
round trip's ACKs; before a push is past its primed window, the last
push's mean gap), so Python re-sends only what was lost. With a fixed 2 ms
RTO each worker re-sent a window between every two ACKs (up to 2,760
re-sends for 369 chunks); with a gap averaged since the first ACK (biased
low by the primed window's back-to-back ACKs) an RTO still fired at the
start of every push at four workers. A first push goes by a frame's time
at its rate until it has a gap.

Rigs `hfslow2`, `hfslow4` (namespaces ltp-hfslow*-*).
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import requires_bpf

pytestmark = requires_bpf

NEL = 65_536    # 256 KiB per worker: 184 chunks of 1432 bytes
ROUNDS = 4


@pytest.fixture(scope="module", params=[2, 4], ids=["2-workers", "4-workers"])
def cluster(request):
    from ltpx.control.bench.cluster import LtpCluster
    from ltpx.dataplane.rig.star import Rig, RigConfig
    n = request.param
    with Rig(RigConfig(name=f"hfslow{n}", workers=n, rate_bps=10_000_000, buffer_bytes=30_000,
                       loss=0.0)) as rig, LtpCluster(rig, NEL, sender="xdp", warmup=False) as cl:
        yield cl


@pytest.mark.rig
def test_a_slow_link_is_clocked_without_spurious_resends(cluster):
    from ltpx.control.bench.cluster import worker_tensor
    cl = cluster
    later = []
    for r in range(1, ROUNDS + 1):
        res, reps = cl.run_round(r, NEL, seed=7)
        assert res.reason == "complete" and res.masks.all(), res.report()
        assert np.array_equal(res.values, np.stack([worker_tensor(7, w, r, NEL) for w in cl.ids]))
        for rep in reps.values():
            assert rep.sender == "xdp" and rep.acked == rep.chunks, rep
            # the clock sent the round; Python re-sent what was lost (a queue
            # overflow, a tail), not a window per ACK or per burst
            assert rep.clock_tx >= rep.chunks * 0.8, rep
            assert rep.resent <= rep.chunks * 0.1, rep
            if r > 1:
                later.append(rep.resent)
    # pushes that know the last one's gap: a few re-sends each on average
    # (a tail, a reordered priming), not a window per ACK or per burst
    assert sum(later) <= len(later) * 6, later
