# SPDX-License-Identifier: Apache-2.0
"""The job's store, reached as 127.0.0.1:PORT from every namespace of a rig.

The store listens on the PS namespace's loopback, so coordination never
crosses the measured network. A stock script's `init_process_group`
connects to MASTER_ADDR from its own namespace, where that loopback is not
the PS's: the launcher runs this relay, a listening socket on
127.0.0.1:PORT in each other namespace of the job and, per connection, a
socket made in the PS namespace to the store, with one thread copying bytes
both ways. Every socket is non-blocking and what one side cannot take yet
waits in its own buffer (a side that holds more than HIGH pauses its
peer's reads), so a client that stops reading stalls only itself, never
another rank's store traffic. `ltpx.torch.init()` needs none of it (it opens its store socket
inside the PS namespace: LTP_STORE_NETNS), but a gloo or `ltp` backend
script does.
"""
from __future__ import annotations

import logging
import selectors
import socket
import threading

from ...dataplane import netns

log = logging.getLogger("ltpx.launch")
HIGH = 1 << 20     # bytes waiting for a slow side, past which its peer's reads pause


def _nodelay(s: socket.socket) -> socket.socket:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


class StoreRelay:
    """127.0.0.1:port in each of `namespaces` relayed to 127.0.0.1:port in
    store_netns. close() ends the thread and every socket."""

    def __init__(self, port: int, store_netns: str, namespaces):
        self.port, self.store_netns = port, store_netns
        self.sel = selectors.DefaultSelector()
        self.peer: dict[socket.socket, socket.socket] = {}
        self.out: dict[socket.socket, bytearray] = {}   # what waits to be sent on each
        self.stopping = False
        self.listeners: list[socket.socket] = []
        try:
            for ns in sorted(set(namespaces) - {store_netns}):
                with netns.inside(ns):
                    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                ls.bind(("127.0.0.1", port))
                ls.listen(128)
                ls.setblocking(False)
                self.listeners.append(ls)
                self.sel.register(ls, selectors.EVENT_READ, "listen")
        except BaseException:
            self.close()
            raise
        self.thread = threading.Thread(target=self.loop, name="ltp-store-relay", daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while not self.stopping:
            try:
                events = self.sel.select(0.2)
            except (OSError, ValueError):   # closed under us
                return
            for key, mask in events:
                s = key.fileobj
                if key.data == "listen":
                    self.accept(s)
                    continue
                if mask & selectors.EVENT_WRITE:
                    self.flush(s)
                if mask & selectors.EVENT_READ and s in self.peer:
                    self.forward(s)

    def accept(self, ls: socket.socket) -> None:
        try:
            conn, _ = ls.accept()
        except OSError:
            return
        try:
            with netns.inside(self.store_netns):
                up = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            up.connect(("127.0.0.1", self.port))
        except OSError as e:
            log.warning("store relay: cannot reach the store: %s", e)
            conn.close()
            up.close()
            return
        self.peer[conn], self.peer[up] = up, conn
        for s in (conn, up):
            _nodelay(s).setblocking(False)
            self.out[s] = bytearray()
            self.sel.register(s, selectors.EVENT_READ, "data")

    def forward(self, s: socket.socket) -> None:
        """s is readable: what it says goes to its peer (or waits for it)."""
        try:
            data = s.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.drop(s)
            return
        self.out[self.peer[s]] += data
        self.flush(self.peer[s])

    def flush(self, s: socket.socket) -> None:
        """Send what waits for s, as much as it takes now; then watch s for
        room while some is left, and its peer's reads only while little is."""
        buf = self.out.get(s)
        if buf is None:
            return
        try:
            sent = s.send(buf) if buf else 0
        except BlockingIOError:
            sent = 0
        except OSError:
            self.drop(s)
            return
        del buf[:sent]
        for x in (s, self.peer[s]):
            events = selectors.EVENT_WRITE if self.out[x] else 0
            if len(self.out[self.peer[x]]) < HIGH:
                events |= selectors.EVENT_READ
            self._watch(x, events)

    def _watch(self, s: socket.socket, events: int) -> None:
        try:
            if events:
                self.sel.modify(s, events, "data")
            else:
                self.sel.unregister(s)
        except KeyError:             # not registered now (its reads were paused)
            if events:
                self.sel.register(s, events, "data")

    def drop(self, s: socket.socket) -> None:
        other = self.peer.pop(s, None)
        for x in (s, other):
            if x is None:
                continue
            self.peer.pop(x, None)
            self.out.pop(x, None)
            try:
                self.sel.unregister(x)
            except (KeyError, ValueError):
                pass
            x.close()

    def close(self) -> None:
        self.stopping = True
        th = getattr(self, "thread", None)
        if th is not None and th is not threading.current_thread():
            th.join(2.0)
        for s in list(self.peer):
            self.drop(s)
        for ls in self.listeners:
            ls.close()
        self.listeners = []
        self.sel.close()
