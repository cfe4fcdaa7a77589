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

import numpy as np
import pytest

from ltpx.control.torchapi import localsock
from ltpx.control.torchapi.host import rank_host
from ltpx.control.torchapi.link_tcp import PARALLEL_BYTES, TcpServerLink, TcpWorkerLink
from ltpx.control.torchapi.settings import Settings
from ltpx.control.trust.hello import MAC_HELLO
from tcp_links import in_threads, pair

pytestmark = pytest.mark.unit

HERE = rank_host()      # a worker's host with no netns or node set: this machine's name


def round_trip(server, workers, n: int) -> None:
    """Each worker pushes a row of n elements, the server gathers them and
    answers their sum: every byte as sent, both ways."""
    rows = [np.arange(n, dtype=np.float32) * (w + 1) - w for w in range(len(workers))]
    ids = list(range(len(workers)))
    server.ensure(n)
    server.open(1, n, ids, False)
    ts, errors = in_threads(*[lambda w=w: workers[w].push(1, rows[w].copy(), False) for w in ids])
    got = server.gather(1, n, ids)
    for t in ts:
        t.join()
    assert not errors
    assert all(np.array_equal(got.values[w], rows[w]) for w in ids)
    answer = got.values.sum(axis=0)
    outs = [np.zeros(n, np.float32) for _ in ids]
    ts, errors = in_threads(*[lambda w=w: workers[w].pull(2, outs[w]) for w in ids])
    server.send(2, answer, False)
    for t in ts:
        t.join()
    assert not errors and all(np.array_equal(o, answer) for o in outs)


def families(server, workers) -> set:
    return {c.family for c in server.conns} | {w.sock.family for w in workers}


def socket_file(server) -> str:
    return os.path.join(localsock.local_dir(),
                        f"tcp-127.0.0.1-{server.port}-{os.getpid()}.sock")


@pytest.mark.parametrize("n", [1000, PARALLEL_BYTES // 4 * 3 + 5], ids=["small", "large"])
def test_a_worker_on_the_servers_host_comes_by_its_unix_socket(n):
    with pair(host=HERE) as (server, workers):
        assert families(server, workers) == {socket.AF_UNIX}
        assert not os.path.exists(socket_file(server))   # gone once the workers were in
        round_trip(server, workers, n)


def test_a_worker_on_another_host_or_with_the_knob_off_comes_by_tcp(monkeypatch):
    with pair(host="another-host") as (server, workers):
        assert families(server, workers) == {socket.AF_INET}
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
        meta = {**server.address(), "ip": "127.0.0.1", "host": HERE}
        stray.connect(meta["unix"])
        stray.sendall(b"\xff" * MAC_HELLO.size)
        worker.connect(meta)
        server.connect({0: worker.address()})
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
    stale = os.path.join(where, f"tcp-127.0.0.1-1-{dead}.sock")
    live = os.path.join(where, f"tcp-127.0.0.1-2-{os.getpid()}.sock")
    for path in (stale, live):
        with open(path, "w"):
            pass
    try:
        ls, path = localsock.listen_local("127.0.0.1", 3, 4)
        try:
            assert path is not None and os.path.exists(path)
            assert not os.path.exists(stale) and os.path.exists(live)
        finally:
            localsock.unlisten(ls, path)
        assert not os.path.exists(path)
    finally:
        for p in (stale, live):
            if os.path.exists(p):
                os.unlink(p)


def test_a_directory_others_may_write_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setattr(localsock.tempfile, "gettempdir", lambda: str(tmp_path))
    shared = tmp_path / f"ltpx-{os.getuid()}"
    shared.mkdir()
    shared.chmod(0o777)
    assert localsock.local_dir() is None
    with pair(host=HERE) as (server, workers):       # so the job goes by TCP
        assert "unix" not in server.address()
        assert families(server, workers) == {socket.AF_INET}
    shared.chmod(0o700)
    assert localsock.local_dir() == str(shared)
