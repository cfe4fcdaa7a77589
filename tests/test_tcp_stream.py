# SPDX-License-Identifier: Apache-2.0
"""The TCP links' streamed answers (control/torchapi/tcpstream.py), over
real loopback sockets: a part the server is fed is on the wire before the
answer is finished; every worker gets the answer's exact bytes whether it
was streamed or sent whole, read by its reader thread or in one piece;
answers expected ahead are read in order; a connection that closes
mid-answer fails the pull instead of hanging it."""
from __future__ import annotations

import fcntl
import socket
import struct
import termios
import time
from pathlib import Path

import numpy as np
import pytest

from ltpx.control.torchapi.link_tcp import HDR, TcpServerLink, TcpWorkerLink
from ltpx.control.torchapi.settings import Settings
from ltpx.errors import CommError

pytestmark = pytest.mark.unit
CC = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()


def _links(streams: list[bool], server_streams: bool = True):
    s = Settings.resolve({"ip": "127.0.0.1", "cc": CC})
    off = Settings.resolve({"ip": "127.0.0.1", "cc": CC, "stream_share": 0.0})
    server = TcpServerLink(s if server_streams else off, len(streams))
    workers = [TcpWorkerLink(s if on else off, w, len(streams)) for w, on in enumerate(streams)]
    for w in workers:
        w.connect({**server.address(), "ip": "127.0.0.1"})
    server.connect({i: w.address() for i, w in enumerate(workers)})
    return server, workers


def _close(server, workers):
    for w in workers:
        w.close()
    server.close()


def _waiting(sock: socket.socket) -> int:
    """Bytes in the socket's receive queue."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]


def test_a_fed_part_is_on_the_wire_before_the_answer_is_finished():
    server, workers = _links([False, False])      # workers that read only when pulled
    try:
        buf = np.zeros(3000, np.float32)
        st = server.stream(7, buf, False, to=[0, 1], wait_s=1.0)
        buf[:1000] = np.arange(1000)
        st.feed(1000)
        deadline = time.monotonic() + 10
        while any(_waiting(w.sock) < HDR.size + 4000 for w in workers):
            assert time.monotonic() < deadline, [_waiting(w.sock) for w in workers]
            time.sleep(0.01)
        # nothing past the fed part went
        assert all(_waiting(w.sock) == HDR.size + 4000 for w in workers)
        buf[1000:] = 5.0
        st.finish()
        assert st.parts >= 2
        for w in workers:
            out = np.empty(3000, np.float32)
            w.expect(7, 3000)
            w.pull(7, out)
            assert np.array_equal(out, buf)
    finally:
        _close(server, workers)


@pytest.mark.parametrize("server_streams", [True, False])
def test_streamed_or_whole_every_worker_gets_the_exact_answer(server_streams):
    server, workers = _links([True, False, True], server_streams)
    rng = np.random.default_rng(1)
    try:
        for d in (3, 4):                       # two answers, each expected before it comes
            for w in workers:
                w.expect(d, 5000)
            buf = rng.standard_normal(5000).astype(np.float32)
            st = server.stream(d, buf, False, to=[0, 1, 2], wait_s=1.0)
            assert (st is None) == (not server_streams)
            if st is None:
                server.send(d, buf, False)
            else:
                for k in (1000, 2500, 4999):
                    st.feed(k)
                st.finish()
            for w in workers:
                out = np.empty(5000, np.float32)
                w.pull(d, out)
                assert np.array_equal(out, buf)
    finally:
        _close(server, workers)


def test_answers_expected_ahead_are_read_in_order():
    server, workers = _links([True])
    w = workers[0]
    try:
        w.expect(1, 10)
        w.expect(2, 20)
        server.send(1, np.full(10, 1.0, np.float32), False)
        server.send(2, np.full(20, 2.0, np.float32), False)
        b, a = np.empty(20, np.float32), np.empty(10, np.float32)
        w.pull(1, a)
        w.pull(2, b)
        assert a.tolist() == [1.0] * 10 and b.tolist() == [2.0] * 20
    finally:
        _close(server, workers)


def test_a_connection_closed_mid_answer_fails_the_pull():
    server, workers = _links([True])
    w = workers[0]
    try:
        w.expect(5, 1000)
        body = np.zeros(1000, np.float32).tobytes()
        conn = server.conns[0]
        conn.setblocking(True)
        conn.sendall(HDR.pack(0x4C545054, 5, len(body)) + body[:100])
        conn.close()
        with pytest.raises(CommError):
            w.pull(5, np.empty(1000, np.float32))
    finally:
        server.conns = []
        _close(server, workers)
