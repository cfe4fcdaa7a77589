# SPDX-License-Identifier: Apache-2.0
"""`ltp bench loss` end to end on a small sweep (numbers are not asserted
against goals: speed belongs to the benchmark), and its variant parsing."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import requires_bpf
from ltpx.control.bench.loss_sweep import parse_variants, table
from ltpx.errors import UsageError

LTP = [sys.executable, "-m", "ltpx.tools.cli"]


@pytest.mark.unit
def test_variants_parse_and_bad_ones_are_usage_errors():
    vs = parse_variants("ltp,ltp:budget=0.35:code=rs,tcp,ltp:loss=defer:budget=0.5,"
                        "ltp:loss=repair")
    assert [(v.transport, v.budget, v.code, v.loss) for v in vs] == [
        ("ltp", 0.0, "off", "auto"), ("ltp", 0.35, "rs", "auto"), ("tcp", 0.0, "off", "auto"),
        ("ltp", 0.5, "off", "defer"), ("ltp", 0.0, "off", "repair")]
    assert vs[1].env == {"LTP_DOWNLINK_CODE": "rs"} and vs[2].env == {}
    (w,) = parse_variants("ltp:warmup=40:loss=auto")     # the policy's warm-up, per run
    assert w.env == {"LTP_DOWNLINK_CODE": "off", "LTP_LOSS_WARMUP": "40"} and w.loss == "auto"
    f32, half = parse_variants("ltp:compress=none,ltp:loss=repair:compress=bf16")
    assert (f32.compress, half.compress, half.loss, vs[0].compress) == \
        ("none", "bf16", "repair", "auto")
    for bad, word in (("quic", "cannot read"), ("ltp:budget=2", "budget"),
                      ("ltp:budget=x", "budget"), ("ltp:code=xor", "code"),
                      ("ltp:loss=drop", "loss is auto or repair or defer"),
                      ("ltp:code=rs:loss=defer", "does not combine"),
                      ("ltp:loss=defer:compress=bf16", "does not combine"),
                      ("ltp:speed=1", "keys"), ("tcp:budget=0.3", "cannot read"),
                      ("ltp:warmup=-1", "step count"), ("ltp:warmup=ten", "step count"),
                      ("ltp:warmup=\u00b2", "step count"),
                      ("ltp:warmup=5:loss=repair", "auto's"), ("ltp:warmup=5:budget=0.3", "auto's"),
                      ("ltp:compress=fp8", "compress is"),
                      ("ltp,ltp", "twice")):
        with pytest.raises(UsageError, match=word):
            parse_variants(bad)


@pytest.mark.rig
@pytest.mark.slow
@requires_bpf
def test_a_small_sweep_reports_every_variant_against_its_lossless_run():
    out = subprocess.run(LTP + ["bench", "loss", "--loss", "0,0.2", "--variants",
                                "ltp,ltp:budget=0.35", "--workers", "2", "--iterations", "14",
                                "--name", "hdloss", "-j"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout)
    assert res["config"]["variants"] == ["ltp", "ltp:budget=0.35"]
    for label in ("ltp", "ltp:budget=0.35"):
        per = res["results"][label]
        assert set(per) == {"0.0", "0.2"}
        assert per["0.0"]["vs_lossless"] == 1.0 and per["0.0"]["accuracy_pp"] == 0.0
        # nothing injected; a queue overflow on 2 busy cores is real loss, and
        # Early Close may rightly cut a round by a chunk (1 in ~6000 seen)
        assert per["0.0"]["delivered_fraction"] >= 0.999
        assert per["0.0"]["filled_error_mean"] < 0.05
        assert per["0.2"]["iterations_per_s"] > 0 and per["0.2"]["replicas_identical"]
        # an evaluation at a quarter of the run (14 // 4 = step 3), as at its end
        assert all(0 < r["quarter_accuracy"] <= 1 for r in per.values())
        assert len(res["runs"][label]["0.2"]) == 1
    assert "[4/4]" in out.stderr                       # progress, one line a run


@pytest.mark.rig
@pytest.mark.slow
@requires_bpf
def test_a_run_that_fails_is_kept_and_the_sweep_goes_on(tmp_path):
    # TCP cubic at 30 % loss on every port cannot make 3 steps in 40 s; it
    # runs first, and LTP's run after it is still made and reported. The
    # failed run's logs are kept for its user, in TMPDIR: here the test's own
    out = subprocess.run(LTP + ["bench", "loss", "--loss", "0.3", "--variants", "tcp,ltp",
                                "--workers", "2", "--iterations", "3", "--run-timeout", "40",
                                "--name", "hdlfail", "-j"],
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert out.returncode == 1, out.stderr[-2000:]
    res = json.loads(out.stdout)                    # one JSON document, every run in it
    assert res["config"]["run_timeout_s"] == 40.0
    tcp, ltp = res["results"]["tcp"]["0.3"], res["results"]["ltp"]["0.3"]
    assert "longer than 40s" in tcp["error"] and tcp["runs_failed"] == 1
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("ltp-train-hdlfail-")]
    assert len(kept) == 1 and str(kept[0]) in tcp["error"], (tcp["error"], kept)
    assert ltp["iterations_per_s"] > 0 and ltp["runs_failed"] == 0 and ltp["replicas_identical"]
    assert [(f["variant"], f["loss"]) for f in res["failed"]] == [("tcp", 0.3)]
    assert "1 run(s) failed" in out.stderr and "[2/2] loss 0.3 ltp:" in out.stderr
    lines = table(res).splitlines()                 # the text form: the failed row says so
    assert any(ln.split()[:3] == ["tcp", "0.3", "failed:"] for ln in lines), lines
    assert any(ln.split()[:2] == ["ltp", "0.3"] and "failed" not in ln for ln in lines)
