# SPDX-License-Identifier: Apache-2.0
"""Control-plane policy without the kernel: layout, Bubble Filling, Early Close, rates."""
from __future__ import annotations

import math

import numpy as np

import pytest

from ltpx.control.transport import bubble
from ltpx.control.transport.early_close import EarlyClose, EarlyCloseConfig
from ltpx.control.transport.layout import ChunkLayout, as_f32
from ltpx.control.transport.rate import Pacer, SharePolicy


@pytest.mark.unit
def test_layout_never_splits_a_float():
    lay = ChunkLayout(1000, 1424)
    assert lay.chunk_elems == 356 and lay.nchunks == 3
    assert lay.last_len == (1000 - 712) * 4
    assert [lay.chunk_len(c) for c in range(3)] == [1424, 1424, 1152]
    assert lay.elem_range(2) == (712, 1000)
    assert lay.elem_mask([True, False, True]).sum() == 356 + 288
    with pytest.raises(ValueError):
        ChunkLayout(10, 1422)
    with pytest.raises(ValueError):
        ChunkLayout(0)


@pytest.mark.unit
def test_as_f32_names_what_is_wrong():
    with pytest.raises(TypeError, match="float32"):
        as_f32(np.zeros(3))
    with pytest.raises(TypeError, match="numpy"):
        as_f32([1.0, 2.0])
    with pytest.raises(ValueError, match="expected 4 elements"):
        as_f32(np.zeros(3, np.float32), 4)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert as_f32(a).shape == (6,)


def _values():
    rng = np.random.default_rng(0)
    return rng.standard_normal((3, 4, 5)).astype(np.float32)


@pytest.mark.unit
def test_mean_fill_is_the_mean_of_those_that_delivered():
    v = _values()
    orig = v.copy()
    masks = np.array([[1, 1, 0, 0], [1, 0, 1, 0], [0, 1, 1, 0]], dtype=bool)
    filled = bubble.fill(v, masks, "mean")
    assert filled.tolist() == [2, 2, 2]
    assert np.array_equal(v[masks], orig[masks])  # delivered untouched
    assert np.array_equal(v[0, 2], ((orig[1, 2].astype(np.float64) + orig[2, 2]) / 2).astype(np.float32))
    assert np.array_equal(v[1, 1], ((orig[0, 1].astype(np.float64) + orig[2, 1]) / 2).astype(np.float32))
    assert not v[:, 3].any()  # nobody delivered chunk 3: zeros
    # the average over workers equals the average over those that delivered
    assert np.allclose(v[:, 0].mean(0), orig[:2, 0].mean(0), atol=1e-6)


@pytest.mark.unit
def test_zero_and_stale_fill():
    v = _values()
    orig = v.copy()
    masks = np.ones((3, 4), dtype=bool)
    masks[1, 2] = masks[2, 0] = False
    bubble.fill(v, masks, "zero")
    assert not v[1, 2].any() and not v[2, 0].any()
    assert np.array_equal(v[masks], orig[masks])

    stale = np.full((3, 4, 5), 7.0, np.float32)
    valid = np.ones((3, 4), dtype=bool)
    valid[2, 0] = False
    v = orig.copy()
    bubble.fill(v, masks, "stale", stale, valid)
    assert (v[1, 2] == 7.0).all() and not v[2, 0].any()
    bubble.remember(stale, valid, v, masks)
    assert np.array_equal(stale[0], v[0]) and (stale[1, 2] == 7.0).all()


@pytest.mark.unit
def test_fill_rejects_unknown_strategy_and_bad_masks():
    with pytest.raises(ValueError, match="unknown bubble strategy"):
        bubble.fill(_values(), np.ones((3, 4), bool), "median")
    with pytest.raises(ValueError, match="masks shape"):
        bubble.fill(_values(), np.ones((3, 5), bool))
    with pytest.raises(ValueError, match="previous rounds"):
        bubble.fill(_values(), np.zeros((3, 4), bool), "stale")


def _ec(**kw):
    cfg = EarlyCloseConfig(min_deadline_s=0.01, **kw)
    ec = EarlyClose(1e9, cfg)
    ec.start_round(1_000_000)  # 8 ms at line rate -> deadline 16 ms
    return ec


@pytest.mark.unit
def test_early_close_rules():
    ec = _ec(repair_frac=0.0)  # the grace alone (the repair wait: test_early_close.py)
    assert ec.deadline_s == pytest.approx(0.016)
    nan = np.nan
    assert ec.decide(0.001, np.array([nan, nan]), np.zeros(2), True) is None
    assert ec.decide(0.002, np.array([0.0, 0.0]), np.array([1.0, 1.0]), True) == "complete"
    # both past the threshold: close once the grace (10% of time-to-threshold) has passed
    first = np.array([0.0, 0.001])
    assert ec.decide(0.010, first, np.array([0.9995, 1.0]), True) is None
    assert ec.decide(0.0115, first, np.array([0.9995, 1.0]), True) == "early"
    # critical data missing: only the hard timeout closes
    ec = _ec(hard_timeout_s=1.0)
    assert ec.decide(0.5, first, np.array([0.5, 1.0]), False) is None
    assert ec.decide(1.0, first, np.array([0.5, 1.0]), False) == "timeout"


@pytest.mark.unit
def test_deadline_and_absent_worker():
    ec = _ec()
    nan = np.nan
    # worker 1 sent nothing; worker 0 is done: wait absent_factor x deadline
    assert ec.decide(0.020, np.array([0.0, nan]), np.array([1.0, 0.0]), True) is None
    assert ec.decide(0.033, np.array([0.0, nan]), np.array([1.0, 0.0]), True) == "deadline"
    # a worker stuck below the threshold past its own deadline (seen stuck since 10 ms)
    ec = _ec()
    assert ec.decide(0.010, np.array([0.0, 0.0]), np.array([1.0, 0.5]), True) is None
    assert ec.decide(0.017, np.array([0.0, 0.0]), np.array([1.0, 0.5]), True) == "deadline"


@pytest.mark.unit
def test_early_close_adapts_threshold_and_deadline():
    ec = _ec()
    ec.end_round(total_bytes=1_000_000, delivered_bytes=1_000_000, active_s=0.016,
                 lost_fraction=0.02)
    ec.start_round(1_000_000)
    assert ec.loss_hat == pytest.approx(0.006)
    assert ec.threshold == pytest.approx(1 - 2 * 0.006)
    assert ec.rate_hat < 1e9  # measured 0.5 Gbit/s pulls the estimate down
    assert ec.deadline_s > 0.016  # ... and stretches the deadline
    for _ in range(20):
        ec.end_round(total_bytes=1, delivered_bytes=1, active_s=1, lost_fraction=0.5)
    ec.start_round(1_000_000)
    assert ec.threshold == ec.cfg.threshold_min  # clamped


@pytest.mark.unit
def test_share_policy_and_pacer_bucket():
    sp = SharePolicy(1e9, utilization=0.95)
    assert sp.share_bps(16) == pytest.approx(0.95e9 / 16)
    assert sp.share_kbps(1) == 950_000
    with pytest.raises(ValueError):
        SharePolicy(0)
    # senders under-delivering: shares grow, capped; over-delivering: back to 1
    for _ in range(50):
        assert sp.observe(0.5e9) or sp.boost == sp.max_boost
    assert sp.boost == sp.max_boost == 2.0
    assert sp.share_bps(16) == pytest.approx(2 * 0.95e9 / 16)
    while sp.boost > 1.0:
        sp.observe(0.99e9)
    assert sp.boost == 1.0 and not sp.observe(0.93e9)  # within 3% of the target: hold
    assert sp.observe(0.91e9) and sp.boost == pytest.approx(1.1)  # below 97% of it: grow
    p = Pacer(62.5e6, pkt_bytes=1500, min_sleep_s=0.0005, max_burst=4)
    assert p.burst == 3 and p.cap == 7  # 192 us per packet: 3 per wake-up
    p.set_rate(1e9)
    assert p.burst == 4  # capped


@pytest.mark.unit
def test_credit_is_buffer_plus_bdp_in_frames_capped_at_a_ring():
    from ltpx.control.transport.layout import FRAME_OVERHEAD
    from ltpx.control.transport.rate import RING_FRAMES, credit_window
    frame = 1424 + FRAME_OVERHEAD
    assert credit_window(1e9, 1424, 100 * frame) == 100
    assert credit_window(1e9, 1424, 100 * frame + frame - 1) == 100  # whole frames only
    assert credit_window(1e9, 1424, 10.0) == 1  # never below one packet
    # 4 MB + a BDP at 32 Gbit/s is ~3,300 frames: capped at the ring
    assert credit_window(32e9, 1424, 4.8e6) == RING_FRAMES
    assert credit_window(32e9, 1424, 4.8e6, ring_frames=0) == int(4.8e6 // frame)
    assert credit_window(32e9, 1424, 4.8e6, ring_frames=None) == int(4.8e6 // frame)
    assert credit_window(32e9, 1424, 4.8e6, ring_frames=64) == 64
    assert credit_window(1e9, 1424) == int((1e9 * 200e-6 / 8 + 32 * 1024) // frame)
    for bad in ({"credit_bytes": 0}, {"credit_bytes": -5}, {"ring_frames": -1}):
        with pytest.raises(ValueError):
            credit_window(1e9, 1424, **bad)


@pytest.mark.unit
def test_vectorised_headers_match_the_wire_packer():
    from ltpx.control.transport.push import data_headers
    from ltpx.dataplane.xdp import wire as W
    lay = ChunkLayout(1000, 1424)
    flags = np.array([W.F_CRITICAL, 0, W.F_LAST], dtype=np.uint16)
    h = data_headers(7, 70000, 513, 3, flags, lay)
    for c in range(3):
        assert bytes(h[c * W.HDR_LEN:(c + 1) * W.HDR_LEN]) == W.pack_header(
            worker=513, job=7, round=70000, chunk=c, nchunks=3, length=lay.chunk_len(c),
            flags=int(flags[c]))


@pytest.mark.unit
def test_loss_detector_judges_by_what_was_acked_after():
    from ltpx.control.transport.lossdetect import LossDetector
    det = LossDetector(reorder=2)
    det.sent.extend([5, 1, 9, 3, 7, 2])
    ack = lambda *cs: sum(1 << c for c in cs)  # noqa: E731
    assert det.lost(0) == []                      # nothing acked: nothing judged
    assert det.lost(ack(1, 3)) == [5]             # 3 is two after 5's successor
    assert det.lost(ack(1, 3)) == []              # each position is judged once
    assert det.lost(ack(1, 3, 2)) == [9]          # 2 acked: 9 and 3 judged; 7 too recent
    det.sent.extend([5, 9])                       # the re-sends go out again
    assert det.lost(ack(1, 3, 2, 7, 9)) == []     # 5 (re-sent) is within the window of 9
    det.sent.append(4)
    det.restart()                                 # a new pass covers all that is out
    assert det.lost(ack(1, 3, 2, 7, 9, 4)) == []


@pytest.mark.unit
def test_loss_detector_samples_the_round_trip_from_the_latest_acked_send():
    import math

    from ltpx.control.transport.lossdetect import LossDetector
    det = LossDetector()
    det.note([4, 2], 10.000)
    det.note([7], 10.001)
    det.note([1, 6], 10.002)
    assert det.lost(0, 10.0015) == [] and det.rtt == math.inf   # nothing acked yet
    det.lost((1 << 4) | (1 << 2), 10.0022)      # position 1 (sent at 10.000) acked
    assert det.rtt == pytest.approx(0.0022)
    det.lost((1 << 4) | (1 << 2) | (1 << 7), 10.0016)   # 7, sent at 10.001: a shorter one
    assert det.rtt == pytest.approx(0.0006)
    det.lost((1 << 4) | (1 << 2) | (1 << 7), 10.005)    # nothing newer acked: no sample
    assert det.rtt == pytest.approx(0.0006)
    det.lost(1 << 6, 10.009)                    # position 4 (10.002): longer, the min stays
    assert det.rtt == pytest.approx(0.0006)


@pytest.mark.unit
@pytest.mark.parametrize("rtts, want", [([math.inf, 0.0001], 0.002),   # one has none yet
                                        ([0.0001, 0.0001], 0.0005),    # floor
                                        ([0.0002, 0.0004], 0.001),     # 2 x the slowest + a read
                                        ([0.003, 0.0001], 0.002)])     # cap
def test_a_pass_tail_waits_twice_the_slowest_round_trip_within_bounds(rtts, want):
    from ltpx.control.transport.lossdetect import LossDetector
    from ltpx.control.transport.push import Push
    p = Push.__new__(Push)       # tail_wait reads only the detectors and who is done
    p.detectors = [LossDetector() for _ in rtts]
    for d, r in zip(p.detectors, rtts):
        d.rtt = r
    p.done_t = [False] * len(rtts)
    assert p.tail_wait() == pytest.approx(want)
    p.done_t[0] = True            # a done target no longer counts
    assert p.tail_wait() == pytest.approx(min(0.002, max(0.0005, 2 * rtts[1] + 0.0002)))


@pytest.mark.unit
def test_pass_runs_take_turns_between_targets():
    from ltpx.control.transport.lossdetect import pass_runs
    order = list(range(20))
    assert pass_runs(order, [0], [False]) == [(0, order)]  # one target: one run
    acked = [0, (1 << 3) | (1 << 9)]
    runs = pass_runs(order, acked + [0], [False, False, True])  # target 2 is done
    assert [t for t, _ in runs] == [0, 1, 0, 1, 0, 1]
    assert runs[0][1] == list(range(8)) and runs[1][1] == [0, 1, 2, 4, 5, 6, 7]
    assert 9 not in runs[3][1] and runs[5][1] == [16, 17, 18, 19]


def _picker(runs, acked, closed, short=-1, grp=-1):
    from ltpx.control.transport.lossdetect import BatchPicker
    p = BatchPicker(grp, short)
    p.start(runs, acked, closed)
    return p


@pytest.mark.unit
def test_batch_picker_sends_lost_chunks_first_and_skips_what_arrived():
    p = _picker([(0, [5, 1, 9, 3]), (1, [2, 4])], acked=[1 << 1, 0], closed=[False, False])
    p.urgent += [(1, 7), (1, 8), (0, 6)]
    assert p.pick(4)[:3] == (1, [7, 8], True)   # one target per batch
    assert p.pick(4)[:3] == (0, [6], True)
    assert p.pick(2)[:3] == (0, [5, 9], False)  # chunk 1 is acked: skipped
    assert p.pick(4)[:3] == (0, [3], False)
    p.closed[1] = True                           # a closed target gets nothing more
    assert p.pick(4)[:3] == (1, [], False)
    assert p.exhausted()


@pytest.mark.unit
def test_batch_picker_rewinds_one_cursor_whatever_the_batch_came_from():
    p = _picker([(0, [0, 1, 2, 3, 4])], acked=[0], closed=[False], short=2)
    tgt, batch, lost, at = p.pick(2)
    assert (tgt, batch, lost) == (0, [0, 1], False)
    p.rewind(at)                                 # the local queue was full: retry it
    tgt, batch, lost, at = p.pick(2)
    assert (tgt, batch, lost) == (0, [0, 1], False)
    p.urgent.append((0, 1))                      # found lost while the batch waited
    p.rewind(at)
    assert p.pick(2)[1:3] == ([1], True)         # what was found lost goes first,
    _, batch, lost, at = p.pick(2)
    assert (batch, lost) == ([0, 1], False)      # then the batch that waited
    p.urgent.append((0, 0))
    _, batch, lost, at = p.pick(2)
    assert (batch, lost) == ([0], True)
    p.rewind(at)
    assert p.pick(2)[1:3] == ([0], True)         # rewound to the same lost chunk
    assert p.pick(9)[1] == [2]                   # the short chunk ends a batch
    assert p.pick(9)[1] == [3, 4]
    assert p.exhausted()
    p.urgent.append((0, 2))
    assert not p.exhausted()
    p.start([], [0], [False])                    # a new pass: the queue is in its runs
    assert p.exhausted()


@pytest.mark.unit
def test_batch_picker_group_run_skips_what_every_open_target_has():
    p = _picker([(2, [0, 1, 2, 3])], acked=[0b0011, 0b0110], closed=[False, True], grp=2)
    p.acked_open = 0b0011  # target 1 is closed: only target 0 counts
    assert p.pick(4)[:3] == (2, [2, 3], False)


@pytest.mark.unit
def test_a_group_push_re_sends_each_lost_chunk_once_to_the_group():
    # Chunk 5 found lost at targets 0 and 2 while it waits: queued once for
    # the group; once a batch took it, a new loss of it queues it again.
    p = _picker([], acked=[0, 0, 0], closed=[False] * 3, grp=3)
    assert p.lost_to_group(5) and p.lost_to_group(7)
    assert not p.lost_to_group(5)
    assert p.urgent == [(3, 5), (3, 7)]
    assert p.pick(4)[:3] == (3, [5, 7], True)
    assert p.lost_to_group(5) and p.pick(4)[:3] == (3, [5], True)
    p.acked_open = 1 << 9                       # every open target has 9: not re-sent
    assert p.lost_to_group(9) and p.pick(4)[:3] == (3, [], True)


@pytest.mark.unit
def test_a_group_push_repair_pass_sends_what_several_lack_to_the_group_and_the_rest_alone():
    from ltpx.control.transport.lossdetect import group_pass
    order, full = [4, 0, 3, 1, 2], 0b11111
    # target 0 lacks 1 and 3, target 1 lacks 3 and 4, target 2 (silent: its
    # probes are its own) lacks everything
    acked = [0b10101, 0b00111, 0]
    chunks, single, lacks = group_pass(order, acked, full, [True, True, False])
    assert chunks == [3]                        # lacked by both: once, to the group
    assert single == {0: [1], 1: [4]}           # lacked by one: to it alone, in order
    assert lacks == {0: 2, 1: 2}                # what each would leave unanswered
    # as before the switch: the union, once, in the push's order
    assert group_pass(order, acked, full, [True, True, False], alone=False) == \
        ([4, 3, 1], {}, {0: 2, 1: 2})
    assert group_pass(order, [full, full], full, [True, True]) == ([], {}, {})
    # target 2 silent but open: what it lacks with one answering target goes
    # to the group (one packet for both), as a chunk RACK finds lost would
    chunks, single, _ = group_pass(order, acked, full, [True, True, False],
                                   open_=[True, True, True])
    assert chunks == [4, 3, 1] and single == {}


@pytest.mark.unit
def test_a_chunk_found_lost_goes_alone_only_where_every_other_open_target_has_it():
    from ltpx.control.transport.lossdetect import only_lacks
    acked = [0b001, 0b011, 0b111]              # chunk 1: target 0 lacks it; chunk 2: 0 and 1
    done = [False, False, False]
    assert only_lacks(acked, done, 0, 1) and not only_lacks(acked, done, 0, 2)
    done[1] = True                             # a target done needs nothing more
    assert only_lacks(acked, done, 0, 2)


@pytest.mark.unit
def test_retx_byte_sets_the_retx_flag_of_a_header():
    from ltpx.control.transport.push import RETX_BYTE, data_headers
    from ltpx.dataplane.xdp import wire as W
    lay = ChunkLayout(1000, 1424)
    flags = np.array([W.F_CRITICAL, 0, W.F_LAST], dtype=np.uint16)
    h = data_headers(7, 9, 1, 3, flags, lay).reshape(3, W.HDR_LEN)
    h[:, RETX_BYTE] |= W.F_RETX
    for c in range(3):
        assert W.unpack_header(bytes(h[c])).flags == int(flags[c]) | W.F_RETX


@pytest.mark.unit
def test_open_round_rows_and_critical_missing():
    from ltpx.control.transport.receiver import OpenRound
    lay = ChunkLayout(1000, 1424)  # 3 chunks
    st = OpenRound(4, lay, workers=[10, 11], slots=[2, 3], critical=None, reliable=False,
                   t_open=0.0)
    assert st.rows == slice(2, 4) and st.total == 6
    masks = np.array([[True, False, True], [False, True, True]])
    assert st.critical_missing(masks) == {}     # nothing critical asked for
    st = OpenRound(4, lay, [10, 11], [3, 1], np.array([True, True, False]), False, 0.0)
    assert st.rows == [3, 1]                    # not contiguous: indexed as a list
    assert st.critical_missing(masks) == {10: [1], 11: [0]}
    st = OpenRound(4, lay, [10, 11], [0, 1], None, True, 0.0)
    assert st.critical_missing(masks) == {10: [1], 11: [0]}  # reliable: every chunk


@pytest.mark.unit
def test_the_public_api_is_one_set_of_objects():
    import ltpx.control.transport as T
    from ltpx.control.transport import endpoint, results
    from ltpx.errors import TransportError
    assert set(T.__all__) == set(endpoint.__all__)
    for name in T.__all__:
        assert getattr(T, name) is getattr(endpoint, name)
    assert T.Peer is results.Peer and T.TransportError is TransportError


@pytest.mark.unit
def test_the_error_estimate_of_a_rounds_holes():
    """Workers' chunks = a common mean plus independent noise: with 10 % of
    the chunks missing at random, the filled aggregate is off by about
    sqrt(0.1) of its own sampling noise, and the estimate says so; the true
    error of the mean-filled aggregate agrees with vs_aggregate."""
    rng = np.random.default_rng(0)
    W, C, E = 8, 200, 64
    truth = rng.standard_normal((C, E)).astype(np.float32)
    values = (truth + 3 * rng.standard_normal((W, C, E))).astype(np.float32)
    masks = rng.random((W, C)) >= 0.1
    est = bubble.error_estimate(values, masks)
    assert est["vs_noise"] == pytest.approx(np.sqrt((~masks).mean()), rel=0.1)
    full = values.mean(axis=0)
    filled = values.copy()
    bubble.fill(filled, masks, "mean")
    true_rel = np.linalg.norm(filled.mean(axis=0) - full) / np.linalg.norm(full)
    assert est["vs_aggregate"] == pytest.approx(true_rel, rel=0.25)
    assert bubble.error_estimate(values, np.ones((W, C), bool)) == {"vs_noise": 0.0,
                                                                   "vs_aggregate": 0.0}


@pytest.mark.unit
def test_an_endpoint_config_is_checked_when_made_and_changed_by_replace():
    """EndpointConfig: one frozen object an endpoint is made with; a bad field
    is a ValueError at once (before any compile or attach), and `of` sets
    fields over a config, checking them again."""
    import dataclasses
    from ltpx.control.transport.endpoint_config import EndpointConfig
    from ltpx.control.transport.options import PushOptions
    base = EndpointConfig(job=7, capacity_bps=1e8, sender="socket")
    assert base.options.sender == "socket" and EndpointConfig().options.sender == "auto"
    again = EndpointConfig.of(base, self_id=3)
    assert (again.job, again.self_id, again.sender) == (7, 3, "socket") and base.self_id is None
    assert EndpointConfig.of(None) == EndpointConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.job = 8
    for bad, why in (({"role": "server"}, "role must be ps or worker"),
                     ({"bubble_strategy": "nearest"}, "unknown bubble strategy"),
                     ({"liveness_s": -1.0}, "liveness_s must be >= 0"),
                     ({"push_options": PushOptions(sender="xdp")}, "differ: give one")):
        with pytest.raises(ValueError, match=why):
            EndpointConfig.of(base, **bad)


@pytest.mark.unit
def test_a_push_spec_is_checked_when_made_and_its_default_patience_named_once():
    """PushSpec: what one push is given, one frozen object; its fields as
    keywords over a spec (`of`), a bad timeout refused at once; the default
    patience is PUSH_TIMEOUT_S, the one the endpoint's reliable pushes use."""
    import dataclasses
    import inspect
    from ltpx.control.transport.endpoint import Endpoint
    from ltpx.control.transport.options import PUSH_TIMEOUT_S, PushOptions, PushSpec
    spec = PushSpec(reliable=True, group=("198.18.0.255", 7410))
    more = PushSpec.of(spec, timeout_s=2.5, options=PushOptions(sender="socket"))
    assert (more.reliable, more.group, more.timeout_s, more.options.sender) == \
        (True, ("198.18.0.255", 7410), 2.5, "socket")
    assert spec.timeout_s == PUSH_TIMEOUT_S and PushSpec.of(None).critical is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.reliable = False
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        PushSpec.of(spec, timeout_s=0)
    for call in (Endpoint.push_reliable, Endpoint.push_deferred):
        assert inspect.signature(call).parameters["timeout_s"].default == PUSH_TIMEOUT_S
