# SPDX-License-Identifier: Apache-2.0
"""`ltp exporter`: the real command as a subprocess, scraped over HTTP and
parsed with prometheus_client's own parser.

One rig (PS + 1 worker) serves the module, with the benchmark cluster on it:
the PS Endpoint in this process (one worker: it must still be listed as a
PS), the worker's Endpoint in its own process. Both publish their programs,
so the exporter and `ltp flows -j` read the same maps; after the rounds
stop, the two must agree number for number.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import urllib.request

import pytest

from conftest import WHY_NOT_BPF, requires_bpf
from ltp_cli import LTP, ltp, ltp_json

RIG = f"exp{os.getpid() % 100000}"
NEL = 20_000
ROUNDS = 4                      # after the cluster's warm-up round 0


# --------------------------------------------------------------------------- no rig needed

@pytest.mark.rig
@pytest.mark.parametrize("argv,needle", [
    (["exporter", "--port", "70000"], "--port"),
    (["exporter", "--port", "-1"], "--port"),
    (["exporter", "--listen", "localhost:80"], "--listen"),
])
def test_exporter_usage_errors_exit_2(argv, needle):
    err = json.loads(ltp(*argv, "-j", rc=2).stdout)
    assert err["exit_code"] == 2 and needle in err["error"]
    assert needle in ltp(*argv, rc=2).stderr


@pytest.mark.rig
def test_exporter_help_says_where_it_binds():
    out = ltp("exporter", "-h").stdout
    assert "default 127.0.0.1" in out and "examples:" in out


# --------------------------------------------------------------------------- on a rig

@pytest.fixture(scope="module")
def cluster():
    if WHY_NOT_BPF:
        pytest.skip(WHY_NOT_BPF)
    from ltpx.control.bench.cluster import LtpCluster
    from ltpx.control.transport.early_close import EarlyCloseConfig
    from ltpx.dataplane.rig.star import Rig, RigConfig
    with Rig(RigConfig(name=RIG, workers=1, loss=0.0)) as rig:
        cfg = EarlyCloseConfig(min_deadline_s=0.3, hard_timeout_s=10.0)
        with LtpCluster(rig, NEL, early_close=cfg) as cl:
            yield rig, cl


def _start_exporter() -> tuple[subprocess.Popen, dict]:
    p = subprocess.Popen([LTP, "exporter", "--port", "0", "-j"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        return p, json.loads(p.stdout.readline())
    except BaseException:
        p.kill()
        p.communicate()
        raise


@pytest.fixture
def exporter():
    p, info = _start_exporter()
    try:
        yield info
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _scrape(url: str) -> dict:
    """{(sample name, sorted labels): value} of one scrape, as Prometheus parses it."""
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _get(samples: dict, name: str, **labels):
    return samples.get((name, tuple(sorted((k, str(v)) for k, v in labels.items()))))


@pytest.mark.rig
@requires_bpf
def test_scrape_matches_flows_and_status(cluster, exporter):
    from ltpx.dataplane.xdp.maps import ROUND_REASONS
    from ltpx.dataplane.xdp.metrics import BUCKET_LABELS, FLOW_COUNTERS, LATE_LABELS
    rig, cl = cluster
    for r in range(1, ROUNDS + 1):
        rig.set_loss(0.05 if r > 2 else 0.0)   # some lost chunks: re-sent or filled
        cl.run_round(r, NEL, seed=r)
    rig.set_loss(0.0)

    m = _scrape(exporter["listening"])
    snaps = [s for s in ltp_json("flows") if s["netns"] in rig.namespaces]
    status = {r["netns"]: r for r in ltp_json("status") if r["netns"] in rig.namespaces}
    assert sorted(s["netns"] for s in snaps) == sorted([rig.ps.netns, rig.workers[0].netns])
    assert status[rig.ps.netns]["role"] == "ps"             # one worker, still the PS
    assert status[rig.workers[0].netns]["role"] == "worker"
    for s in snaps:
        p = {"netns": s["netns"], "dev": s["dev"], "job": f"{s['job']:#x}"}
        assert _get(m, "ltp_program_up", **p) == 1
        assert _get(m, "ltp_program_info", **p, role=s["role"], mode=s["mode"],
                    prog_id=s["prog_id"], state="ok") == 1
        for name, n in s["counters"].items():      # every XDP counter and drop class
            assert _get(m, "ltp_xdp_packets_total", **p, **{"class": name}) == n, name
        for f in s["flows"]:
            fl = dict(p, worker=f["worker"], slot=f["slot"])
            for key in FLOW_COUNTERS:
                assert _get(m, f"ltp_flow_{key}_total", **fl) == f[key], key
            for reason in ROUND_REASONS:
                assert _get(m, "ltp_flow_rounds_total", **fl, reason=reason) == \
                    f["rounds"][reason]
            recorded = sum(f["rounds"].values())
            hist = [_get(m, "ltp_flow_round_seconds_bucket", **fl, le=le) for le in BUCKET_LABELS]
            assert hist == sorted(hist) and hist[-1] == recorded  # cumulative, all timed
            assert _get(m, "ltp_flow_round_seconds_count", **fl) == recorded
            # who the rounds waited for: named rounds and the lateness histogram
            assert _get(m, "ltp_flow_straggler_rounds_total", **fl) == f["straggler_rounds"]
            late = [_get(m, "ltp_flow_lateness_seconds_bucket", **fl, le=le) for le in LATE_LABELS]
            assert late == sorted(late)
            if s["role"] == "ps":
                assert recorded == ROUNDS + 1 and f["packets"] > 0
                # one worker: always the median, never late: every round in bucket 0
                assert late[0] == late[-1] == recorded and f["straggler_rounds"] == 0
                assert f["lateness_p50_ms"] == f["lateness_p99_ms"] == 0.1
                assert 0 < _get(m, "ltp_flow_round_seconds_sum", **fl) < recorded * 10
                assert _get(m, "ltp_flow_delivered_ratio", **fl) == \
                    pytest.approx(1 - f["loss"])
                assert _get(m, "ltp_flow_last_round", **fl) == ROUNDS
                # the last round's loss budget: none was set here
                assert _get(m, "ltp_flow_loss_budget", **fl) == f["loss_budget_last"] == 0.0
            else:  # the worker received no downlink here: no rounds, no ratio
                assert recorded == 0 and _get(m, "ltp_flow_delivered_ratio", **fl) is None
                assert _get(m, "ltp_flow_loss_budget", **fl) is None
    ps = next(s for s in snaps if s["role"] == "ps")
    p = {"netns": ps["netns"], "dev": ps["dev"], "job": "0x17"}
    assert _get(m, "ltp_round_current", **p) == ROUNDS
    assert ps["round_now"]["state"] == "closed" and _get(m, "ltp_round_open", **p) == 0
    assert _get(m, "ltp_round_nchunks", **p) == ps["round_now"]["nchunks"]


@pytest.mark.rig
@requires_bpf
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_exporter_stops_on_a_signal_and_frees_its_port(sig):
    p, info = _start_exporter()
    try:
        assert _get(_scrape(info["listening"]), "ltp_scrape_duration_seconds") >= 0
        p.send_signal(sig)
        out, err = p.communicate(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0 and "Traceback" not in err, err
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((info["address"], info["port"]), timeout=2).close()
