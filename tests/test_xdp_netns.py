# SPDX-License-Identifier: Apache-2.0
"""ltp_xdp attached in native mode on a veth pair in namespaces, real UDP."""
from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from conftest import requires_bpf
from ltpx.dataplane import netns
from ltpx.dataplane.xdp import wire as W

pytestmark = requires_bpf

JOB = 0x5EED
NCHUNKS = 5
CHUNK = 1424


def chunks_of(arr: np.ndarray):
    raw = arr.tobytes()
    return [raw[i:i + CHUNK] for i in range(0, len(raw), CHUNK)]


def datagram(worker, round_, chunk, body, job=JOB):
    return W.pack_header(worker=worker, job=job, round=round_, chunk=chunk, nchunks=NCHUNKS,
                         length=len(body)) + body


def wait_for(pred, timeout=3.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


@pytest.fixture
def pair():
    from ltpx.dataplane.rig.pair import VethPair
    with VethPair("ltp-t-xdp") as p:
        yield p
    assert not netns.exists("ltp-t-xdp-a") and not netns.exists("ltp-t-xdp-b")


@pytest.mark.rig
def test_push_with_pass_peer_acks_reach_a_socket(pair, small_geometry):
    from ltpx.dataplane.xdp.loader import Dataplane
    tensor = np.random.default_rng(1).standard_normal(4 * CHUNK // 4 + 2).astype(np.float32)
    parts = chunks_of(tensor)
    assert len(parts) == NCHUNKS
    with Dataplane(small_geometry, job=JOB) as ps:
        m = ps.maps()
        m.set_peers({2: 0})
        m.open_bank(11, NCHUNKS, len(parts[-1]))
        pair.attach(ps, pair.b, "native")
        pair.attach_pass(pair.a, "native")
        sock = pair.udp_socket(pair.a)
        sock.settimeout(2.0)
        for i in reversed(range(NCHUNKS)):  # out of order on purpose
            sock.sendto(datagram(2, 11, i, parts[i]), (pair.b.ip, W.PORT))
        acks = set()
        for _ in range(NCHUNKS):
            data, src = sock.recvfrom(2048)  # the kernel checked the UDP checksum
            h = W.unpack_header(data)
            assert (h.type, h.worker, h.round, h.state, src) == \
                (W.T_ACK, 2, 11, W.RS_OPEN, (pair.b.ip, W.PORT))
            acks.add(h.chunk)
        assert acks == set(range(NCHUNKS))
        assert m.done_mask(11, 0, NCHUNKS).all()
        got = m.slot_values(11, 0, tensor.size)
        assert np.array_equal(got, tensor)
        assert m.counters()["ack_tx"] == NCHUNKS
        sock.close()


@pytest.mark.rig
def test_worker_role_records_acks_in_its_map(pair, small_geometry):
    """Both ends run ltp_xdp: the PS turns DATA into ACKs at its NIC and the
    worker's program records them and drops them before any socket."""
    from ltpx.dataplane.xdp.loader import Dataplane
    with Dataplane(small_geometry, job=JOB) as ps, Dataplane(small_geometry, job=JOB) as wk:
        pm, wm = ps.maps(), wk.maps()
        pm.set_peers({5: 3})
        wm.set_peers({5: 0})
        pm.open_bank(2, NCHUNKS, 8)
        pm.set_rate(3, 123_000)
        wm.tx_start(2, 0)
        pair.attach(ps, pair.b, "native")
        pair.attach(wk, pair.a, "native")
        sock = pair.udp_socket(pair.a)
        sock.setblocking(False)
        for i in (0, 3, 4):
            body = b"\x11" * (8 if i == NCHUNKS - 1 else CHUNK)
            sock.sendto(datagram(5, 2, i, body), (pair.b.ip, W.PORT))
        assert wait_for(lambda: wm.tx_state(2, 0)["acked"] == 3)
        assert wm.acked_mask(2, 0, NCHUNKS).tolist() == [True, False, False, True, True]
        assert wm.tx_state(2, 0)["rate_kbps"] == 123_000
        with pytest.raises(BlockingIOError):
            sock.recv(2048)  # ACKs were consumed at the worker's NIC
        # close the round: a late chunk is answered CLOSED, which stops the sender
        pm.close_bank(2)
        sock.sendto(datagram(5, 2, 1, b"\x22" * CHUNK), (pair.b.ip, W.PORT))
        assert wait_for(lambda: wm.tx_state(2, 0)["closed"] == 1)
        assert not pm.done_mask(2, 3, NCHUNKS)[1]
        assert pm.counters()["late"] == 1
        # foreign job never reaches memory
        sock.sendto(datagram(5, 2, 2, b"\x33" * CHUNK, job=JOB + 1), (pair.b.ip, W.PORT))
        assert wait_for(lambda: pm.counters()["foreign_job"] == 1)
        sock.close()


@pytest.mark.rig
def test_pair_is_removed_when_the_body_raises():
    from ltpx.dataplane.rig.pair import VethPair
    with pytest.raises(RuntimeError), VethPair("ltp-t-raise") as p:
        assert netns.exists(p.a.ns)
        raise RuntimeError("boom")
    assert not netns.exists("ltp-t-raise-a") and not netns.exists("ltp-t-raise-b")


@pytest.mark.rig
def test_sockets_in_the_pair_cannot_leave_it(pair):
    sock = pair.udp_socket(pair.a)
    with pytest.raises(OSError):
        sock.sendto(b"x", ("198.19.1.1", 9))  # no route outside the pair's /24
    sock.close()
    with netns.inside(pair.a.ns):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with pytest.raises(OSError):
        s.connect(("192.0.2.1", 9))
    s.close()


@pytest.mark.rig
def test_current_namespace_is_named(pair):
    assert netns.current() != pair.a.ns
    with netns.inside(pair.a.ns):
        assert netns.current() == pair.a.ns
    with netns.inside(pair.b.ns):
        assert netns.current() == pair.b.ns
