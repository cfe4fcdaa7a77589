# SPDX-License-Identifier: Apache-2.0
"""The TCP transport's links in one process, for tests: a server link and its
workers' links connected on this host (tests/test_tcp_parallel.py,
tests/test_tcp_local.py)."""
from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import numpy as np

from ltpx.control.torchapi.link_tcp import TcpServerLink, TcpWorkerLink
from ltpx.control.torchapi.settings import Settings


@contextlib.contextmanager
def pair(timeout: float = 20.0, host: str | None = None, workers: int = 2,
         near: bool = False):
    """A server link and `workers` workers' links connected on this host;
    closed at the end, also when the test fails (a worker thread blocked on
    one then ends). host: the server's, as its meta says it (a worker whose
    own host it is comes by the server's Unix socket); None: over TCP.
    near: the links meet in memory, as a co-located trainer's do (handoff.py);
    else each side's meta hides that they share this process."""
    s = settings(timeout)
    server = TcpServerLink(s, workers)
    links = [TcpWorkerLink(s, w, workers) for w in range(workers)]
    def seen(meta: dict) -> dict:
        return meta if near else apart(meta)
    meta = seen({**server.address(), "ip": "127.0.0.1", **({"host": host} if host else {})})
    try:
        for w in links:
            w.connect(meta)
        server.connect({i: seen(w.address()) for i, w in enumerate(links)})
        yield server, links
    finally:
        for w in links:
            w.close()
        server.close()


def settings(timeout: float = 20.0) -> Settings:
    """A loopback job's settings: the host's congestion control."""
    cc = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    return Settings.resolve({"ip": "127.0.0.1", "cc": cc, "timeout": timeout})


def again(server, w: int, workers: int) -> TcpWorkerLink:
    """Worker w restarted: a new link of its own connected to `server`, as a
    restarted process's (the caller closes it)."""
    link = TcpWorkerLink(settings(), w, workers)
    link.connect(apart({**server.address(), "ip": "127.0.0.1"}))
    return link


def apart(meta: dict) -> dict:
    """A link's meta without its process (`proc`): its peer in this process
    then connects by a socket, as one in another process does."""
    return {k: v for k, v in meta.items() if k != "proc"}


def in_threads(*calls):
    errors = []

    def run(c):
        try:
            c()
        except BaseException as e:
            errors.append(e)
    ts = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in ts:
        t.start()
    return ts, errors


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
