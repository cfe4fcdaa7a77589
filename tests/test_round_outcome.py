# SPDX-License-Identifier: Apache-2.0
"""A round's reported outcome is what arrived (control/transport/receiver.py,
collect): the receiver decides to close from its counters, then closes the
bank, and chunks that land in between can make the round whole; it is then
`complete`, whatever the decision said (a lossless run reports every round
complete). Real endpoints on a rig of one worker: a whole push, collected
as if Early Close had decided first."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from conftest import requires_bpf, star_rig
from ltpx.control.transport import Peer
from ltpx.control.transport.early_close import COMPLETE, EARLY
from ltpx.control.trust import tokens

pytestmark = [requires_bpf, pytest.mark.rig]
NEL = 20_000
JOB = 0x0C7


@pytest.fixture(scope="module")
def rig():
    yield from star_rig(name=f"ro{os.getpid() % 100000}", workers=1)


@pytest.fixture(scope="module")
def pair(rig):
    from ltpx.control.transport import Endpoint
    secret = tokens.new_secret()
    ps_h, w_h = rig.ps, rig.workers[0]
    with Endpoint(ps_h.ifname, ps_h.ip, {0: 0}, NEL, ns=ps_h.netns, job=JOB, secret=secret,
                  publish=False) as ps, \
            Endpoint(w_h.ifname, w_h.ip, {0: 0}, NEL, ns=w_h.netns, job=JOB, secret=secret,
                     self_id=0, publish=False) as wk:
        yield ps, wk


def test_a_round_whole_at_its_close_is_complete_whatever_closed_it(pair):
    ps, wk = pair
    x = np.random.default_rng(3).standard_normal(NEL).astype(np.float32)
    ps.open_round(1, NEL)
    rep = wk.push(1, x, Peer(0, ps.ip))
    assert rep.acked == rep.chunks           # every chunk is in the PS's bank
    rx = ps.receiver
    st = rx.rounds[1]
    ps.maps.close_bank(1)
    now = time.perf_counter()
    res = rx.collect(st, EARLY, now, now)    # as if Early Close had decided first
    assert res.reason == COMPLETE and res.delivered_fraction == 1.0
    np.testing.assert_array_equal(res.values[0], x)
