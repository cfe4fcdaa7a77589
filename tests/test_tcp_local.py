# SPDX-License-Identifier: Apache-2.0
"""The TCP transport's local hop (localsock.py): a worker on its server's own
host comes by the server's Unix socket, any other by TCP; the stream is the
same (every byte in place both ways), the hello still decides who is a
worker, and the socket's file goes once the workers are in, at close, or,
its server dead, at the next server's start on the host. Real sockets."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from ltpx.control.torchapi import localsock
from ltpx.control.torchapi.host import rank_host
from ltpx.control.torchapi.link_tcp import PARALLEL_BYTES, TcpServerLink, TcpWorkerLink
from ltpx.control.torchapi.settings import Settings
from ltpx.control.trust.hello import MAC_HELLO
from tcp_links import apart, pair, round_trip

pytestmark = pytest.mark.unit

HERE = rank_host()      # a worker's host with no netns or node set: this machine's name


def families(server, workers) -> set:
    return {c.family for c in server.conns} | {w.sock.family for w in workers}


def socket_file(server) -> str:
    return os.path.join(localsock.local_dir(), f"tcp-127.0.0.1-{server.port}-"
                        f"{localsock.ns_id('pid')}-{os.getpid()}.sock")


@pytest.mark.parametrize("n", [1000, PARALLEL_BYTES // 4 * 3 + 5], ids=["small", "large"])
def test_a_worker_on_the_servers_host_comes_by_its_unix_socket(n):
    with pair(host=HERE) as (server, workers):
        assert families(server, workers) == {socket.AF_UNIX}
        assert [w.local for w in workers] == [True, True]
        assert not os.path.exists(socket_file(server))   # gone once the workers were in
        round_trip(server, workers, n)


def test_a_worker_on_another_host_or_with_the_knob_off_comes_by_tcp(monkeypatch):
    with pair(host="another-host") as (server, workers):
        assert families(server, workers) == {socket.AF_INET}
        assert [w.local for w in workers] == [False, False]
        round_trip(server, workers, 1000)
    monkeypatch.setenv("LTP_TCP_LOCAL", "0")
    with pair(host=HERE) as (server, workers):
        assert "unix" not in server.address()
        assert families(server, workers) == {socket.AF_INET}
        round_trip(server, workers, 1000)


def test_a_unix_connection_without_a_workers_hello_is_a_stray():
    """The Unix socket is no back door: a local process that does not say a
    hello under the job's key is closed and counted, as over TCP."""
    s = Settings.resolve({"ip": "127.0.0.1", "timeout": 20.0})
    server = TcpServerLink(s, 1)
    worker = TcpWorkerLink(s, 0, 1)
    stray = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        meta = apart({**server.address(), "ip": "127.0.0.1", "host": HERE})
        stray.connect(meta["unix"])
        stray.sendall(b"\xff" * MAC_HELLO.size)
        worker.connect(meta)
        server.connect({0: apart(worker.address())})
        assert server.strays == 1
        assert families(server, [worker]) == {socket.AF_UNIX}
        round_trip(server, [worker], 1000)
    finally:
        stray.close()
        worker.close()
        server.close()


def test_a_dead_servers_socket_file_is_swept_and_a_live_ones_kept():
    where = localsock.local_dir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    pidns = localsock.ns_id("pid")
    stale = os.path.join(where, f"tcp-127.0.0.1-1-{pidns}-{dead}.sock")
    live = os.path.join(where, f"tcp-127.0.0.1-2-{pidns}-{os.getpid()}.sock")
    # another pid namespace's file: its pid means nothing here, it stays
    other = os.path.join(where, f"tcp-127.0.0.1-4-{pidns + 1}-{dead}.sock")
    for path in (stale, live, other):
        with open(path, "w"):
            pass
    try:
        ls, path = localsock.listen_local("127.0.0.1", 3, 4)
        try:
            assert path is not None and os.path.exists(path)
            assert not os.path.exists(stale) and os.path.exists(live) and os.path.exists(other)
        finally:
            localsock.unlisten(ls, path)
        assert not os.path.exists(path)
    finally:
        for p in (stale, live, other):
            if os.path.exists(p):
                os.unlink(p)


def test_a_directory_others_may_write_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setattr(localsock.tempfile, "gettempdir", lambda: str(tmp_path))
    tmp_path.chmod(0o777)                       # a parent all may write, not sticky: no
    assert localsock.local_dir() is None
    tmp_path.chmod(0o1777)
    shared = tmp_path / f"ltpx-{os.getuid()}"
    shared.mkdir()
    shared.chmod(0o777)
    assert localsock.local_dir() is None
    with pair(host=HERE) as (server, workers):       # so the job goes by TCP
        assert "unix" not in server.address()
        assert families(server, workers) == {socket.AF_INET}
    shared.chmod(0o700)
    assert localsock.local_dir() == str(shared)


def test_a_worker_whose_servers_file_is_gone_or_in_another_netns_comes_by_tcp():
    """The meta says a Unix socket, but its file is gone (or the server is in
    another network namespace of this host): the worker goes by TCP, and a
    server no worker reached removes its file at close all the same."""
    s = Settings.resolve({"ip": "127.0.0.1", "timeout": 20.0})
    server = TcpServerLink(s, 2)
    workers = [TcpWorkerLink(s, w, 2) for w in range(2)]
    try:
        meta = apart({**server.address(), "ip": "127.0.0.1", "host": HERE})
        path = meta["unix"]
        workers[0].connect({**meta, "unix": path + ".gone"})
        workers[1].connect({**meta, "netns_id": meta["netns_id"] + 1})
        server.connect({i: apart(w.address()) for i, w in enumerate(workers)})
        assert families(server, workers) == {socket.AF_INET}
        assert [w.local for w in workers] == [False, False]
        round_trip(server, workers, 1000)
    finally:
        for w in workers:
            w.close()
        server.close()
    lone = TcpServerLink(s, 1)
    path = lone.address()["unix"]
    assert os.path.exists(path)
    lone.close()
    assert not os.path.exists(path)


@pytest.mark.slow
def test_colocated_servers_take_their_hosts_slices_by_unix_sockets_and_equal_gloo():
    """A real job: DDP over the `ltp` backend's TCP transport with two
    co-located servers on loopback (tests/ddp_local.py), a model of bf16
    and float32 buckets (a bf16 bucket staged as its bits, then as float32
    once its op is known to carry float32 too): every link by a Unix
    socket, and the parameters gloo's bit for bit on every replica."""
    from ddp_local import ROOT, run_local
    args = ("--hidden", "512", "--steps", "6", "--dtype", "mixed")
    script = ROOT / "scripts" / "ddp_width.py"
    ltp = run_local(2, *args, script=script, timeout=240, env_extra={"LTP_SERVERS": "2"})
    gloo = run_local(2, *args, script=script, backend="gloo", timeout=240)
    assert [r["tcp_local"] for r in ltp["results"]] == [[True, True]] * 2
    digests = {r["digest"] for r in ltp["results"] + gloo["results"]}
    assert len(digests) == 1, digests
