# SPDX-License-Identifier: Apache-2.0
"""The flight recorder and the hang report (issue 28, docs/slow-or-stuck.md):
SIGUSR1 to a rank writes its ring as a valid JSON file; a rank that waits past
its stall threshold writes one by itself; a SIGSTOPped worker of a real
`ltp train` job is named by the launcher's screen, with the op it stopped in
and its last packet's age, long before the liveness check's dead_s, and the
job goes on without it as --max-missed says."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import requires_bpf

# a rank's stand-in: the recorder as ltpx.torch starts it, a few ops, then a
# wait that never ends (SIGUSR1 and the stall watchdog must still dump)
RANK = textwrap.dedent("""
    import sys, time
    from ltpx.control.torchapi import flight
    rec = flight.start(2, flight.WORKER, 1, records=lambda: [{"op": 1, "kind": "step"}])
    for s in range(1, 9):
        flight.enter(flight.BARRIER, s)
        time.sleep(0.05)
        flight.enter(flight.PUSH, s, 2 * s)
        flight.enter(flight.PULL, s)
        flight.heard(0, time.perf_counter_ns())
        flight.enter(flight.COMPUTE, s)
    flight.enter(flight.BARRIER, 9)
    print("waiting", flush=True)
    time.sleep(120)
""")


def _rank(folder, **env):
    p = subprocess.Popen([sys.executable, "-c", RANK], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "LTP_FLIGHT_DIR": str(folder), **env})
    assert p.stdout.readline().strip() == "waiting"
    return p


def _wait_dump(path, reason, timeout_s=30.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with open(path) as f:
                d = json.load(f)
            if d["reason"] == reason:
                return d
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"no {reason} dump at {path} in {timeout_s} s")


def _check_ring(d):
    assert d["rank"] == 2 and d["role"] == "worker" and d["index"] == 1
    assert d["now"]["seq"] == 9 and d["now"]["phase"] == "barrier"
    assert d["ops"] == 8 and 0.04 < d["median_op_s"] < 5
    assert d["peers"]["0"]["last_packet_age_s"] >= d["now"]["for_s"] - 0.01
    ev = d["events"]       # oldest first: the phase changes of the ops above
    assert [e["phase"] for e in ev[:5]] == ["start", "barrier", "push", "answer", "compute"]
    assert [e["seq"] for e in ev[-5:]] == [8, 8, 8, 8, 9]
    assert all(a["age_s"] >= b["age_s"] for a, b in zip(ev, ev[1:]))
    assert d["records"] == [{"op": 1, "kind": "step"}]


@pytest.mark.slow
def test_sigusr1_writes_a_valid_ring_file(tmp_path):
    # no stall dump first: its floor is far away
    p = _rank(tmp_path, LTP_STALL_MIN_S="600")
    try:
        assert not (tmp_path / "rank2.json").exists()
        p.send_signal(signal.SIGUSR1)
        d = _wait_dump(tmp_path / "rank2.json", "SIGUSR1")
        _check_ring(d)
        assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]   # renamed in place
    finally:
        p.kill()
        p.wait()


@pytest.mark.slow
def test_a_stalled_wait_dumps_and_a_stopped_rank_is_named_from_its_file(tmp_path):
    from ltpx.control.launcher.hangs import FlightWatch, proc_state
    p = _rank(tmp_path)
    try:
        d = _wait_dump(tmp_path / "rank2.json", "stall")
        _check_ring(d)
        # it dumped once it had waited past max(1.5 x the median op, 0.25 s)
        assert d["now"]["for_s"] >= d["threshold_s"] == max(1.5 * d["median_op_s"], 0.25)
        os.kill(p.pid, signal.SIGSTOP)
        end = time.monotonic() + 30
        while proc_state(p.pid) != "STOPPED" and time.monotonic() < end:   # (asynchronous)
            time.sleep(0.02)
        os.environ["LTP_FLIGHT_DIR"] = str(tmp_path)
        os.environ["LTP_HANG_S"] = "0.5"
        try:
            fw = FlightWatch()
        finally:
            del os.environ["LTP_FLIGHT_DIR"], os.environ["LTP_HANG_S"]
        # a stall is a hang once the rank has stayed in its wait LTP_HANG_S
        # past its dump: no screen before, one then
        t0, lines = time.monotonic(), fw.poll()
        while lines is None and time.monotonic() - t0 < 10:
            time.sleep(0.05)
            lines = fw.poll()
        assert time.monotonic() - t0 >= 0.5
        assert lines is not None and "stall" in lines[0] and "still waiting" in lines[0]
        assert lines[1].startswith(f"w1 (rank 1, pid {p.pid}, STOPPED): stopped in op 9 barrier "
                                   "(in it for "), lines
        assert "last packet from its server" in lines[1]
        assert fw.poll() is None            # one screen per stall
        assert fw.close() == str(tmp_path)  # not its own folder: kept
    finally:
        p.kill()
        p.wait()


# --------------------------------------------------------------------------- on the rig

WORKERS, PACE_S, DEAD_S = 3, 0.4, 6.0


@pytest.fixture(scope="module")
def rig():
    from conftest import WHY_NOT_BPF
    if WHY_NOT_BPF:
        pytest.skip(WHY_NOT_BPF)
    from ltpx.control.training.onrig import rig_config
    from ltpx.dataplane.rig.star import Rig
    with Rig(rig_config(f"fl{os.getpid() % 100000}", "ltp", workers=WORKERS,
                        rate_bps=10**9, buffer_bytes=30_000, loss=0.0)) as r:
        yield r


@pytest.mark.rig
@requires_bpf
def test_a_sigstopped_worker_is_named_and_the_job_goes_on_without_it(rig, monkeypatch):
    from ltpx.control.training.config import TrainConfig
    from ltpx.control.training.faults import Faults
    from ltpx.control.training.onrig import train_on_rig
    # dead_s well above the stall threshold (1.5 x ~0.4 s): the screen must
    # come from the recorder, not from the liveness check
    monkeypatch.setenv("LTP_DEAD_S", str(DEAD_S))
    monkeypatch.delenv("LTP_FLIGHT_DIR", raising=False)
    fx = Faults([])
    seen = {"usr1": None, "stop": None, "screens": []}

    def on_event(job, ev):
        if ev.get("event") != "iter":
            return
        seen["job"] = job
        if ev.get("t", 0) >= 3 and seen["usr1"] is None:    # worker 1: a dump on request
            seen["usr1"] = job.ranks[2].proc.pid
            os.kill(seen["usr1"], signal.SIGUSR1)
        if ev.get("t", 0) >= 8 and seen["stop"] is None:     # worker 2 stops
            r = job.ranks[3]
            seen["stop"], seen["t_stop"] = r, time.monotonic()
            os.kill(r.proc.pid, signal.SIGSTOP)
    fx.on_event = on_event

    def on_hang(lines):
        seen["screens"].append((time.monotonic(), lines, _dumps(seen)))
        r = seen["stop"]
        if r is not None and r.proc.poll() is None and any(
                ln.startswith("w2 (") and "STOPPED" in ln for ln in lines):
            fx.policy.expected.add(r.rank)   # as --kill does: the job goes on without it
            os.kill(r.proc.pid, signal.SIGKILL)
    res = train_on_rig(rig, TrainConfig(iterations=24, hidden=(64,), pace_s=PACE_S, max_missed=2,
                                        seed=5), timeout_s=600, faults=fx, on_hang=on_hang)
    stop = seen["stop"]
    assert stop is not None, res
    # the SIGUSR1 screen: worker 1's own dump
    usr1 = [s for s in seen["screens"] if "SIGUSR1" in s[1][0]]
    assert usr1 and usr1[0][1][0].startswith("w1 (rank 1): SIGUSR1"), seen["screens"]
    d = usr1[0][2].get(2)
    assert d is not None and d["pid"] == seen["usr1"] and d["events"] and d["records"]
    # the stall screen: worker 2 named STOPPED, with its op and its last
    # packet's age at the server, before the liveness check would have said anything
    after = [s for s in seen["screens"] if s[0] > seen["t_stop"]]
    named = [(t, ln, dumps) for t, lines, dumps in after for ln in lines
             if ln.startswith("w2 (") and "STOPPED" in ln]
    assert named, seen["screens"]
    t, line, dumps = named[0]
    assert t - seen["t_stop"] < DEAD_S, (t - seen["t_stop"], line)
    assert "stopped in op " in line and "its last packet reached the server" in line, line
    stall = [d for d in dumps.values() if d["reason"] == "stall"]
    assert stall, dumps
    for d in stall:     # each rank armed to report within 2 x its median op
        assert d["threshold_s"] < 2 * d["median_op_s"] or d["threshold_s"] == 0.25, d
        assert d["now"]["for_s"] >= d["threshold_s"]
    # the server's screen line says whom it waits for
    srv = [ln for ln in named_lines(after) if ln.startswith("s0 (server 0, pid ")]   # its rank line
    assert srv and ("w2" in srv[0] or "its server" in srv[0] or "send" in srv[0]), srv
    # and the job went on: worker 2 lost, dropped after --max-missed steps, the rest finished
    assert res["iterations"] == 24, res
    assert res["workers_lost"] == [2] and "2" in res["lost_at"], res
    assert res["hangs"], res
    print("\n".join(ln for _, lines, _ in after for ln in lines))
    print(f"screen {t - seen['t_stop']:.2f} s after SIGSTOP; median op "
          f"{stall[0]['median_op_s']:.3f} s; stall dump after {stall[0]['now']['for_s']:.3f} s")


def named_lines(screens):
    return [ln for _, lines, _ in screens for ln in lines]


def _dumps(seen) -> dict:
    """The flight folder's dumps now: rank -> its JSON."""
    job = seen.get("job")
    folder = job.flight.folder if job is not None else None
    out = {}
    if folder and os.path.isdir(folder):
        for n in os.listdir(folder):
            if n.endswith(".json"):
                with open(os.path.join(folder, n)) as f:
                    d = json.load(f)
                out[d["rank"]] = d
    return out


# a rank that stalls once (0.8 s in op 9's barrier) and goes on
STALLS_ONCE = textwrap.dedent("""
    import time
    from ltpx.control.torchapi import flight
    flight.start(2, flight.WORKER, 1)
    for s in range(1, 14):
        flight.enter(flight.BARRIER, s)
        time.sleep(0.8 if s == 9 else 0.03)
        flight.enter(flight.COMPUTE, s)
    flight.stop()
""")


@pytest.mark.slow
def test_a_stall_that_resolves_is_counted_not_screened_and_leaves_no_folder(monkeypatch):
    """The rank dumps its stall (it waited past its threshold), then moves
    on within LTP_HANG_S: the launcher's watch shows no screen, counts one
    stall with its op, phase and length, and removes its folder at the end."""
    from ltpx.control.launcher.hangs import FlightWatch
    monkeypatch.delenv("LTP_FLIGHT_DIR", raising=False)
    monkeypatch.setenv("LTP_HANG_S", "3")
    fw = FlightWatch()
    p = subprocess.Popen([sys.executable, "-c", STALLS_ONCE], env={**os.environ, **fw.env()})
    screens = []
    while p.poll() is None:
        screens.append(fw.poll())
        time.sleep(0.02)
    screens.append(fw.poll())
    assert p.returncode == 0
    assert [s for s in screens if s] == []
    assert any(n.endswith(".json") for n in os.listdir(fw.folder))   # it did dump
    st = fw.stall_summary()
    assert st is not None and st["count"] == 1 and st["rank"] == "w1", st
    assert (st["op"], st["phase"]) == (9, "barrier") and 0.25 <= st["longest_s"] < 3, st
    folder = fw.folder
    assert fw.close() is None and not os.path.exists(folder)


@pytest.mark.unit
def test_the_hang_limit_is_read_from_its_variable():
    from ltpx.control.launcher.hangs import HANG_S, hang_limit
    from ltpx.errors import UsageError
    assert hang_limit({}) == HANG_S and hang_limit({"LTP_HANG_S": "0.5"}) == 0.5
    for bad in ("-1", "soon", "inf"):
        with pytest.raises(UsageError, match="LTP_HANG_S"):
            hang_limit({"LTP_HANG_S": bad})
