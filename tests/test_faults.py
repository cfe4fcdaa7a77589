# SPDX-License-Identifier: Apache-2.0
"""Faults: a worker that dies and comes back, a server that dies and the job resumes, and a
dying job that stops at once.

Units first (the report's membership words, the kill specs, the op barrier
on a real store with real worker processes, one of them killed). Then the
rig: `ltp train --kill ... --restart -j` and train_on_rig with real
processes, real SIGKILLs and real packets through the XDP programs, on one
3-worker native-mode rig named ha<pid> (short runs: a small MLP, tens of
iterations, --pace so a restarted worker has time to come back).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import numpy as np
import pytest

from conftest import reap, requires_bpf

WORKERS = 3
SMALL = dict(hidden=(64,), seed=3)


# --------------------------------------------------------------------------- units

@pytest.mark.unit
def test_report_carries_absent_dropped_and_admitted_workers():
    from ltpx.control.torchapi.ops import DROPPED, Members, StepReport, report_words
    rep = StepReport(step=7, reasons=["deadline"], delivered={0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0},
                     filled_chunks={0: 0, 1: 9, 2: 0, 3: 9},
                     wholly_filled={0: 0, 1: 1, 2: 0, 3: 1}, ks=[1, 0, 1, 0], gather_s=0.1,
                     status={1: DROPPED, 3: 5}, absent=[1, 3])
    words = np.zeros(report_words(1, 4), dtype=np.float32)
    rep.encode(words)
    back = StepReport.decode(words)
    assert back.dropped == [1] and back.admitted == {3: 5} and back.missing_workers == [1, 3]
    m = Members(4)
    m.absent = {1, 3}
    from ltpx.control.torchapi.ops import STEP, ALLREDUCE, Op
    assert m.participants(Op(STEP, sizes=(4,))) == [0, 1, 2, 3]       # absent: until dropped
    assert m.participants(Op(ALLREDUCE, sizes=(4,))) == [0, 2]        # the present only
    m.after_report(back)
    assert m.members == {0, 2, 3} and m.absent == set() and m.expect() == {0, 2, 3}
    assert m.donor() == 0


@pytest.mark.unit
def test_kill_specs_are_checked():
    from ltpx.control.training.faults import parse_kills
    ks = parse_kills(["worker:2@10", "server:0@20"], workers=8)
    assert [(k.role, k.id, k.at) for k in ks] == [("worker", 2, 10), ("server", 0, 20)]
    for bad in ("worker:8@1", "server:1@3", "worker:1@0", "worker2@3", "gpu:0@1"):
        with pytest.raises(ValueError, match="--kill"):
            parse_kills([bad], workers=8)


@pytest.mark.rig
def test_bad_fault_flags_exit_2(capsys):
    from ltpx.tools.cli import main
    for argv, word in ((["--kill", "worker:9@3"], "--kill"),
                       (["--checkpoint-every", "5"], "checkpoint"),
                       (["--max-missed", "0"], "max-missed")):
        assert main(["train", "-j", *argv]) == 2
        assert word in json.loads(capsys.readouterr().out)["error"]


BARRIER_WORKER = r"""
import json, os, sys, time
from datetime import timedelta
import torch.distributed as dist
from ltpx.control.torchapi.coord import Coord
from ltpx.control.torchapi.ops import Op, STEP
w, port, ops = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30))
co = Coord(store, 3, 30.0)
co.me = w
co.start_liveness(1 + w)
for s in range(ops):
    co.arrive(s, Op(STEP, sizes=(4,)))
    go = co.wait_go(s)
    print(json.dumps({"s": s, "absent": list(go.absent)}), flush=True)
    time.sleep(0.05)
co.stop_liveness()
"""


@pytest.mark.unit
def test_a_server_beats_its_link_while_it_waits_in_the_store():
    """Coord.on_wait (the server's link beat) runs through a store wait, once
    per slice of at most SLICE_S, and a wait that times out still names its total."""
    import threading
    import torch.distributed as dist
    from ltpx.control.torchapi.coord import KEY, Coord
    from ltpx.errors import CommError
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30),
                          wait_for_workers=False)
    co = Coord(store, workers=1, timeout_s=30)
    beats: list[float] = []
    co.on_wait = lambda: beats.append(time.monotonic())
    threading.Timer(1.2, lambda: store.set(KEY + "late", "1")).start()
    t0 = time.monotonic()
    co.wait(["late"])
    assert time.monotonic() - t0 >= 1.1
    # one wait of 1.2 s cut into slices of at most SLICE_S: a beat before each
    # (an uncut wait would call on_wait once, or never)
    assert len(beats) >= 3 and all(b >= t0 for b in beats)
    with pytest.raises(CommError, match="waited 0.6s for never"):
        co.wait(["never"], timeout_s=0.6)


@pytest.mark.unit
def test_a_sharded_workers_beat_names_each_server_that_stops_once(monkeypatch):
    """A worker of a 2-server job beats in the root's store and watches both
    servers' counters there: the one that stops is named once (by its
    index), the one still beating never; a shard's coordination reads its
    own server's and its workers' beats by job-wide rank."""
    import threading
    import torch.distributed as dist
    from ltpx.control.torchapi.coord import KEY, Coord
    monkeypatch.setenv("LTP_DEAD_S", "1.5")   # server 0 beats every 0.1 s: far inside it
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30),
                          wait_for_workers=False)
    stop = {1: threading.Event(), 0: threading.Event()}

    def serve(i: int) -> None:      # server i's heartbeat, until told to stop
        while not stop[i].wait(0.1):
            store.add(f"{KEY}hb/{i}", 1)
    for i in (0, 1):
        threading.Thread(target=serve, args=(i,), daemon=True).start()
    root = Coord(store, 3, 30.0, servers=2)
    told: list[int] = []
    root.on_server_dead = told.append
    root.start_liveness(2 + 1)       # worker 1: job-wide rank 3
    shard = Coord(store, 3, 30.0)    # shard 1's (scoped by a prefix in a job)
    shard.start_liveness(None, beats=store, server=1, servers=2)
    try:
        time.sleep(0.5)
        assert told == [] and shard.server_alive() and shard.worker_alive(1)
        stop[1].set()
        deadline = time.monotonic() + 10
        while not told and time.monotonic() < deadline:
            time.sleep(0.05)
        shard.server_alive()         # its clock starts at the value it stopped at
        time.sleep(1.7)              # named once, and server 0 never
        assert told == [1]
        assert not shard.server_alive()
        assert shard.worker_alive(1) and 3 in shard.watch.seen   # worker 1 is rank 3
        assert shard.beat is None    # one beat per process: the root's
    finally:
        stop[0].set()
        root.stop_liveness()


@pytest.mark.unit
def test_a_beat_freezes_what_is_alive_before_its_first_beat():
    """A full collection holds the GIL while it walks every object. The first
    one of eight co-located servers (processes that imported torch) stopped
    their heartbeats for 2-3 s on two busy cores, and the workers took them
    for dead. A Beat collects and freezes first, so no later collection walks
    what was alive then; and it beats."""
    import gc
    import torch.distributed as dist
    from ltpx.control.torchapi.liveness import Beat
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30),
                          wait_for_workers=False)
    alive = [[i] for i in range(1000)]     # tracked by the collector
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    beat = Beat(store, "hb/9", watch_keys=("hb/0",))
    try:
        assert gc.get_freeze_count() >= len(alive)
        deadline = time.monotonic() + 10
        while store.add("hb/9", 0) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.add("hb/9", 0) >= 3
        assert store.add("hb/0", 0) == 0     # a watched rank not yet beating: made, at 0
    finally:
        beat.stop()


def _server_store():
    """A real rendezvous store on loopback, and a 3-worker job's server Coord
    on it with its heartbeat (stop_liveness() is the caller's)."""
    import torch.distributed as dist
    from ltpx.control.torchapi.coord import Coord
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30),
                          wait_for_workers=False)
    srv = Coord(store, 3, 30.0)
    srv.start_liveness(0)
    return store, srv


@pytest.mark.slow
def test_barrier_goes_on_without_a_killed_worker(tmp_path):
    # A real store, three real worker processes; worker 2 is SIGKILLed before
    # op 2. The server's wait for op 2 lifts the barrier once worker 2's
    # heartbeat has stopped, naming it absent; the others pass every op.
    store, srv = _server_store()
    script = tmp_path / "w.py"
    script.write_text(BARRIER_WORKER)
    env = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR", LTP_DEAD_S="1.0")
    procs = [subprocess.Popen([sys.executable, str(script), str(w), str(store.port),
                               "5" if w < 2 else "2"], env=env, stdout=subprocess.PIPE,
                              text=True) for w in range(3)]
    try:
        assert [srv.next_op(s, idle_s=60).absent for s in range(2)] == [(), ()]
        procs[2].kill()            # it ran ops 0 and 1; it will never arrive at op 2
        procs[2].wait()
        gos = [srv.next_op(s, idle_s=60) for s in range(2, 5)]
        assert [g.absent for g in gos] == [(2,), (2,), (2,)]
        outs = [p.communicate(timeout=60)[0] for p in procs[:2]]
    finally:
        reap(procs)
        srv.stop_liveness()
    for p, out in zip(procs[:2], outs):
        assert p.returncode == 0
        lines = [json.loads(x) for x in out.splitlines()]
        assert [x["s"] for x in lines] == [0, 1, 2, 3, 4] and lines[-1]["absent"] == [2]


BEATER = r"""
import sys, time
from datetime import timedelta
import torch.distributed as dist
from ltpx.control.torchapi.coord import Coord
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), None, False, timedelta(seconds=30))
co = Coord(store, 3, 30.0)
co.start_liveness(int(sys.argv[2]))
print("beating", flush=True)
time.sleep(120)
"""


HALF_ARRIVER = r"""
import sys, time
from datetime import timedelta
import torch.distributed as dist
from ltpx.control.torchapi.coord import KEY, Coord
from ltpx.control.torchapi.ops import STEP, Op
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), None, False, timedelta(seconds=30))
co = Coord(store, 3, 30.0)
co.start_liveness(3)                      # worker 2
stage = sys.argv[2]
# as Coord.arrive does: the op described where it is missing, then the bit
store.compare_set(f"{KEY}desc/0", "", co.seal.seal(f"{KEY}desc/0", Op(STEP, sizes=(4,)).to_json()))
if stage in ("bit", "post"):
    store.add(f"{KEY}ready/0/0", 1 << 2)
if stage == "post":
    assert store.add(f"{KEY}post/0", 1) == 1
print("stopped", flush=True)              # where a SIGKILL finds it
time.sleep(120)
"""


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["desc", "bit", "post"])
def test_a_worker_killed_inside_its_arrival_never_holds_the_barrier(tmp_path, monkeypatch,
                                                                    stage):
    # A real store. Worker 2, a real process, is SIGKILLed part way through
    # its arrival at op 0: "desc" after it described the op, before its
    # arrival bit (it arrives first); "bit" after its arrival bit, "post"
    # after it also took the post, both before it posted the go (it arrives
    # last). Before, "bit" and "post" hung the barrier until the store's
    # timeout: the server saw everyone there and left the go to a poster who
    # was dead (and an older arrival could die between naming itself the
    # describer and describing: it now describes in the one call). Now the
    # barrier lifts without worker 2, naming it absent, and both live workers
    # read the same go.
    from ltpx.control.torchapi.coord import Coord
    from ltpx.control.torchapi.ops import STEP, Op
    monkeypatch.setenv("LTP_DEAD_S", "1.0")
    store, srv = _server_store()
    script = tmp_path / "half.py"
    script.write_text(HALF_ARRIVER)
    ws = [Coord(store, 3, 30.0) for _ in range(2)]
    for w, co in enumerate(ws):
        co.me = w
    op = Op(STEP, sizes=(4,))

    def run_worker2():
        p = subprocess.Popen([sys.executable, str(script), str(store.port), stage],
                             env=dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR"),
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "stopped"
        time.sleep(0.5)                 # a few beats: the server has seen it alive
        p.kill()
        p.wait()
        p.stdout.close()

    try:
        if stage == "desc":
            run_worker2()
        assert [co.arrive(0, op) for co in ws] == [False, False]
        if stage != "desc":
            run_worker2()
        go = srv.next_op(0, idle_s=30)
        assert go.absent == (2,) and go.op == op
        assert [co.wait_go(0).absent for co in ws] == [(2,), (2,)]
    finally:
        srv.stop_liveness()


@pytest.mark.slow
def test_a_joiner_whose_donor_dies_asks_again_and_takes_the_new_tickets_state(
        tmp_path, monkeypatch):
    # A real store; the server (this process) admits worker 2's ticket and
    # names worker 0, a real process beating its heartbeat, as its donor. While
    # worker 0 lives the joiner waits; once it is SIGKILLed, the joiner asks
    # again with a new ticket (before: it waited out the store timeout, and
    # the barrier with it). The next op's barrier goes on with worker 1 alone
    # (the joiner asking again counts as gone, the donor is dead), the next
    # admission names worker 1, and the joiner takes the state put under its
    # new ticket only.
    import threading
    from ltpx.control.torchapi.coord import KEY, Coord
    from ltpx.control.torchapi.ops import STEP, Op
    monkeypatch.setenv("LTP_DEAD_S", "1.0")
    store, srv = _server_store()
    script = tmp_path / "beat.py"
    script.write_text(BEATER)
    donor = subprocess.Popen([sys.executable, str(script), str(store.port), "1"],
                             env=dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR"),
                             stdout=subprocess.PIPE, text=True)
    joiner = Coord(store, 3, 30.0)
    joiner.me = 2
    w1 = Coord(store, 3, 30.0)   # a member that stays
    w1.me = 1
    out: dict = {}
    try:
        assert donor.stdout.readline().strip() == "beating"
        joiner.start_liveness(3)
        w1.start_liveness(2)
        first = joiner.tickets.request_join(2)
        t = threading.Thread(target=lambda: out.update(
            blob=joiner.tickets.take_sync(first, 30.0, w=2)), daemon=True)
        t.start()
        assert srv.tickets.take_joins(donor=0) == {2: first}
        assert store.get(f"{KEY}donor/{first}") == b"0"
        time.sleep(2.5)                      # its donor beats: no second request
        assert store.add(f"{KEY}join", 0) == first and t.is_alive()
        donor.kill()
        donor.wait()
        end = time.monotonic() + 10
        while not srv.tickets.joins and time.monotonic() < end:
            time.sleep(0.1)
            srv.tickets.poll_joins()
        (second,) = srv.tickets.joins.values()
        assert list(srv.tickets.joins) == [2] and second > first
        # op 0: worker 1 arrives; the server's barrier goes on without the dead
        # donor and the joiner that asked again, and names worker 1 the donor
        assert not w1.arrive(0, Op(STEP, sizes=(4,)))
        assert srv.next_op(0, idle_s=30).absent == (0, 2)
        assert srv.tickets.take_joins(donor=srv.view.donor()) == {2: second}
        assert store.get(f"{KEY}donor/{second}") == b"1"
        srv.tickets.put_sync(first, b"stale")         # too late: the joiner holds the new ticket
        time.sleep(0.6)
        srv.tickets.put_sync(second, b"fresh")
        t.join(10)
        assert out == {"blob": b"fresh"}
    finally:
        if donor.poll() is None:
            donor.kill()
            donor.wait()
        donor.stdout.close()
        joiner.stop_liveness()
        w1.stop_liveness()
        srv.stop_liveness()


# --------------------------------------------------------------------------- on the rig

@pytest.fixture(scope="module")
def rig():
    from conftest import WHY_NOT_BPF
    if WHY_NOT_BPF:
        pytest.skip(WHY_NOT_BPF)
    from ltpx.control.training.onrig import rig_config
    from ltpx.dataplane.rig.star import Rig
    with Rig(rig_config(f"ha{os.getpid() % 100000}", "ltp", workers=WORKERS,
                        rate_bps=10**9, buffer_bytes=30_000, loss=0.0)) as r:
        yield r


def _train(rig, faults=None, **kw):
    from ltpx.control.training.config import TrainConfig
    from ltpx.control.training.onrig import train_on_rig
    cfg = TrainConfig(**{**SMALL, **kw})
    return train_on_rig(rig, cfg, timeout_s=600, faults=faults)


@pytest.mark.rig
@requires_bpf
def test_killed_worker_is_named_dropped_restarted_and_rejoins(rig):
    # ltp train --kill worker:1@5 --restart -j on the rig: worker 1 is named
    # missing, left behind by the barrier (dropped after --max-missed 2 steps
    # if it is not back by then), started again, admitted back with the
    # current state, and ends bit-identical to the others.
    out = subprocess.run(
        [sys.executable, "-m", "ltpx.tools.cli", "train", "--name", rig.name, "--workers",
         str(WORKERS), "--iterations", "160", "--hidden", "64", "--pace", "0.06",
         "--max-missed", "2", "--kill", "worker:1@5", "--restart", "-j"],
        capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    r = json.loads(out.stdout)
    assert r["iterations"] == 160 and r["faults"]["kills"][0]["fired"]
    # one id space: restarts keyed by worker id, as workers_lost and rejoined_at are
    assert r["faults"]["worker_restarts"] == {"1": 1} and r["faults"]["job_restarts"] == 0
    assert r["missing_steps"]["1"] >= 1          # named missing in its steps
    # lost (the barrier went on without it), dropped unless it was back first
    assert r["workers_lost"] == [1] and r["workers_rejoined"] == [1]
    assert r["lost_at"]["1"] <= r["rejoined_at"]["1"] < 160
    assert set(r["dropped_at"]) <= {"1"}
    assert r["workers_present"] == [0, 1, 2] and r["replicas_identical"]
    assert r["resumed_from"] is None
    # the text output says so too (not only -j)
    from ltpx.control.training.faults import fault_lines
    text = "\n".join(fault_lines("ltp", r))
    assert "ltp: killed worker 1 at iteration 5" in text
    assert f"ltp: worker 1 lost at step {r['lost_at']['1']}" in text
    assert f"rejoined at step {r['rejoined_at']['1']}" in text
    assert "ltp: worker 1 restarted 1 time" in text


def _train_on_own_rig(prefix: str, *args: str, timeout: float) -> dict:
    """`ltp train -j` of WORKERS workers (hidden 64) on a rig of its own,
    named prefix<pid> and removed after; its JSON (it must exit 0)."""
    name = f"{prefix}{os.getpid() % 100000}"
    try:
        out = subprocess.run(
            [sys.executable, "-m", "ltpx.tools.cli", "train", "--name", name, "--workers",
             str(WORKERS), "--hidden", "64", *args, "-j"],
            capture_output=True, text=True, timeout=timeout)
    finally:
        subprocess.run([sys.executable, "-m", "ltpx.tools.cli", "rig", "down", "--name", name],
                       capture_output=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.mark.rig
@requires_bpf
def test_a_worker_restarted_under_heavy_loss_takes_the_policys_wire_from_its_donor():
    """At 10 % loss the loss policy sends float32 gradients as bfloat16
    (losspolicy.py, "The wire"); a worker killed and restarted rejoins with
    the donor's state, wire included, so its first step's op is the others'
    (a float32 one would differ at the barrier) and it ends bit-identical."""
    r = _train_on_own_rig("fw", "--iterations", "160", "--pace", "0.06", "--max-missed", "2",
                          "--kill", "worker:1@5", "--restart", "--loss", "0.1", timeout=900)
    assert r["iterations"] == 160 and r["workers_rejoined"] == [1] and r["replicas_identical"]
    wires = r["wires"]
    assert wires["0"] == wires["2"] and wires["0"]["bf16"] >= 150, wires
    assert set(wires["1"]) == {"bf16"}, wires      # the rejoiner's steps: the donor's wire


@pytest.mark.rig
@requires_bpf
def test_killed_worker_without_restart_the_job_goes_on_with_the_rest(rig):
    from ltpx.control.training.faults import Faults, parse_kills
    fx = Faults(parse_kills(["worker:2@4"], WORKERS))
    r = _train(rig, fx, iterations=24, max_missed=2)
    assert r["workers_lost"] == [2] and r["workers_rejoined"] == [] and "2" in r["dropped_at"]
    assert r["workers_present"] == [0, 1] and r["replicas_identical"]
    assert set(r["worker_digests"]) == {"0", "1"} and r["iterations"] == 24
    assert r["final_train_loss"] < r["initial_train_loss"]


@pytest.mark.rig
@requires_bpf
def test_a_sharded_job_goes_on_without_a_killed_worker():
    """Two servers, no --restart: every rank beats in the root's store, so
    each server's barrier goes on without the dead worker (it hung until the
    store's timeout before), both drop it, and the rest end bit-identical."""
    r = _train_on_own_rig("fs", "--servers", "2", "--iterations", "30", "--max-missed", "2",
                          "--kill", "worker:2@4", timeout=600)
    assert r["iterations"] == 30 and r["faults"]["kills"][0]["fired"]
    assert r["workers_lost"] == [2] and "2" in r["dropped_at"] and r["workers_rejoined"] == []
    assert r["workers_present"] == [0, 1] and r["replicas_identical"]
    assert set(r["worker_digests"]) == {"0", "1"}
    assert r["final_train_loss"] < r["initial_train_loss"]


@pytest.mark.rig
@pytest.mark.parametrize("shape", [[], ["--colocate"]], ids=["server", "colocated"])
def test_a_tcp_job_goes_on_without_a_killed_worker(shape):
    """Over the TCP transport a dead worker's connection ends: each server
    fills its rows (link_tcp.py), drops it after --max-missed steps, answers
    the rest, and the job ends with the others bit-identical (it ended on a
    server's "closed its connection" before). Co-located, the dead
    trainer's own server serves its slice on (childserver.py, ORPHAN)."""
    r = _train_on_own_rig("ft", "--transport", "tcp", *shape, "--iterations", "30",
                          "--max-missed", "2", "--kill", "worker:2@4", timeout=600)
    assert r["iterations"] == 30 and r["faults"]["kills"][0]["fired"]
    assert r["workers_lost"] == [2] and "2" in r["dropped_at"]
    assert r["workers_present"] == [0, 1] and r["replicas_identical"]
    assert r["final_train_loss"] < r["initial_train_loss"]


@pytest.mark.rig
def test_a_tcp_worker_killed_and_restarted_rejoins_on_a_new_connection():
    """Over TCP a restarted worker connects again: the server reads it from
    its new connection once it is admitted again (link_tcp_back.py), and
    it ends bit-identical with the rest (--restart was LTP's alone before)."""
    r = _train_on_own_rig("fr", "--transport", "tcp", "--iterations", "60", "--pace", "0.05",
                          "--max-missed", "2", "--kill", "worker:1@5", "--restart",
                          timeout=600)
    assert r["iterations"] == 60 and r["faults"]["worker_restarts"] == {"1": 1}
    assert r["workers_lost"] == [1] and r["workers_rejoined"] == [1]
    assert r["workers_present"] == [0, 1, 2] and r["replicas_identical"]
    assert r["final_train_loss"] < r["initial_train_loss"]


@pytest.mark.rig
@pytest.mark.parametrize("shape, kill", [([], "server:0@12"), (["--colocate"], "worker:1@12")],
                         ids=["server", "colocated-trainer"])
def test_a_tcp_job_restarts_whole_and_resumes_from_its_checkpoint(shape, kill, tmp_path):
    """A dead TCP server, or any dead rank of a co-located (sharded) TCP
    job: the job restarts whole and resumes from worker 0's last checkpoint.
    A sharded job's checkpoint failed before (its exchange had no snapshot
    for the state blob), over LTP too."""
    r = _train_on_own_rig("fj", "--transport", "tcp", *shape, "--iterations", "40", "--pace",
                          "0.05", "--kill", kill, "--restart", "--checkpoint-every", "5",
                          "--checkpoint-dir", str(tmp_path), timeout=600)
    assert r["iterations"] == 40 and r["faults"]["job_restarts"] == 1
    assert r["resumed_from"] == 10 and r["replicas_identical"]
    assert r["workers_present"] == [0, 1, 2]


@pytest.mark.rig
@requires_bpf
def test_killed_server_the_job_resumes_from_the_checkpoint_on_the_same_trajectory(rig, tmp_path):
    from ltpx.control.training.faults import Faults, parse_kills
    unbroken = _train(rig, iterations=24)
    fx = Faults(parse_kills(["server:0@12"], WORKERS), restart=True)
    r = _train(rig, fx, iterations=24, checkpoint_every=5, checkpoint_dir=str(tmp_path),
               pace_s=0.02)
    assert r["faults"]["job_restarts"] == 1 and r["resumed_from"] == 10
    assert r["iterations"] == 24 and r["replicas_identical"]
    # nothing was lost on the rig: the resumed job retraces the unbroken one bit for bit
    assert r["ps_digest"] == unbroken["ps_digest"]
    assert r["final_accuracy"] == unbroken["final_accuracy"]
    # the newest two of this job's checkpoints are kept (ckpt-<job hash>-<step>.pt)
    names = sorted(os.listdir(tmp_path))
    assert [n.rsplit("-", 1)[1] for n in names] == ["00000015.pt", "00000020.pt"], names
    assert len({n.rsplit("-", 1)[0] for n in names}) == 1


@contextlib.contextmanager
def _training(rig, pace_s: float, iters: int):
    """A built-in job's ranks started on `rig` (no launcher to stop them), once
    the lead has reported `iters` iterations; closed afterwards."""
    from ltpx.control.training.config import TrainConfig
    from ltpx.control.launcher.launch import RigJob, job_env
    from ltpx.control.launcher.plan import plan_ranks
    from ltpx.control.training.onrig import rank_argv
    cfg = TrainConfig(**SMALL, iterations=100000, pace_s=pace_s)
    ranks = plan_ranks(rig, WORKERS, 1)
    job = RigJob(rig, ranks, 120.0)
    seen = []
    try:
        job.start(lambda r: rank_argv(cfg, 120.0, None, None),
                  lambda r: job_env(rig, r, len(ranks), job.port, servers=1))
        end = time.monotonic() + 300
        while sum('"event": "iter"' in ln for ln in seen) < iters and time.monotonic() < end:
            job.pump(lambda r, stream, line: seen.append(line))
            assert not job.failed()
        yield job, ranks
    finally:
        job.close()


@pytest.mark.rig
@requires_bpf
def test_sigterm_stops_every_rank_on_its_own(rig):
    # ltp train stops a job with SIGTERM: each rank unwinds (its XDP program
    # detaches) and exits 130 by itself; none waits for a goodbye from a
    # server that is stopping too, so none is left for SIGKILL (-9).
    with _training(rig, pace_s=0.02, iters=1) as (job, ranks):
        procs = [r.proc for r in ranks]
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=60) for p in procs]
    assert codes == [130] * len(ranks)


@pytest.mark.rig
@requires_bpf
def test_workers_end_by_themselves_when_the_server_is_killed(rig):
    # The server is SIGKILLed mid-training and nobody stops the workers: each
    # sees the server's heartbeat stop, in a push or a pull (it ends itself as
    # SIGTERM would: 130) or in a store wait (PeerGone: 1), instead of failing
    # at its round's 60 s limit ("no answer ... for 60.0s").
    with _training(rig, pace_s=0.01, iters=5) as (job, ranks):
        ranks[0].proc.kill()
        late = []
        end = time.monotonic() + 120
        while any(r.code is None for r in ranks[1:]) and time.monotonic() < end:
            job.pump(lambda r, stream, line: late.append(line))
        codes = [r.code for r in ranks[1:]]
    # 130: ended itself in a push or a pull; 1: a store wait raised PeerGone
    assert set(codes) <= {130, 1} and None not in codes, (codes, late[-6:])
    said = [ln for ln in late if "error" in ln or "ending" in ln]
    assert all("stopped beating" in ln for ln in said), said
    assert not any("60.0s" in ln for ln in late)


@pytest.mark.rig
@requires_bpf
def test_a_rank_on_the_rig_gets_its_buffer_and_so_its_credit(rig, monkeypatch):
    # job_env (ltp train, ltp launch) hands each rank the rig's bottleneck
    # buffer; ltpx.torch's settings read it, and the credit is buffer + BDP
    from ltpx.control.torchapi.link_ltp import credit_bytes
    from ltpx.control.torchapi.settings import ENV, Settings
    from ltpx.control.launcher.launch import job_env
    from ltpx.control.launcher.plan import plan_ranks
    from ltpx.control.transport.rate import CREDIT_RTT_S
    ranks = plan_ranks(rig, WORKERS, 1)
    env = job_env(rig, ranks[1], len(ranks), 29500, servers=1)
    assert env["LTP_BUFFER"] == str(rig.config.buffer_bytes) == "30000"
    assert env["LTP_PROGRESS"] == "json"      # worker 0's progress reaches the launcher as events
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
        if var in env:
            monkeypatch.setenv(var, env[var])
    s = Settings.resolve({})
    assert s.buffer == 30000 and s.capacity == rig.config.rate_bps
    assert credit_bytes(s) == 30000 + rig.config.rate_bps * CREDIT_RTT_S / 8


@pytest.mark.unit
def test_a_run_without_faults_says_nothing_and_a_lost_worker_is_named():
    from ltpx.control.training.faults import Faults, fault_lines, parse_kills
    assert fault_lines("ltp", {"faults": Faults([]).report(), "lost_at": {}}) == []
    fx = Faults(parse_kills(["worker:2@4"], 3), restart=False, servers=2)
    fx.kills[0].fired_at = 1.0
    fx.policy.restarts[3] = 1           # rank 3 = worker 1 of a job with 2 servers
    lines = fault_lines("ltp", {"faults": fx.report(), "lost_at": {"2": 6}, "dropped_at": {"2": 8}})
    assert fx.report()["worker_restarts"] == {"1": 1}
    assert lines == ["ltp: killed worker 2 at iteration 4",
                     "ltp: worker 2 lost at step 6, dropped at step 8, did not rejoin",
                     "ltp: worker 1 restarted 1 time"]
