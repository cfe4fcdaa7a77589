# SPDX-License-Identifier: Apache-2.0
"""Issue 16, findings 1, 2 and 5, on the rig with real processes, kills and packets.

1. An attachment must not outlive its owner: an endpoint's program and maps
   go when its process is killed, `ltp status` shows the record `dead`, and
   `ltp rig down` leaves no record, pin, program or map behind.
2. A push to a dead PS raises DeadPeerError within its timeout, mid-push
   too, and in its 1.5 s sends at most three passes' worth of packets.
5. Nothing silently replaces an XDP program: a second endpoint, `ltp load`
   and an endpoint on a foreign program are refused at once with the holder
   named; force (`--force`) replaces.

The endpoints under test run in processes of their own (HOLDER), inside the
rig's namespaces, and are killed with SIGKILL.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

from conftest import requires_bpf, star_rig
from ltp_cli import ltp, ltp_json

pytestmark = requires_bpf

RIG = f"own{os.getpid() % 100000}"
NEL = 262_144                      # 737 chunks of 1424 bytes
NCH = -(-NEL * 4 // 1424)
SLOW = 20e6                        # the PS's capacity: 10 Mbit/s per worker, 0.9 s a push

# An endpoint in a process of its own: prints what it holds, waits for its
# round if it opened one, then waits to be killed.
HOLDER = r"""
import json, os, sys, time
from ltpx.control.transport import Endpoint
from ltpx.dataplane.xdp import lookup
dev, ip, peers, cap, round_ = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), \
    float(sys.argv[4]), int(sys.argv[5])
ep = Endpoint(dev, ip, {int(w): s for w, s in peers.items()}, %d, mode="native",
              capacity_bps=cap, role="ps" if len(peers) > 1 else "worker")
if round_ >= 0:
    ep.open_round(round_, %d)
print(json.dumps({"pid": os.getpid(), "prog_id": lookup.prog_id(ep.dp.prog_fd),
                  "link_id": ep.dp.link_id(), "map_ids": ep.dp.map_ids()}), flush=True)
if round_ >= 0:  # waits as a PS does: its heartbeat keeps its program ACKing
    ep.wait_round(round_)
time.sleep(3600)
""" % (NEL, NEL)


class Holder:
    """A HOLDER process on `host` of `rig`; `info` is what it printed."""

    def __init__(self, host, peers: dict[int, int], capacity: float = 1e9, round_: int = -1):
        import subprocess

        from ltpx.dataplane import netns
        self.proc = netns.popen(host.netns, [sys.executable, "-c", HOLDER, host.ifname, host.ip,
                                             json.dumps(peers), str(capacity), str(round_)],
                                stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line, f"holder on {host.name} exited with {self.proc.wait()}"
        self.info = json.loads(line)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc.stdout.close()


def within(pred, seconds: float) -> float | None:
    """Seconds until pred() holds (polled every ms), None if not within `seconds`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if pred():
            return time.monotonic() - t0
        time.sleep(0.001)
    return None


def gone(prog_id: int, map_ids: dict[str, int]) -> bool:
    """Are the program and every map freed by the kernel?"""
    from ltpx.dataplane import clib
    for opener, oid in [(clib.prog_fd_by_id, prog_id), *((clib.map_fd_by_id, m)
                                                          for m in map_ids.values())]:
        try:
            os.close(opener(oid))
            return False
        except OSError:
            pass
    return True


def rx_packets(host) -> int:
    from ltpx.dataplane.rig.netlink import iproute
    with iproute(host.netns) as ipr:
        return ipr.get_links(ifname=host.ifname)[0].get_attr("IFLA_STATS64")["rx_packets"]


def status_of(host) -> dict:
    (row,) = [r for r in ltp_json("status", "--netns", host.netns) if r["dev"] == host.ifname]
    return row


@pytest.fixture(scope="module")
def rig():
    yield from star_rig(clear=True, name=RIG, workers=2, loss=0.0)


def _worker(h):
    """A worker with the paced socket sender: the PS's advertised rate (SLOW)
    keeps its pushes going for seconds, past the PS's death (the ACK clock
    goes at the rig's line rate and would be done before it)."""
    from ltpx.control.transport import Endpoint
    return Endpoint(h.ifname, h.ip, {h.index: 0}, NEL, ns=h.netns, self_id=h.index,
                    initial_rate_bps=SLOW / 2, sender="socket")


def _push(ep, h, ps, round_, out, timeout_s=2.0):
    from ltpx.control.transport import Peer
    t0 = time.perf_counter()
    try:
        out[h.index] = ep.push(round_, np.ones(NEL, np.float32), Peer(h.index, ps.ip),
                               timeout_s=timeout_s)
    except Exception as e:  # noqa: BLE001  (the test judges it)
        out[h.index] = e
    out[h.index, "s"] = time.perf_counter() - t0


@pytest.mark.rig
def test_killed_ps_takes_program_and_maps_along_and_workers_get_the_error(rig):
    from ltpx.control.transport import DeadPeerError
    from ltpx.dataplane.xdp import registry
    ps, ws = rig.ps, rig.workers
    holder = Holder(ps, {w.index: i for i, w in enumerate(ws)}, capacity=SLOW, round_=1)
    workers = []
    try:
        row = status_of(ps)          # alive: listed, maps readable by id from another process
        assert (row["state"], row["owner"], row["pid"], row["prog_id"], row["maps"]) == \
            ("ok", "process", holder.info["pid"], holder.info["prog_id"], row["maps_expected"])
        assert not os.path.exists(registry.pin_dir(ps.ifname, ps.netns))   # nothing pinned
        (fl,) = ltp_json("flows", ps.ifname, "--netns", ps.netns)
        assert fl["prog_id"] == holder.info["prog_id"] and len(fl["flows"]) == 2

        workers = [_worker(w) for w in ws]
        out: dict = {}
        threads = [threading.Thread(target=_push, args=(ep, w, ps, 1, out))
                   for ep, w in zip(workers, ws)]
        for t in threads:
            t.start()
        time.sleep(0.3)                  # mid-push: about a third of each is acknowledged
        holder.kill()
        detached = within(lambda: registry.xdp_on(ps.ifname, ps.netns) is None, 2.0)
        for t in threads:
            t.join()
        assert detached is not None and detached < 1.0
        assert within(lambda: gone(holder.info["prog_id"], holder.info["map_ids"]), 2.0)
        for w in ws:                     # every worker: the error, within its timeout + 1 s
            err = out[w.index]
            assert isinstance(err, DeadPeerError), err
            assert 0 < err.report.acked < NCH and ps.ip in str(err)
            assert out[w.index, "s"] < 2.0 + 1.0

        row = status_of(ps)
        assert (row["state"], row["maps"], row["attached"]) == ("dead", 0, None)
        (fl,) = ltp_json("flows", "--netns", ps.netns, rc=1)
        assert "died" in fl["error"]

        # a new push to the dead PS: no ACK, the error, at most three passes of packets
        acks = workers[0].counters()["ack_rx"]
        before = rx_packets(ps)
        _push(workers[0], ws[0], ps, 3, out, timeout_s=1.5)
        err = out[ws[0].index]
        assert isinstance(err, DeadPeerError) and err.report.acked == 0, err
        assert 1.5 <= out[ws[0].index, "s"] < 1.5 + 1.0
        assert workers[0].counters()["ack_rx"] == acks
        assert NCH <= err.report.sent <= 3 * NCH
        assert rx_packets(ps) - before <= 3 * NCH + 4    # what reached the PS's device

        (done,) = ltp_json("unload", ps.ifname, "--netns", ps.netns)
        assert done["prog_id"] == holder.info["prog_id"] and "died" in done["note"]
        assert registry.entries(ps.netns) == []
    finally:
        holder.kill()
        for ep in workers:
            ep.close()


@pytest.mark.rig
def test_a_second_endpoint_or_load_is_refused_at_once_naming_the_first(rig, monkeypatch):
    from ltpx.control.transport import Endpoint, endpoint
    from ltpx.errors import RegistryError
    ps = rig.ps
    holder = Holder(ps, {0: 0, 1: 1})
    try:
        def no_compile(*a, **k):                    # refused before compiling anything
            raise AssertionError("the program was compiled before the refusal")
        monkeypatch.setattr(endpoint, "Dataplane", no_compile)
        with pytest.raises(RegistryError) as e:
            Endpoint(ps.ifname, ps.ip, {0: 0, 1: 1}, NEL, ns=ps.netns)
        monkeypatch.undo()
        msg = str(e.value)
        assert f"pid {holder.info['pid']}" in msg and "force=True" in msg
        err = ltp_json("load", ps.ifname, "--netns", ps.netns, "--role", "ps", "--workers", 2,
                       rc=1)
        assert f"pid {holder.info['pid']}" in err["error"] and "--force" in err["error"]
        err = ltp_json("unload", ps.ifname, "--netns", ps.netns, rc=1)   # a live owner's
        assert "running LTP endpoint" in err["error"]
        row = status_of(ps)
        assert (row["state"], row["prog_id"]) == ("ok", holder.info["prog_id"])
    finally:
        holder.kill()


@pytest.mark.rig
def test_foreign_program_is_refused_and_force_replaces_it(rig):
    from ltpx.control.transport import Endpoint
    from ltpx.dataplane.xdp import loader, registry
    from ltpx.errors import RegistryError
    ps = rig.ps
    for n, dev in registry.entries(ps.netns):   # a dead holder's record from the test before
        registry.unload(dev, n)
    loader.attach_pass(ps.ifname, ps.netns, "native")       # over netlink: not LTP's
    foreign = registry.xdp_on(ps.ifname, ps.netns)["prog_id"]
    try:
        with pytest.raises(RegistryError) as e:
            Endpoint(ps.ifname, ps.ip, {0: 0, 1: 1}, NEL, ns=ps.netns)
        assert f"XDP program id {foreign} 'xdp_pass' (native)" in str(e.value)
        assert "force=True" in str(e.value)
        err = ltp_json("load", ps.ifname, "--netns", ps.netns, "--role", "ps", "--workers", 2,
                       rc=1)
        assert f"id {foreign} 'xdp_pass'" in err["error"] and "--force" in err["error"]
        assert registry.xdp_on(ps.ifname, ps.netns)["prog_id"] == foreign

        new = ltp_json("load", ps.ifname, "--netns", ps.netns, "--role", "ps", "--workers", 2,
                       "--max-elems", NEL, "--force")
        assert registry.xdp_on(ps.ifname, ps.netns)["prog_id"] == new["prog_id"] != foreign
        assert os.path.exists(os.path.join(new["pin_dir"], "link"))   # the operator's: pinned
        with Endpoint(ps.ifname, ps.ip, {0: 0, 1: 1}, NEL, ns=ps.netns, force=True) as ep:
            row = status_of(ps)
            assert (row["owner"], row["state"], row["pid"]) == ("process", "ok", os.getpid())
            assert row["prog_id"] == registry.xdp_on(ps.ifname, ps.netns)["prog_id"] \
                not in (new["prog_id"], foreign)
            assert not os.path.exists(new["pin_dir"])   # what it replaced is unpinned
            assert ep.dp.link_id()
        assert registry.xdp_on(ps.ifname, ps.netns) is None   # closed: detached, no record
        assert registry.entries(ps.netns) == []
        assert gone(new["prog_id"], {})
    finally:
        loader.clear(ps.ifname, ps.netns)
        registry.clear_namespace(ps.netns)


@pytest.mark.rig
def test_rig_down_leaves_nothing_after_killed_endpoints():
    """`ltp rig down` after SIGKILLed endpoints and an `ltp load`: no record,
    pin folder, program, map or namespace of the rig is left."""
    from ltpx.dataplane import netns
    from ltpx.dataplane.rig.star import Rig
    from ltpx.dataplane.xdp import registry
    name = f"{RIG}d"
    ltp("rig", "up", "--name", name, "--workers", 2)
    holders = []
    try:
        rig = Rig.attach(name)
        ps, w0, w1 = rig.ps, *rig.workers
        holders = [Holder(ps, {0: 0, 1: 1}, round_=1), Holder(w0, {w0.index: 0})]
        load = ltp_json("load", w1.ifname, "--netns", w1.netns, "--role", "worker", "--id",
                        w1.index, "--max-elems", 1000)
        objects = [(h.info["prog_id"], h.info["map_ids"]) for h in holders]
        objects.append((load["prog_id"], load["map_ids"]))
        for h in holders:
            h.kill()
        assert sorted(r["state"] for ns in rig.namespaces
                      for r in ltp_json("status", "--netns", ns)) == ["dead", "dead", "ok"]
        ltp("rig", "down", "--name", name)
        for ns in rig.namespaces:
            assert not netns.exists(ns)
            assert registry.entries(ns) == []
            assert not os.path.exists(os.path.join(registry.PIN_ROOT, ns))
            assert not os.path.exists(os.path.join(registry.RECORD_ROOT, ns))
        for prog, maps in objects:
            assert within(lambda prog=prog, maps=maps: gone(prog, maps), 2.0), (prog, maps)
    finally:
        for h in holders:
            h.kill()
        if Rig.exists(name):
            Rig.destroy(name)
