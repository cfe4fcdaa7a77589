# SPDX-License-Identifier: Apache-2.0
"""The TCP transport's links in one process, for tests: a server link and its
workers' links connected on this host (tests/test_tcp_parallel.py,
tests/test_tcp_local.py)."""
from __future__ import annotations

import contextlib
import threading
from pathlib import Path

from ltpx.control.torchapi.link_tcp import TcpServerLink, TcpWorkerLink
from ltpx.control.torchapi.settings import Settings


@contextlib.contextmanager
def pair(timeout: float = 20.0, host: str | None = None, workers: int = 2):
    """A server link and `workers` workers' links connected on this host;
    closed at the end, also when the test fails (a worker thread blocked on
    one then ends). host: the server's, as its meta says it (a worker whose
    own host it is comes by the server's Unix socket); None: over TCP."""
    cc = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    s = Settings.resolve({"ip": "127.0.0.1", "cc": cc, "timeout": timeout})
    server = TcpServerLink(s, workers)
    links = [TcpWorkerLink(s, w, workers) for w in range(workers)]
    meta = {**server.address(), "ip": "127.0.0.1", **({"host": host} if host else {})}
    try:
        for w in links:
            w.connect(meta)
        server.connect({i: w.address() for i, w in enumerate(links)})
        yield server, links
    finally:
        for w in links:
            w.close()
        server.close()


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
