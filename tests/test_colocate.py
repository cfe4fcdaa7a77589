# SPDX-License-Identifier: Apache-2.0
"""Co-located servers in the trainers' own processes (colocate.py,
LTP_COLOCATE=1, the TCP transport), on this host's loopback, real processes:

- torchrun starts the trainers alone (no server process, no LTP variable:
  co-located by default): a stock DDP script over `ltp` ends bit-identical
  to gloo's, each trainer having served a slice;
- three trainers with bfloat16 on the wire (the answer's words and the
  rounding carried through the in-memory hop) end where three server
  processes beside them take the job: the same bits;
- what a co-located job cannot be is a usage error naming the way out.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import outputs
from ltpx.control.torchapi import backend, colocate
from ltpx.control.torchapi.settings import Settings
from ltpx.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LOOPBACK = {"LTP_TRANSPORT": "tcp", "LTP_IP": "127.0.0.1", "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": "lo", "TORCH_CPP_LOG_LEVEL": "ERROR"}


def torchrun(logs: Path, nproc: int, *args: str, **env) -> list[dict]:
    """docs/examples/ddp_backend.py under torchrun --standalone: each rank's
    JSON, from its own log (`--redirects`: ranks writing one pipe at once
    can run their lines together)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LTP_")}
    p = subprocess.Popen([str(BIN / "torchrun"), "--standalone", "--nproc-per-node",
                          str(nproc), "--log-dir", str(logs), "--redirects", "1",
                          str(ROOT / "docs/examples/ddp_backend.py"), *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         env=dict(clean, **LOOPBACK, **env))
    (_, err), = outputs([p], timeout=240)
    rows = [json.loads(line) for f in sorted(logs.rglob("stdout.log"))
            for line in f.read_text().splitlines() if line.startswith("{")]
    assert len(rows) == nproc, err[-3000:]
    # every rank printed its result: a rank torch's gloo aborted at exit after
    # that (tests/ddp_local.py says when) did all its work
    assert p.returncode == 0 or ("terminate called without an active exception" in err
                                 and "SIGABRT" in err), err[-3000:]
    return rows


@pytest.mark.slow
def test_torchrun_alone_colocates_by_default_and_equals_gloo(tmp_path):
    """No LTP variable at all (no LTP_COLOCATE, nothing naming a server
    rank): the trainers serve the slices themselves, and end as gloo's."""
    from ddp_local import run_local     # gloo's own teardown may abort: it tolerates that
    ltp = torchrun(tmp_path / "ltp", 2, "--epochs", "2")
    gloo = run_local(2, "--epochs", "2", backend="gloo")["results"]
    assert sorted(r["rank"] for r in ltp) == [0, 1] and ltp[0]["world"] == 2
    assert {r["digest"] for r in ltp} == {r["digest"] for r in gloo}
    assert len({r["digest"] for r in ltp}) == 1 and ltp[0]["backend"] == "ltp"


@pytest.mark.slow
def test_three_colocated_trainers_with_bf16_on_the_wire_equal_three_server_processes():
    """Each trainer's server as its child (the default) and on a thread of it
    (its own slice handed over in memory, LTP_COLOCATE_THREAD=1), against
    server processes started apart: the same bits."""
    from ddp_local import run_local
    args = ("--epochs", "1", "--hook")
    wire = {"LTP_COMPRESS": "bf16"}
    apart = run_local(3, *args, env_extra={"LTP_SERVERS": "3", **wire})["results"]
    for how in ({}, {"LTP_COLOCATE_THREAD": "1"}):
        near = run_local(3, *args, env_extra={"LTP_COLOCATE": "1", **how, **wire})["results"]
        assert near[0]["hook"]["wires"] == {"bf16": near[0]["hook"]["ops"]}, near[0]["hook"]
        assert len({r["digest"] for r in near}) == 1
        assert {r["digest"] for r in near} == {r["digest"] for r in apart}, how


@pytest.mark.slow
@pytest.mark.parametrize("started", [2, 1], ids=["mid-job", "mid-init"])
def test_a_killed_trainers_server_goes_with_it(started):
    """Nothing outlives its owner: trainers killed (SIGKILL: no cleanup of
    their own) take their servers' processes with them, mid-job and while
    the servers are still in init: with one trainer of two started, its
    server waits in the store for the other ranks, where no Python signal
    handler runs (it lived on to its 120 s timeout before; a busy CI run
    met it mid-job too, its servers slower to start than their trainers'
    deaths)."""
    import signal
    import time
    env = dict({k: v for k, v in os.environ.items() if not k.startswith("LTP_")},
               **LOOPBACK, LTP_COLOCATE="1", WORLD_SIZE="2", TORCHELASTIC_USE_AGENT_STORE="True",
               LTP_TIMEOUT="120")
    import torch.distributed as dist
    from datetime import timedelta
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60),
                          wait_for_workers=False)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port))
    kids: list[int] = []
    trainers = [subprocess.Popen([sys.executable, str(ROOT / "docs/examples/ddp_backend.py"),
                                  "--epochs", "50"], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
                for r in range(started)]
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(kids) < started:
            kids = [k for t in trainers for k in children(t.pid)]
            time.sleep(0.2)
        assert len(kids) == started, kids
        deadline = time.monotonic() + 60   # the servers started: their sockets listen
        while time.monotonic() < deadline and len(listening(kids)) < started:
            time.sleep(0.2)
        assert len(listening(kids)) == started, kids
        for t in trainers:
            t.send_signal(signal.SIGKILL)
            t.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(alive(k) for k in kids):
            time.sleep(0.1)
        assert not any(alive(k) for k in kids), kids
    finally:
        for t in trainers:
            if t.poll() is None:
                t.kill()
        for k in kids:
            if alive(k):
                os.kill(k, signal.SIGKILL)


def children(pid: int) -> list[int]:
    """The pids of `pid`'s children that run a co-located server."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"childserver" in cmd:
            out.append(int(d.name))
    return out


def listening(pids: list[int]) -> list[int]:
    """Those of `pids` with a listening TCP socket (a server's, set up)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A":                 # LISTEN
                inodes.add(f[9])
    out = []
    for pid in pids:
        try:
            fds = [os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        if any(f.startswith("socket:[") and f[8:-1] in inodes for f in fds):
            out.append(pid)
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.unit
def test_what_a_colocated_job_cannot_be_is_a_usage_error(monkeypatch, tmp_path):
    from ltpx.control.trust import jobkey
    member = tmp_path / "w0.key"
    jobkey.write_private(str(member), jobkey.member_text(jobkey.member_keys(jobkey.new_key(), 0)))
    with pytest.raises(UsageError, match="member key file, but a co-located trainer serves"):
        colocate.settle(Settings(transport="tcp", colocate=True, secret_file=str(member)),
                        (2, 4))
    # over LTP: the trainer's worker and server are seats of its device, the
    # server on a port of its own; tolerant answers leave out what it never lost
    s, place = colocate.settle(Settings(transport="ltp", colocate=True, udp_port=7411), (3, 4))
    assert (s.servers, s.share_dev, place) == (2, True, (3, 4))
    assert (colocate.server_settings(s).udp_port, colocate.server_settings(s).share_dev) == \
        (8411, True)
    with pytest.raises(UsageError, match="loss_policy defer"):
        colocate.settle(Settings(transport="ltp", colocate=True, loss_policy="defer"), (3, 4))
    with pytest.raises(UsageError, match="udp_port 65000 leaves no port"):
        colocate.settle(Settings(transport="ltp", colocate=True, udp_port=65000), (3, 4))
    with pytest.raises(UsageError, match="9 trainers; co-located servers serve 1 to 8"):
        colocate.settle(Settings(transport="tcp", colocate=True), colocate.place(0, 9))
    s, place = colocate.settle(Settings(transport="tcp", colocate=True), colocate.place(2, 3))
    assert (s.servers, place) == (3, (5, 6))
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(UsageError, match="RANK, WORLD_SIZE not set|RANK not set"):
        colocate.settle(Settings(transport="tcp", colocate=True), None)
    with pytest.raises(UsageError, match="tcp_port 7000 .*leave it 0"):
        colocate.settle(Settings(transport="tcp", colocate=True, tcp_port=7000), (2, 4))
    for var in colocate.SERVER_VARS + ("LTP_COLOCATE",):
        monkeypatch.delenv(var, raising=False)
    assert backend.ltp_place(1, 4) == (5, 8, False, True)     # nothing named: co-located
    assert colocate.chosen() == (True, True)
    monkeypatch.setenv("LTP_SERVERS", "1")                    # a server rank named
    assert backend.ltp_place(1, 4) == (2, 5, False, False) and colocate.chosen() == (False, False)
    monkeypatch.setenv("LTP_COLOCATE", "0")
    monkeypatch.delenv("LTP_SERVERS")
    assert backend.ltp_place(1, 4) == (2, 5, False, False)    # said off: one server rank
    monkeypatch.setenv("LTP_COLOCATE", "1")
    assert backend.ltp_place(1, 4) == (5, 8, False, True) and colocate.chosen() == (True, False)
    monkeypatch.setenv("LTP_ROLE", "server")
    with pytest.raises(UsageError, match="no server ranks"):
        backend.ltp_place(0, 4)
    with pytest.raises(UsageError, match="no server ranks"):
        colocate.settle(Settings(transport="tcp", colocate=True), (2, 4))


@pytest.mark.unit
def test_a_nodes_several_ranks_take_seats_of_its_device_on_ports_of_their_own():
    """torchrun --nproc-per-node R gives every rank of a node the same
    variables: over LTP each then takes a seat of the device (share_dev) on
    port 7411 + LOCAL_RANK; what a user gave (either setting, by keyword or
    variable), one rank a node, or the TCP transport leave the settings as
    they are; LOCAL_* that cannot be a node's place are usage errors."""
    from ltpx.control.torchapi.settings import node_seat
    base = Settings.resolve({}, environ={})
    node = {"LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "2"}
    s = node_seat(base, {}, node)
    assert (s.share_dev, s.udp_port) == (True, 7413)
    assert node_seat(base, {}, dict(node, LOCAL_RANK="0")).udp_port == 7411
    for opts, env in (({"udp_port": 9000}, node), ({"share_dev": False}, node),
                      ({}, dict(node, LTP_SHARE_DEV="0")), ({}, dict(node, LTP_UDP_PORT="7500")),
                      ({}, {"LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "0"}), ({}, {})):
        assert node_seat(base, opts, env) is base, (opts, env)
    tcp = Settings.resolve({"transport": "tcp"}, environ={})
    assert node_seat(tcp, {}, node) is tcp
    for bad in ({"LOCAL_WORLD_SIZE": "two"}, {"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "2"},
                {"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "-1"}):
        with pytest.raises(UsageError, match="LOCAL_"):
            node_seat(base, {}, bad)


@pytest.mark.slow
@pytest.mark.parametrize("thread", ["0", "1"], ids=["child", "thread"])
def test_a_trainer_whose_server_cannot_start_ends_at_once_saying_why(thread):
    """The trainers' servers are to listen on an address no interface has:
    each trainer ends as soon as its server fails, naming the error, rather
    than wait for the job's timeout (120 s here)."""
    import time

    from ddp_local import run_local
    t0 = time.monotonic()
    with pytest.raises(AssertionError) as e:
        run_local(2, "--epochs", "1", timeout=240,
                  env_extra={"LTP_COLOCATE": "1", "LTP_TIMEOUT": "120",
                             "LTP_COLOCATE_THREAD": thread, "LTP_IP": "198.18.255.254"})
    said = str(e.value)
    assert "Cannot assign requested address" in said, said
    assert re.search(r"co-located server \(rank \d[^\n]*(could not start|exited 1)[^\n]*"
                     "ending this trainer", said), said
    assert time.monotonic() - t0 < 100


KEYWORDS_JOB = """
import json, sys, torch
import ltpx.torch as lt
lt.init(transport="tcp", ip="127.0.0.1", {how}timeout=60)
out = lt.allreduce(torch.full((1000,), float(lt.rank() + 1)), average=False)
print(json.dumps({"rank": lt.rank(), "size": lt.size(), "sum": float(out[0])}))
lt.shutdown()
"""


@pytest.mark.unit
def test_init_under_torchrun_alone_colocates_unless_something_names_a_server(monkeypatch):
    """lt.init()'s default is the backend's: where RANK and WORLD_SIZE are
    set (torchrun) and no variable or keyword names a server rank, every
    trainer serves a slice; a keyword or LTP_COLOCATE decides where given, a
    caller's place (the backend's) and a process with no launcher are left
    alone; a job that cannot be co-located says so and how to have servers."""
    from ltpx.control.torchapi import job
    for var in colocate.SERVER_VARS + ("LTP_COLOCATE",):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert colocate.for_init({"transport": "tcp"}, None) == {"transport": "tcp", "colocate": True}
    for opts, place in (({"colocate": False}, None), ({"servers": 1}, None),
                        ({"role": "server"}, None), ({}, (3, 4))):
        assert colocate.for_init(opts, place) is opts, (opts, place)
    monkeypatch.setenv("LTP_SERVERS", "1")
    assert colocate.for_init({}, None) == {}
    monkeypatch.delenv("LTP_SERVERS")
    monkeypatch.setenv("LTP_COLOCATE", "0")
    assert colocate.for_init({}, None) == {}
    monkeypatch.delenv("LTP_COLOCATE")
    monkeypatch.delenv("RANK")
    assert colocate.for_init({}, None) == {}     # no launcher: rendezvous names what is missing
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "9")
    with pytest.raises(UsageError, match="9 trainers; co-located .*co-located by default.*"
                       "LTP_SERVERS=S"):
        job.init(transport="tcp")
    assert job.joined() is None


@pytest.mark.slow
@pytest.mark.parametrize("how", ["colocate=True, ", ""], ids=["keyword", "by-default"])
def test_ltpx_torch_with_keywords_alone_starts_its_servers_with_them(how):
    """init()'s keywords (no LTP_* variable set) reach the servers the
    trainers start: the same transport and address, one job. Under torchrun
    alone that is init()'s default: both ranks train (before, rank 0 was
    taken for a server rank and served)."""
    import torch.distributed as dist
    from datetime import timedelta
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60),
                          wait_for_workers=False)
    env = dict({k: v for k, v in os.environ.items() if not k.startswith("LTP_")},
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), WORLD_SIZE="2",
               TORCHELASTIC_USE_AGENT_STORE="True", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", KEYWORDS_JOB.replace("{how}", how)],
                              env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for r in range(2)]
    outs = outputs(procs, timeout=120)
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    rows = sorted((json.loads(o.strip().splitlines()[-1]) for o, _ in outs),
                  key=lambda r: r["rank"])
    assert rows == [{"rank": 0, "size": 2, "sum": 3.0}, {"rank": 1, "size": 2, "sum": 3.0}]



@pytest.mark.unit
def test_a_keyless_job_is_told_the_key_each_rank_takes_colocated_or_not(caplog):
    """Every co-located trainer serves a slice, and a member file holds no
    server's key (settle refuses one): the keyless warning (rank 0's, in a
    co-located job trainer 0's server's) names the job key on every rank
    for such a job, member files where servers are ranks apart."""
    import logging

    from ltpx.control.torchapi.job import warn_keyless
    with caplog.at_level(logging.WARNING, logger="ltpx.torch"):
        warn_keyless(Settings(transport="ltp"))
        warn_keyless(Settings(transport="tcp"))
    ltp, tcp = [r.getMessage() for r in caplog.records]
    for said in (ltp, tcp):
        assert "each worker its member file" in said
        assert "no server ranks (co-located, torchrun alone) give every rank the job key" in said
    assert "round tokens are off" in ltp and "round tokens" not in tcp
