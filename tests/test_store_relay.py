# SPDX-License-Identifier: Apache-2.0
"""The launcher's store relay: one client that stops reading stalls only itself.

The relay (control/launcher/storerelay.py) carries every rank's store
traffic from its namespace to the store's. Here a server of our own stands
in for the store in one namespace and the relay listens in another: client
A asks for 64 MB and reads none of them for now; client B's requests are answered all
the while, and A's bytes all arrive once it reads. Real namespaces, real
sockets.
"""
from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from ltpx.dataplane import netns

BIG = 64 << 20    # past what the kernel buffers for a client that does not read


def _serve(ls: socket.socket, stop: threading.Event) -> None:
    """A thread per connection: "big" -> BIG bytes, "ping" -> "pong"."""
    def one(c: socket.socket) -> None:
        with c:
            while not stop.is_set():
                try:
                    req = c.recv(4)
                except OSError:
                    return
                if not req:
                    return
                try:
                    c.sendall(b"x" * BIG if req == b"big!" else b"pong")
                except OSError:
                    return
    ls.settimeout(0.2)
    while not stop.is_set():
        try:
            c, _ = ls.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        threading.Thread(target=one, args=(c,), daemon=True).start()


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(min(1 << 20, n - len(out)))
        if not chunk:
            break
        out += chunk
    return bytes(out)


@pytest.mark.rig
def test_a_client_that_stops_reading_stalls_no_other():
    from ltpx.control.launcher.storerelay import StoreRelay
    base = f"ltprl{os.getpid() % 100000}"
    store_ns, rank_ns = f"{base}-s", f"{base}-r"
    stop = threading.Event()
    relay = None
    socks: list[socket.socket] = []
    try:
        for ns in (store_ns, rank_ns):
            netns.create(ns)
        with netns.inside(store_ns):
            ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        socks.append(ls)
        ls.bind(("127.0.0.1", 0))
        ls.listen(16)
        port = ls.getsockname()[1]
        threading.Thread(target=_serve, args=(ls, stop), daemon=True).start()
        relay = StoreRelay(port, store_ns, [store_ns, rank_ns])

        def client() -> socket.socket:
            with netns.inside(rank_ns):
                c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(c)
            c.settimeout(5.0)
            c.connect(("127.0.0.1", port))
            return c
        a, b = client(), client()
        a.sendall(b"big!")                 # ... and a reads nothing for now
        time.sleep(0.5)                    # the kernel's buffers toward a fill up
        for _ in range(20):
            b.sendall(b"ping")
            assert _recv_exactly(b, 4) == b"pong"
        assert _recv_exactly(a, BIG) == b"x" * BIG     # nothing of a's was lost either
    finally:
        stop.set()
        if relay is not None:
            relay.close()
        for s in socks:
            s.close()
        for ns in (store_ns, rank_ns):
            netns.remove(ns)
