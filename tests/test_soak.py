# SPDX-License-Identifier: Apache-2.0
"""`ltp bench soak` through the real command: a short soak of a real `ltp
train` job on a rig of its own, whose report is checked against what the
test itself reads from /proc and the kernel while it runs; Ctrl-C in the
middle leaves nothing behind; bad flags are usage errors. Whether a short
soak is flat is not asserted (that is the benchmark's finding), only that
the exit code agrees with the report."""
from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from conftest import requires_bpf, sigint_default
from ltp_cli import LTP, ltp

RIG = "soakt"          # names unique to this file: ltp-soakt-* namespaces
RIG_INT = "soakti"
WORKERS = 2


def _ranks_of(rig: str) -> dict[int, int]:
    """rank -> pid of the training ranks running in rig `rig`'s namespaces,
    read from /proc the way an operator would (LTP_RANK and LTP_NETNS)."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if env.get(b"LTP_NETNS", b"").startswith(f"ltp-{rig}-".encode()) and b"LTP_RANK" in env:
            out[int(env[b"LTP_RANK"])] = int(name)
    return out


def _namespaces(rig: str) -> list[str]:
    return [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                      text=True).stdout.split() if n.startswith(f"ltp-{rig}-")]


def _gone(rig: str) -> None:
    """Whatever a test left of rig `rig` is removed, and the log folders an
    interrupted `ltp train` keeps."""
    from ltpx.dataplane.rig.star import Rig
    if Rig.exists(rig):
        Rig.destroy(rig)
    for d in glob.glob(os.path.join(tempfile.gettempdir(), f"ltp-train-{rig}-*")):
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.rig
@pytest.mark.parametrize("args", [
    ["--minutes", "0"], ["--minutes", "nan"], ["--minutes", "2000"], ["--sample-s", "0.1"],
    ["--minutes", "1", "--sample-s", "61"], ["--minutes", "1", "--warmup-s", "60"],
    ["--workers", "0"], ["--workers", "65"], ["--loss", "1"], ["--loss", "x"],
    ["--name", "Bad-Name"], ["--name", "waytoolongname"],
])
def test_bad_values_are_usage_errors(args):
    p = ltp("bench", "soak", *args, "-j", rc=2)
    err = json.loads(p.stdout)
    assert err["exit_code"] == 2 and err["error"].startswith("--"), err


@pytest.mark.rig
@pytest.mark.parametrize("args", [["--bogus"], ["--minutes"], ["--minutes", "ten"]])
def test_bad_flags_exit_2(args):
    p = ltp("bench", "soak", *args, rc=2)
    assert "usage:" in p.stderr


@pytest.mark.rig
@requires_bpf
def test_short_soak_reports_the_real_job():
    proc = subprocess.Popen([LTP, "bench", "soak", "--minutes", "0.4", "--workers", str(WORKERS),
                             "--sample-s", "1", "--warmup-s", "1", "--name", RIG, "-j"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict[int, int] = {}
    try:
        end = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < end:
            seen.update(_ranks_of(RIG))       # our own look at the job's processes
            time.sleep(0.5)
        out, err = proc.communicate(timeout=max(1, end - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _gone(RIG)
    assert proc.returncode in (0, 1), (proc.returncode, out, err[-2000:])
    rep = json.loads(out)
    assert "error" not in rep, rep
    assert (proc.returncode == 0) == rep["flat"] == (not rep["grew"])

    # every rank was sampled through the judged part, and they are the job's real processes
    ranks = {p["rank"]: p for p in rep["processes"] if p["rank"] is not None}
    assert sorted(ranks) == list(range(WORKERS + 1))
    assert {r: p["pid"] for r, p in ranks.items()} == seen
    for p in ranks.values():
        assert p["samples_judged"] >= 1
        assert p["rss_kb"]["start"] > 100 * 1024          # torch is loaded in every rank
        assert p["fds"]["start"] > 3
    train = [p for p in rep["processes"] if p["label"] == "ltp train"]
    assert len(train) == 1 and train[0]["pid"] == rep["job"]["pid"]
    assert rep["job"]["stopped_by"] == "SIGTERM" and rep["job"]["restarts"] == 0
    assert 0 < rep["job"]["stop_s"] < 60 and rep["job"]["exit_code"] == 128 + signal.SIGTERM
    assert rep["job"]["end_s"] >= 0.4 * 60 - 1         # the job ran the whole soak

    # one sample a second (progress lines on stderr too), the judged ones after warm-up
    assert 20 <= rep["samples"] == len(rep["series"]) <= 27
    assert sum(1 for ln in err.splitlines() if "ranks " in ln and "rss " in ln) == rep["samples"]
    assert rep["samples_judged"] == sum(s["phase"] == "soak" for s in rep["series"]) >= 1

    # BPF: each rank's ltp_xdp and the switch's xdp_pass while it ran, none at rest or after;
    # the machine's counts include the job's
    bpf = rep["bpf"]
    assert bpf["job_progs"]["rest"] == 0 and bpf["job_progs"]["after"] == 0
    assert bpf["job_progs"]["start"] >= WORKERS + 1
    assert bpf["job_maps"]["start"] > bpf["job_progs"]["start"]
    assert bpf["progs"]["start"] >= bpf["job_progs"]["start"]
    assert bpf["maps"]["start"] >= bpf["job_maps"]["start"]
    # LTP records: one per rank's endpoint, none left
    assert rep["records"]["job_records"]["start"] == WORKERS + 1
    assert rep["records"]["job_records"]["after"] == 0
    left = rep["leftovers"]
    assert {k: left[k] for k in ("progs", "maps", "records", "processes", "rig")} == {
        "progs": [], "maps": [], "records": [], "processes": [], "rig": False}
    # every process of the job was seen to exit after the SIGTERM
    assert all(p["exit_after_sigterm_s"] is not None for p in rep["processes"]
               if p["last_s"] == rep["job"]["end_s"])
    assert not _namespaces(RIG)


@pytest.mark.rig
@requires_bpf
def test_ctrl_c_stops_the_job_and_removes_its_rig():
    proc = subprocess.Popen([LTP, "bench", "soak", "--minutes", "5", "--workers", "1",
                             "--sample-s", "1", "--name", RIG_INT],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_default)
    try:
        end = time.monotonic() + 60
        while not _ranks_of(RIG_INT) and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.2)
        ranks = _ranks_of(RIG_INT)
        assert ranks, "the job's ranks never started"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        leftover = _namespaces(RIG_INT)
        _gone(RIG_INT)
    assert proc.returncode == 130, (out, err[-2000:])
    assert "interrupted" in err
    assert not leftover
    assert not _ranks_of(RIG_INT)        # every rank stopped with the job
