# SPDX-License-Identifier: Apache-2.0
"""Several endpoints on one device: the mux (bpf/ltp_mux.c, dataplane/xdp/mux.py).

A rig of one server host and one worker host. Two worker endpoints share
the worker host's one device, each on a UDP port of its own, each with its
own program and maps in a seat of the device's mux; the server is an
ordinary endpoint. Real programs, real packets, a real SIGKILL.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import requires_bpf, star_rig
from ltpx.control.transport import Peer
from ltpx.control.trust import jobkey
from ltpx.errors import RegistryError

pytestmark = requires_bpf

RIG = f"mx{os.getpid() % 100000}"
NEL = 30_000                   # 85 chunks of 1424 bytes
JOB = 0x3A7
SECRET = jobkey.token_secret(jobkey.new_key())
PORTS = (7411, 7412)


@pytest.fixture(scope="module")
def rig():
    yield from star_rig(name=RIG, workers=1, rate_bps=10**9, buffer_bytes=60_000, loss=0.0,
                        clear=True)


def _endpoint(host, peers, **kw):
    from ltpx.control.transport import Endpoint
    return Endpoint(host.ifname, host.ip, peers, NEL, ns=host.netns, job=JOB, secret=SECRET,
                    **kw)


def _tensor(w: int, r: int) -> np.ndarray:
    return np.random.default_rng(1000 * r + w).standard_normal(NEL).astype(np.float32)


def _uplink(ps, workers, r: int):
    """Round r from every shared worker to the server, pushes in threads."""
    ps.open_round(r, NEL, [w for w, _ in workers])
    out = {}
    ths = [threading.Thread(target=lambda w=w, ep=ep: ep.push(r, _tensor(w, r),
                                                              Peer(w, ps.ip)))
           for w, ep in workers]
    for t in ths:
        t.start()
    res = ps.wait_round(r)
    for t in ths:
        t.join(30)
    for i, (w, _) in enumerate(workers):
        out[w] = res.values[i].copy()
    return res, out


def _cli(capsys, *argv):
    """`ltp ARGV -j`, its exit code and its JSON."""
    import json
    from ltpx.tools.cli import main
    capsys.readouterr()
    rc = main([*argv, "-j"])
    return rc, json.loads(capsys.readouterr().out)


def _seat_rows(capsys, h) -> list[tuple]:
    """`ltp status`'s rows of h's device's seats: (port, role, label, pid, state)."""
    rc, rows = _cli(capsys, "status", "--netns", h.netns)
    assert rc in (0, None), rows
    return sorted((r["seat_port"], r["role"], r["label"], r["pid"], r["state"]) for r in rows
                  if r["dev"] == h.ifname and r.get("seat_port"))


@pytest.mark.rig
def test_two_ranks_share_one_device_each_through_its_own_port(rig, capsys):
    """Both ranks push a round to the server and take its answer by unicast,
    bit for bit, through the one device; the mux tail-called every frame to
    the rank whose port it was for. When one rank leaves, the other still
    works; when the last leaves, the device carries no program."""
    from ltpx.dataplane.xdp import lookup, mux
    h = rig.workers[0]
    with _endpoint(rig.ps, {0: 0, 1: 1}) as ps:
        a = _endpoint(h, {0: 0}, self_id=0, port=PORTS[0], shared=True, label="rank 1")
        try:
            with _endpoint(h, {1: 0}, self_id=1, port=PORTS[1], shared=True,
                           label="rank 2") as b:
                assert lookup.prog_name(lookup.xdp_on(h.ifname, h.netns)["prog_id"]) == "ltp_mux"
                assert [(s["port"], s["pid"], s["alive"]) for s in mux.seats(h.ifname, h.netns)] \
                    == [(PORTS[0], os.getpid(), True), (PORTS[1], os.getpid(), True)]
                res, got = _uplink(ps, [(0, a), (1, b)], 1)
                assert res.reason == "complete"
                for w in (0, 1):
                    np.testing.assert_array_equal(got[w], _tensor(w, 1))
                params = _tensor(9, 2)
                for w, ep in ((0, a), (1, b)):
                    ep.expect(2, NEL, w)
                ps.push_reliable(2, params, [Peer(0, h.ip, PORTS[0]), Peer(1, h.ip, PORTS[1])])
                for ep in (a, b):
                    np.testing.assert_array_equal(ep.receive(2, timeout_s=10), params)
                # each rank's own record: `ltp status` and `ltp flows` list both seats
                # and the rank each serves (EndpointConfig.label)
                assert _seat_rows(capsys, h) == [
                    (PORTS[0], "worker", "rank 1", os.getpid(), "ok"),
                    (PORTS[1], "worker", "rank 2", os.getpid(), "ok")]
                rc, snaps = _cli(capsys, "flows", h.ifname, "--netns", h.netns)
                assert rc in (0, None) and [(x["seat_port"], x["role"], x["label"])
                                            for x in snaps] == \
                    [(PORTS[0], "worker", "rank 1"), (PORTS[1], "worker", "rank 2")]
                assert all(x["totals"]["packets"] >= 85 for x in snaps), snaps   # the answer
                from ltpx.tools.cli import main
                assert main(["flows", h.ifname, "--netns", h.netns]) in (0, None)
                text = capsys.readouterr().out
                assert all(f"{h.ifname} port {p}  worker (rank {k})" in text
                           for k, p in enumerate(PORTS, 1)), text
                # the exporter: a program per seat, `dev` DEV:PORT, read
                from ltpx.dataplane.xdp.metrics import LtpCollector
                up = {s.labels["dev"]: s.value for f in LtpCollector(h.netns).collect()
                      if f.name == "ltp_program_up" for s in f.samples}
                assert up == {f"{h.ifname}:{p}": 1 for p in PORTS}, up
                # nothing to unload while both holders live
                assert main(["unload", h.ifname, "--netns", h.netns]) == 1
                assert f"ports {PORTS[0]}, {PORTS[1]}" in capsys.readouterr().err
                counts = a.seat.mux.counters()
                assert counts["dispatched"] >= 4 * 85 and counts["fell_through"] == 0
                a.close()
                a = None
                assert [s["port"] for s in mux.seats(h.ifname, h.netns)] == [PORTS[1]]
                assert [r[0] for r in _seat_rows(capsys, h)] == [PORTS[1]]
                res, got = _uplink(ps, [(1, b)], 3)
                np.testing.assert_array_equal(got[1], _tensor(1, 3))
        finally:
            if a is not None:
                a.close()
    assert lookup.xdp_on(h.ifname, h.netns) is None and _seat_rows(capsys, h) == []


HOLDER = r"""
import sys, time
from ltpx.control.transport import Endpoint
ep = Endpoint(sys.argv[1], sys.argv[2], {5: 0}, 1000, ns=sys.argv[3], self_id=5,
              port=int(sys.argv[4]), shared=True)
print("seated", flush=True)
time.sleep(120)
"""


@pytest.mark.rig
def test_a_killed_rank_s_seat_is_swept_and_its_neighbours_keep_theirs(rig, capsys):
    """A rank SIGKILLed in its seat cannot leave it: the next rank to take a
    seat on the device empties it (its process is gone) and takes its port;
    the rank beside it keeps its seat throughout. A port a live rank holds
    is refused, naming its process; so is a shared endpoint on a device an
    ordinary endpoint owns."""
    from ltpx.dataplane.xdp import lookup, mux
    h = rig.workers[0]
    with _endpoint(h, {0: 0}, self_id=0, port=PORTS[0], shared=True):
        p = subprocess.Popen([sys.executable, "-c", HOLDER, h.ifname, h.ip, h.netns,
                              str(PORTS[1])], stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "seated"
            with pytest.raises(RegistryError, match=f"port {PORTS[1]} is held by process "
                                                    f"{p.pid}"):
                _endpoint(h, {1: 0}, self_id=1, port=PORTS[1], shared=True)
            p.kill()
            p.wait()
        finally:
            p.kill()
            p.stdout.close()
        assert [(s["port"], s["alive"]) for s in mux.seats(h.ifname, h.netns)] == \
            [(PORTS[0], True), (PORTS[1], False)]
        # its record stays, dead, until the sweep or `ltp unload DEV`
        assert _seat_rows(capsys, h) == [(PORTS[0], "worker", None, os.getpid(), "ok"),
                                         (PORTS[1], "worker", None, p.pid, "dead")]
        rc, rows = _cli(capsys, "unload", h.ifname, "--netns", h.netns)
        assert rc in (0, None) and rows[0]["seats"] == 1, rows
        assert _seat_rows(capsys, h) == [(PORTS[0], "worker", None, os.getpid(), "ok")]
        with _endpoint(h, {1: 0}, self_id=1, port=PORTS[1], shared=True):
            assert sorted((s["port"], s["pid"]) for s in mux.seats(h.ifname, h.netns)) == \
                [(PORTS[0], os.getpid()), (PORTS[1], os.getpid())]
            assert [r[3:] for r in _seat_rows(capsys, h)] == [(os.getpid(), "ok")] * 2
    assert lookup.xdp_on(h.ifname, h.netns) is None and _seat_rows(capsys, h) == []
    with _endpoint(h, {0: 0}, self_id=0), pytest.raises(RegistryError, match="not LTP's mux"):
        _endpoint(h, {1: 0}, self_id=1, port=PORTS[1], shared=True)


@pytest.mark.rig
def test_ltp_train_colocated_goes_on_without_a_killed_trainer(capsys):
    """`ltp train --colocate --share-nic --kill worker:2@6`: trainer 2 dies,
    its server serves slice 2 on (childserver.orphaned); every server goes
    on without worker 2 and drops it; the two left end alike, and trainer
    2's server ends with the job (no process of the rig's is left)."""
    rc, r = _cli(capsys, "train", "--workers", "3", "--colocate", "--share-nic",
                 "--iterations", "30", "--max-missed", "2", "--kill", "worker:2@6")
    assert rc in (0, None) and r["replicas_identical"], r
    assert r["faults"]["kills"][0]["fired"] and r["iterations"] == 30, r["faults"]
    assert r["workers_lost"] == [2] and "2" in r["dropped_at"], r
    assert r["workers_present"] == [0, 1] and set(r["worker_digests"]) == {"0", "1"}
    assert r["final_train_loss"] < r["initial_train_loss"]
    deadline = time.monotonic() + 10
    while _rig_processes(r["rig"]["name"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _rig_processes(r["rig"]["name"]) == []


def _rig_processes(name: str) -> list[int]:
    """Pids of the processes whose environment names rig `name` (a rank or a
    co-located server in one of its namespaces)."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            env = (d / "environ").read_bytes() if d.name.isdigit() else b""
        except OSError:
            continue
        if f"ltp-{name}-".encode() in env:
            out.append(int(d.name))
    return out


@pytest.mark.rig
def test_ltp_train_puts_two_trainers_on_each_host_sharing_its_device(capsys):
    """`ltp train --ranks-per-node 2 --share-nic`: 4 trainers on 2 worker
    hosts, each host's pair through its one device's mux; the replicas end
    identical, and the rig is gone after."""
    rc, r = _cli(capsys, "train", "--workers", "4", "--ranks-per-node", "2", "--share-nic",
                 "--iterations", "12")
    assert rc in (0, None) and r["replicas_identical"], r
    assert (r["rig"]["worker_hosts"], r["rig"]["nodes"], r["rig"]["share_nic"]) == (2, 0, True)
    assert r["iterations"] == 12 and r["delivered_fraction"] > 0.99, r
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert r["rig"]["name"] not in left


@pytest.mark.rig
def test_ltp_train_colocated_on_shared_devices_starts_the_trainers_alone(capsys):
    """`ltp train --colocate --share-nic`: no server ranks; each of the 2
    trainers starts its own server, a second seat of its host's one device
    (the rig has no nodes and no device per rank); the replicas end alike,
    nearly every gradient delivered, and the rig is gone after."""
    rc, r = _cli(capsys, "train", "--workers", "2", "--colocate", "--share-nic",
                 "--iterations", "12")
    assert rc in (0, None) and r["replicas_identical"], r
    assert (r["rig"]["worker_hosts"], r["rig"]["nodes"], r["rig"]["servers_in_trainers"]) == \
        (2, 0, True), r["rig"]
    assert r["servers"] == 2 and r["startup"]["ranks"] == 2, (r["servers"], r["startup"])
    assert r["iterations"] == 12 and r["delivered_fraction"] > 0.99, r
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert r["rig"]["name"] not in left
