# SPDX-License-Identifier: Apache-2.0
"""Straggler attribution in a real `ltp train` run on the rig (issue 28): a
worker slowed a lot is named in nearly every step; with none slowed no
worker is named in more than 40 % of the steps."""
from __future__ import annotations

import pytest

from conftest import requires_bpf
from ltpx.control.training.config import TrainConfig

pytestmark = [pytest.mark.rig, requires_bpf]
WORKERS, STEPS = 4, 20


@pytest.fixture(scope="module")
def rig():
    from ltpx.control.training.onrig import rig_config
    from ltpx.dataplane.rig.star import Rig
    with Rig(rig_config("tsg", "ltp", workers=WORKERS, rate_bps=10**9, buffer_bytes=30_000,
                        loss=0.0)) as r:
        yield r


def _train(rig, **kw):
    from ltpx.control.training.onrig import train_on_rig
    return train_on_rig(rig, TrainConfig(iterations=STEPS, seed=3, **kw), timeout_s=300)


def test_a_slowed_worker_is_named_straggler_in_nearly_every_step(rig):
    # x100 its compute (~1.5 ms a step here): its sleep outlasts the round
    # trip its push overlaps, so it reaches the next step's barrier late
    r = _train(rig, straggler={2: 100.0})
    named, n = r["straggler_rounds"], r["rounds_attributed"]
    assert n >= STEPS // 2, r
    assert named.get("2", 0) >= 0.95 * n, r
    assert set(r["lateness_ms"]) == {"0", "1", "2", "3"}


def test_without_a_straggler_no_worker_is_named_in_most_steps(rig):
    r = _train(rig)
    named = r["straggler_rounds"]
    assert all(v <= 0.4 * STEPS for v in named.values()), r
    assert r["rounds_attributed"] == sum(named.values())
