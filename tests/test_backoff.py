# SPDX-License-Identifier: Apache-2.0
"""The dead-peer rule of the sender (control/transport/lossdetect.py: Backoff and
pass_runs' limits), driven with a clock of its own: no privileges needed.
The rig test (test_ownership.py) checks the same rule with real packets."""
from __future__ import annotations

import pytest

from ltpx.control.transport.lossdetect import (DEAD_AFTER, PROBE_BUDGET, RTO_MAX, RTO_MIN,
                                               SILENT_CHUNKS, Backoff, pass_runs)


@pytest.mark.unit
def test_pass_runs_limits_cap_a_target_and_zero_skips_it():
    order = list(range(20))
    runs = pass_runs(order, [0, 0, 0], [False] * 3, [3, None, 0])
    sent = {i: [c for t, cs in runs if t == i for c in cs] for i in range(3)}
    assert sent == {0: [0, 1, 2], 1: order, 2: []}


def _dead_push(nchunks: int, timeout: float, pass_s: float = 0.002, back: float | None = None):
    """What the send loop does against a peer that never answers (or, from
    `back` on, answers a send with CLOSED): (chunks sent, send times,
    whether it is dead at the timeout, when the push ended)."""
    t = 0.0
    bo = Backoff(1, nchunks, t)
    done, acked, closed = [False], [0], [False]
    sent, sends, sent_to = 0, [], set()
    while True:
        bo.listen(acked, closed, done, t, sent_to)
        sent_to = set()
        if closed[0]:
            return sent, sends, False, t
        if t > timeout:
            return sent, sends, bo.dead(done) == [0], t
        ready = bo.ready(done, t)
        if not any(ready):
            t += min(0.001, max(0.0, bo.next_due(done) - t))
            continue
        if not sends:
            runs = pass_runs(list(range(nchunks)), acked, [False])
        else:
            runs = pass_runs(list(range(nchunks)), acked, [not r for r in ready],
                             bo.limits(ready))
            bo.spend(runs)
        sent += sum(len(c) for _, c in runs)
        sends.append(t)
        sent_to = {i for i, _ in runs}
        t += pass_s
        if back is not None and t >= back:
            closed[0] = True


@pytest.mark.unit
@pytest.mark.parametrize("nchunks", [1, 2, 16, 57, 737])
@pytest.mark.parametrize("timeout", [0.5, 10.0, 60.0])
def test_a_dead_peer_gets_three_passes_and_a_chunk_a_second_and_is_named(nchunks, timeout):
    """Past the budget of PROBE_BUDGET passes a probe is one chunk, at most
    one per RTO_MAX once the back-off reached it (after about 1.3 s of
    doubling from RTO_MIN: 8 sends at most)."""
    sent, sends, dead, _ = _dead_push(nchunks, timeout)
    assert nchunks < sent <= (1 + PROBE_BUDGET) * nchunks + 8 + timeout / RTO_MAX
    assert dead and len(sends) >= DEAD_AFTER
    gaps = [b - a for a, b in zip(sends, sends[1:])]
    assert max(gaps) <= RTO_MAX + 0.01           # probes never stop before the timeout
    assert timeout - sends[-1] <= RTO_MAX + 0.01


@pytest.mark.unit
@pytest.mark.parametrize("nchunks", [1, 16, 737])
@pytest.mark.parametrize("back", [0.05, 0.5, 4.0, 25.0])
def test_a_target_back_from_silence_is_heard_within_the_longest_wait(nchunks, back):
    """A target silent for a while (an endpoint being remade) that answers
    once it is back ends the push within RTO_MAX of its return, whatever
    the round's size: its probes had not stopped."""
    _, _, dead, end = _dead_push(nchunks, 30.0, back=back)
    assert not dead and end <= back + RTO_MAX + 0.01


@pytest.mark.unit
def test_probes_back_off_exponentially_and_an_answer_resets_them():
    bo = Backoff(2, 160, 0.0)
    done, closed = [False, False], [False, False]
    bo.listen([0, 0], closed, done, 0.01, {0, 1})       # a pass both left unanswered
    assert bo.due == [pytest.approx(0.01 + RTO_MIN)] * 2
    assert bo.limits([True, True]) == [10, 10]          # probes: 1/16 of 160 chunks
    bo.listen([0, 0], closed, done, 0.03, {0, 1})       # a probe unanswered: the wait doubles
    assert bo.due == [pytest.approx(0.03 + 2 * RTO_MIN)] * 2
    assert bo.ready(done, 0.04) == [False, False]
    bo.listen([0b1, 0], closed, done, 0.04)              # target 0 answers, while waiting too
    assert bo.ready(done, 0.04) == [True, False]
    assert bo.limits([True, False]) == [None, 0]         # a full pass again
    assert bo.dead(done) == [1]
    bo.listen([0b1, 0], [False, True], done, 0.05)       # CLOSED is an answer
    assert bo.dead(done) == []


@pytest.mark.unit
def test_a_few_chunks_left_unanswered_are_no_silence_on_a_lossy_path():
    """A re-send pass of 3 chunks whose DATA or ACKs were all lost (13 times
    in 100 at 30 % loss each way) costs no back-off; SILENT_CHUNKS in a row
    unanswered do, as a whole round's pass does at once."""
    bo = Backoff(2, 160, 0.0)
    done, closed = [False, False], [False, False]
    bo.listen([0, 0], closed, done, 0.01, {0: 3, 1: 160})
    assert bo.ready(done, 0.01) == [True, False]        # 0 may go again at once; 1 waits
    assert bo.silent == [0, 1]
    for k in range(2, SILENT_CHUNKS // 3 + 1):
        bo.listen([0, 0], closed, done, 0.01 * k, {0: 3})
    assert bo.silent[0] == 0 and bo.unanswered[0] == 3 * (SILENT_CHUNKS // 3)
    bo.listen([0, 0], closed, done, 0.1, {0: 3})        # 12 unanswered in a row: silent now
    assert bo.silent[0] == 1 and bo.due[0] == pytest.approx(0.1 + RTO_MIN)
    bo.listen([0b1, 0], closed, done, 0.11)              # an answer starts the count again
    assert bo.silent[0] == 0 and bo.unanswered[0] == 0
