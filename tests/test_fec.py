# SPDX-License-Identifier: Apache-2.0
"""The erasure code of reliable rounds (control/transport/fec.py): any k of a
group's chunks rebuild its data, bit for bit; the parity follows the loss."""
from __future__ import annotations

import numpy as np
import pytest

from ltpx.control.transport import fec
from ltpx.errors import TransportError

CB = 1424


def coded(data: int, r: int, seed: int = 0, k: int = fec.K) -> tuple[fec.Plan, np.ndarray]:
    plan = fec.Plan(data, k=k)
    chunks = np.zeros((plan.nchunks, CB), dtype=np.uint8)
    chunks[:data] = np.random.default_rng(seed).integers(0, 256, (data, CB), dtype=np.uint8)
    fec.encode(plan, chunks, r)
    return plan, chunks


@pytest.mark.unit
def test_the_plan_declares_every_parity_slot_and_groups_chunks():
    plan = fec.Plan(70, k=32, rmax=16)            # groups of 32, 32 and 6
    assert plan.groups == 3 and plan.nchunks == 70 + 3 * 16
    assert plan.need().tolist() == [32, 32, 6]
    assert plan.members(2, 2).tolist() == [64, 65, 66, 67, 68, 69, 70 + 32, 70 + 33]
    g = plan.group_of
    assert g[0] == 0 and g[69] == 2 and g[70] == 0 and g[70 + 47] == 2
    with pytest.raises(ValueError, match="bad code"):
        fec.Plan(10, k=250, rmax=16)


@pytest.mark.unit
@pytest.mark.parametrize("loss", [0.05, 0.2])
def test_any_k_chunks_of_a_group_rebuild_its_data(loss):
    r = fec.parity_for(loss)
    plan, chunks = coded(100, r, seed=3)
    want = chunks[:100].copy()
    rng = np.random.default_rng(7)
    sent = np.zeros(plan.nchunks, bool)
    for g in range(plan.groups):
        sent[plan.members(g, r)] = True
    for trial in range(20):
        mask = sent & (rng.random(plan.nchunks) >= loss)
        got = chunks.copy()
        got[~mask] = 0xEE                          # whatever a lost chunk's memory held
        whole = plan.whole(mask)
        if not whole.all():
            with pytest.raises(TransportError, match="coded group"):
                fec.rebuild(plan, got, mask)
            continue
        n = fec.rebuild(plan, got, mask)
        assert n == int((~mask[:100]).sum())
        assert np.array_equal(got[:100], want), trial


@pytest.mark.unit
def test_covered_marks_whole_groups_so_nothing_there_is_sent_again():
    plan, _ = coded(64, 4)
    mask = np.zeros(plan.nchunks, bool)
    mask[plan.members(0, 4)[2:]] = True           # group 0: 2 data lost, 4 parity in
    mask[plan.members(1, 4)[5:]] = True           # group 1: 5 lost, only 4 parity
    cov = plan.covered(mask)
    assert cov[plan.members(0)].all()             # whole: its unsent slots too
    assert not cov[plan.members(1)[:5]].any()     # not whole: its lost chunks still owed
    assert plan.whole(mask).tolist() == [True, False]


@pytest.mark.unit
def test_parity_follows_the_loss():
    rs = [fec.parity_for(p) for p in (0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.6)]
    assert rs[0] == 0                              # none at 0 %
    assert rs == sorted(rs) and 0 < rs[1] < rs[3] < rs[4] <= fec.RMAX
    assert rs[-1] == fec.RMAX                      # capped
