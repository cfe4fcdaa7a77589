"""The ACK clock on a slow link (docs/transport.md, "The clock's RTO").

Two workers push 512 KiB each through the clock into a PS behind a
10 Mbit/s, 30 kB bottleneck: a flow's ACKs come ~2.3 ms apart and a round
trip through the full queue takes ~23 ms, both longer than the clock's
2 ms RTO floor. The RTO follows the flow's round trip (in flight x its
mean ACK gap; before a push's own ACKs, the last push's gap), so Python
re-sends only what was lost; with a fixed 2 ms RTO each worker re-sent a
window between every two ACKs (up to 2,760 re-sends for 369 chunks), the
re-sends delayed the ACKs further, and an Early Close could cut the round.
A first push has no gap to go by: a few of its primed chunks go twice.

Rig `hfslow` (namespaces ltp-hfslow-*).
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import requires_bpf

pytestmark = requires_bpf

NEL = 131_072   # 512 KiB per worker: 369 chunks of 1424 bytes
ROUNDS = 3


@pytest.fixture(scope="module")
def cluster():
    from ltpx.control.bench.cluster import LtpCluster
    from ltpx.dataplane.rig.star import Rig, RigConfig
    with Rig(RigConfig(name="hfslow", workers=2, rate_bps=10_000_000, buffer_bytes=30_000,
                       loss=0.0)) as rig:
        with LtpCluster(rig, NEL, sender="xdp", warmup=False) as cl:
            yield cl


def test_a_slow_link_is_clocked_without_spurious_resends(cluster):
    from ltpx.control.bench.cluster import worker_tensor
    cl = cluster
    for r in range(1, ROUNDS + 1):
        res, reps = cl.run_round(r, NEL, seed=7)
        assert res.reason == "complete" and res.masks.all(), res.report()
        assert np.array_equal(res.values, np.stack([worker_tensor(7, w, r, NEL) for w in cl.ids]))
        for rep in reps.values():
            assert rep.sender == "xdp" and rep.acked == rep.chunks, rep
            # the clock sent the round; Python re-sent what was lost (a queue
            # overflow; in the first push, a few primed chunks at the 2 ms RTO
            # before any gap was known), not a window per ACK
            assert rep.clock_tx >= rep.chunks * 0.8, rep
            assert rep.resent <= rep.chunks * (0.1 if r == 1 else 0.02), rep
