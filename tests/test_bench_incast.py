# SPDX-License-Identifier: Apache-2.0
"""`ltp bench incast` end to end on a small configuration (numbers are not
asserted against goals: speed belongs to the benchmark, not the tests)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import requires_bpf
from ltpx.control.transport.early_close import EarlyCloseConfig

LTP = [sys.executable, "-m", "ltpx.tools.cli"]


# what the rig delivers with no loss injected: Early Close's threshold after a
# real queue drop (1 - 2 loss_hat, at most 0.999) may cut a round by a chunk
DELIVERED_LOSSLESS = 0.99


def bench(*argv: str) -> tuple[dict, float]:
    """(JSON, wall seconds) of `ltp bench incast ARGV -j` on a rig of this file's own."""
    t0 = time.monotonic()
    out = subprocess.run(LTP + ["bench", "incast", "--name", "hdbench", "-j", *argv],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout), time.monotonic() - t0


def check_cpu_and_goodput(res: dict, wall_s: float) -> None:
    """cpu_s_per_round and goodput_bps are there and plausible: positive, CPU no
    more than the machine has over the whole command, goodput no more than the
    payload of a round over its fastest time."""
    c = res["config"]
    ncpu = os.cpu_count()
    assert c["ncpu"] == ncpu
    bits = c["workers"] * c["size_bytes"] * 8
    for name, r in res["results"].items():
        assert r["rounds"] == c["rounds"], name
        # the machine's busy CPU from /proc/stat, in 10 ms ticks: a few short
        # rounds can sum to 0 ticks
        assert 0 <= r["cpu_s_per_round"] <= wall_s * ncpu / r["rounds"], (name, r)
        assert 0 < r["goodput_bps"] <= bits / min(r["round_s"]) * 1.0001, (name, r)
    first = next(t for t in res["results"] if t.startswith("ltp"))
    for t, o in res["ltp_over"].items():
        r, ltp = res["results"][t], res["results"][first]
        assert o["goodput"] == pytest.approx(ltp["goodput_bps"] / r["goodput_bps"])
        assert o["cpu_s_per_round"] == (pytest.approx(ltp["cpu_s_per_round"] /
                                                      r["cpu_s_per_round"])
                                        if r["cpu_s_per_round"] > 0 else None)
    for a, row in res["ratios"].items():  # every LTP transport over every other one
        assert a.startswith("ltp") and set(row) == set(res["results"]) - {a}
        for b, q in row.items():
            ra, rb = res["results"][a], res["results"][b]
            assert q["median"] == pytest.approx(ra["median_s"] / rb["median_s"])
            assert q["p99"] == pytest.approx(ra["p99_s"] / rb["p99_s"])
            assert q["goodput"] == pytest.approx(ra["goodput_bps"] / rb["goodput_bps"])


@pytest.mark.rig
@requires_bpf
def test_small_incast_bench_gives_documented_json_and_a_plot(tmp_path):
    png = tmp_path / "incast.png"
    # rounds of a few ms or more: /proc/stat counts CPU time in 10 ms ticks
    res, wall = bench("--workers", "2", "--rounds", "3", "--size", "1MiB", "--plot", str(png))
    assert set(res) >= {"config", "limit_s", "results", "speedup", "ltp_over"}
    assert res["limit_s"] == pytest.approx(2 * (1 << 20) * 8 / 1e9)
    assert set(res["results"]) == {"ltp", "tcp-cubic", "tcp-bbr"}
    for r in res["results"].values():
        assert {"median_s", "p99_s", "max_s", "median_over_limit", "p99_over_limit",
                "delivered"} <= set(r)
        assert 0.0 <= r["delivered"] <= 1.0
        assert 0 < r["median_s"] <= r["p99_s"] <= r["max_s"]
        assert r["median_over_limit"] == pytest.approx(r["median_s"] / res["limit_s"])
    assert set(res["speedup"]) == set(res["ltp_over"]) == {"tcp-cubic", "tcp-bbr"}
    check_cpu_and_goodput(res, wall)
    import matplotlib.image as mpimg
    img = mpimg.imread(png)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


@pytest.mark.rig
@requires_bpf
def test_one_worker_is_a_single_flow_measurement():
    """--workers 1: one flow, uncongested; every figure of both transports is there."""
    res, wall = bench("--workers", "1", "--rounds", "3", "--size", "4MiB", "--rate", "32gbit",
                      "--buffer", "4mb", "--transports", "ltp,tcp-cubic",
                      "--early-close", "progress,capacity")
    assert res["config"]["workers"] == 1
    assert res["limit_s"] == pytest.approx((4 << 20) * 8 / 32e9)
    # LTP once under each Early Close rule, in alternating blocks
    assert list(res["results"]) == ["ltp@progress", "ltp@capacity", "tcp-cubic"]
    assert [res["results"][t]["early_close"] for t in ("ltp@progress", "ltp@capacity")] == \
        ["progress", "capacity"]
    assert res["results"]["tcp-cubic"]["delivered"] == 1.0
    check_cpu_and_goodput(res, wall)


@pytest.mark.rig
@requires_bpf
def test_both_senders_and_cubic_take_turns_in_one_run():
    """--transports ltp-xdp,ltp-socket,tcp-cubic: blocks alternate in that
    order on one rig, the clock's rounds are made by the clock and the
    socket's by the socket, and each LTP sender gets its ratios to cubic."""
    res, wall = bench("--workers", "2", "--rounds", "4", "--block", "2", "--size", "1MiB",
                      "--transports", "ltp-xdp,ltp-socket,tcp-cubic")
    order = ["ltp-xdp", "ltp-socket", "tcp-cubic"]
    assert list(res["results"]) == order and res["config"]["block"] == 2
    assert res["schedule"] == [[t, 2] for t in order] * 2
    xdp, sock = res["results"]["ltp-xdp"], res["results"]["ltp-socket"]
    assert (xdp["sender"], sock["sender"]) == ("xdp", "socket")
    assert xdp["sent"] > 0 and sock["sent"] > 0
    assert xdp["clock_share"] > 0.5  # most DATA grew out of ACKs in XDP
    assert sock["clock_share"] == 0.0
    for t in order[:2]:
        assert sum(res["results"][t]["reasons"].values()) == 4
        assert res["ratios"][t]["tcp-cubic"]["goodput"] > 0
    assert set(res["ratios"]) == {"ltp-xdp", "ltp-socket"}
    assert set(res["speedup"]) == {"ltp-socket", "tcp-cubic"}  # against the first LTP's
    check_cpu_and_goodput(res, wall)


@pytest.mark.rig
@requires_bpf
def test_plain_ltp_sends_as_an_endpoint_does_by_default():
    """Without --sender, plain ltp's sender is the endpoints' default: auto
    (the clock, per push, where the grow check passes, but the socket toward
    a path that lost over 6 % of its packets; lossless, the clock makes most
    DATA), else the socket; the JSON says which and why."""
    from ltpx.dataplane.doctor.growcheck import grow_verdict
    res, _ = bench("--workers", "2", "--rounds", "2", "--block", "2", "--size", "256KiB",
                   "--transports", "ltp")
    r, cfg = res["results"]["ltp"], res["config"]
    assert sum(r["pushes"].values()) == sum(r["sender_whys"].values()) == 2 * 2
    if grow_verdict("native").ok:
        assert cfg["sender"] == r["sender"] == "auto"
        assert cfg["sender_why"].startswith("auto, xdp: the default, ")
        # an incast into a 30 kB queue on 2 busy cores can drop for real (or
        # the clock re-send early): auto then rightly takes the socket toward
        # that path for a few pushes, and says so; the clock's pushes are
        # still the clock's
        for why in r["sender_whys"]:
            assert why.startswith("xdp: the default, ") or (
                why.startswith("socket: auto, ") and "lost (the ACK clock again below" in why)
        if set(r["pushes"]) == {"xdp"}:
            assert r["clock_share"] > 0.5
        assert r["pushes"].get("xdp", 0) + r["pushes"].get("socket", 0) == 4
    else:
        assert cfg["sender"] == r["sender"] == "socket" and r["clock_share"] == 0.0
        assert cfg["sender_why"].startswith("socket: the fallback, ")
        assert set(r["pushes"]) == {"socket"}
    # nothing injected, but an incast into a 30 kB queue on 2 busy cores can
    # drop for real, and the paper's rule may then rightly close a round a
    # chunk short (0.9946 seen once in a local CI: 2 of 368 chunks)
    assert r["delivered"] >= DELIVERED_LOSSLESS


@pytest.mark.rig
@requires_bpf
def test_a_knob_makes_its_own_variant_in_the_same_run():
    """ltp-xdp:credit=1 and ltp-xdp take turns on one rig, each with its own
    credit at the PS (the default: the rig's buffer plus one BDP, at most a
    receive ring), and both deliver whole rounds (but for a real drop a round
    may be closed without: DELIVERED_LOSSLESS)."""
    from ltpx.control.transport.rate import RING_FRAMES
    res, wall = bench("--workers", "2", "--rounds", "4", "--block", "2", "--size", "1MiB",
                      "--transports", "ltp-xdp:credit=1,ltp-xdp")
    assert res["schedule"] == [["ltp-xdp:credit=1", 2], ["ltp-xdp", 2]] * 2
    capped, plain = res["results"]["ltp-xdp:credit=1"], res["results"]["ltp-xdp"]
    assert capped["credit_frames"] == 1
    assert 1 < plain["credit_frames"] <= RING_FRAMES
    assert capped["sender"] == plain["sender"] == "xdp"
    assert min(capped["delivered"], plain["delivered"]) >= DELIVERED_LOSSLESS   # as above
    assert res["ratios"]["ltp-xdp:credit=1"]["ltp-xdp"]["goodput"] > 0
    check_cpu_and_goodput(res, wall)


@pytest.mark.rig
@pytest.mark.slow
@requires_bpf
def test_no_round_is_cut_on_a_loss_free_rig():
    """300 rounds per sender on a rig with no loss configured, both senders
    taking turns: hardly a round (1 % at most) is cut while what it misses
    is a re-send away.
    Before the repair wait, the incast's queue drops (or a late re-send on
    busy cores) left a chunk or two of 737 missing, and the grace cut 10-15
    of 150 ACK-clock rounds (this file's knob test failed on it once in CI)."""
    res, _ = bench("--workers", "2", "--rounds", "300", "--block", "50", "--size", "1MiB",
                   "--transports", "ltp-xdp,ltp-socket")
    c = EarlyCloseConfig()
    allowance = c.repair_frac * 737    # 1 MiB: 737 chunks
    for name in ("ltp-xdp", "ltp-socket"):
        r = res["results"][name]
        # The incast overflows the rig's queue (path_drops counts the
        # packets): re-sends repair what a flow lost. A round may close with
        # chunks missing where a flow lost more than a repair is waited for
        # (cores so busy the senders' re-sends lag: 2 CPU hogs beside it
        # here cut 3-7 socket-sender rounds of 300, each missing 10+ chunks),
        # and, the repair's wait being bounded (repair_factor x the longest
        # repair seen lately), where a re-send lagged past it: on two cores
        # shared with a training job, 1 round of 300 cut missing 7. What the
        # repair wait promises is that such cuts are rare (1 % at most here),
        # not that none happens on a busy host; without it 7-10 % were cut.
        assert r["rounds"] == 300
        small = [w for w in r["cut_worst"] if w <= allowance]
        assert len(small) <= 3, (name, r["cut_worst"], r["reasons"])
        assert len(r["cut_worst"]) == 300 - r["reasons"].get("complete", 0)


@pytest.mark.rig
def test_bad_flags_are_usage_errors():
    for argv, word in ((["--sender", "xdp,socket"], "--transports ltp-xdp,ltp-socket"),
                       (["--sender", "xdp", "--transports", "ltp-xdp,tcp-cubic"], "ltp only"),
                       (["--transports", "ltp,ltp-xdp"], "cannot be combined"),
                       (["--transports", "ltp-xdp,ltp-xdp"], "twice"),
                       (["--block", "0"], "--block"),
                       (["--early-close", "progress,fast"], "--early-close"),
                       (["--early-close", "capacity,capacity"], "--early-close"),
                       (["--transports", "ltp,quic"], "--transports"),
                       (["--transports", "ltp-xdp:window=3"], "not a knob"),
                       (["--transports", "ltp-xdp:credit=-1"], "not a knob"),
                       (["--transports", "ltp-xdp:credit=1:credit=2"], "twice"),
                       (["--transports", "tcp-cubic:credit=1"], "ACK clock"),
                       (["--transports", "ltp-xdp@capacity"], "--transports"),
                       (["--transports", "ltp@"], "--transports"),
                       (["--transports", "ltp-xdp:credit=\u00b2"], "not a knob"),
                       (["--transports", "ltp-xdp:poll=20000"], "at most"),
                       (["--transports", "ltp-xdp:rto=17"], "at most"),
                       (["--transports", "ltp-socket:credit=1"], "ACK clock"),
                       (["--sender", "socket", "--transports", "ltp:credit=1"], "--sender xdp"),
                       (["--size", "10"], "--size"), (["--loss", "1.5"], "--loss"),
                       (["--sweep-workers", "4,x"], "--sweep-workers"),
                       (["--rate", "fast"], "--rate"), (["--name", "Bad-Name"], "--name")):
        out = subprocess.run(LTP + ["bench", "incast", *argv], capture_output=True, text=True)
        assert out.returncode == 2, (argv, out.stderr)
        assert word in out.stderr
