# SPDX-License-Identifier: Apache-2.0
"""Can a device run the ACK clock? (`ltp doctor`, docs/transport.md)

The clock grows each ACK the receiver sent with XDP_TX back into a DATA
packet (bpf_xdp_adjust_tail). Where the driver builds the XDP buffer with
no tail room, the grow fails and the socket sender is the one to use. This
check runs the clock for real on a veth pair in two namespaces of its own
(ltp-g<pid>-a/-b, removed afterwards): ltp_xdp on both ends, one clocked
flow of 8 chunks primed with one packet from a socket; the other 7 must be
made by the sender's program from ACKs, with no failed grow.
"""
from __future__ import annotations

import os
import time

import numpy as np

from ..rig.pair import VethPair
from ..xdp import clock
from ..xdp import wire as W
from ..xdp.loader import MODES, Dataplane, Geometry

CHUNKS = 8
DEADLINE_S = 5.0   # ends as soon as all chunks are in; generous for a loaded machine


def grow_check(mode: str = "native", prefix: str | None = None) -> tuple[bool, str]:
    """(ok, what happened) for a veth pair in `mode` (native or skb)."""
    if mode not in MODES:
        raise ValueError(f"mode must be native or skb, got {mode!r}")
    g = Geometry(slots=1, max_chunks=64)
    cb = g.chunk_bytes
    payload = np.arange(CHUNKS * cb // 4, dtype=np.float32).view(np.uint8)
    with VethPair(prefix or f"ltp-g{os.getpid()}") as pair, \
            Dataplane(g, job=1) as ps, Dataplane(g, job=1) as wk:
        pm, wm = ps.maps(), wk.maps()
        pm.set_peers({1: 0})
        wm.set_peers({1: 0})
        pm.open_bank(1, CHUNKS, cb, flows=1, window=CHUNKS)
        wm.tx_start(1, 0)
        clock.load(wm, 1, payload, list(range(CHUNKS)), np.zeros(CHUNKS, bool), cb)
        clock.start(wm, 1, 0, nchunks=CHUNKS, last_len=cb, flags=0, primed=1)
        ps.attach(pair.b.dev, pair.b.ns, mode)
        wk.attach(pair.a.dev, pair.a.ns, mode)
        sock = pair.udp_socket(pair.a)
        try:
            hdr = W.pack_header(flags=W.F_CLOCK, worker=1, job=1, round=1, chunk=0,
                                nchunks=CHUNKS, length=cb, rate=W.clock_stamp(1, 0))
            sock.sendto(hdr + payload[:cb].tobytes(), (pair.b.ip, W.PORT))
            deadline = time.monotonic() + DEADLINE_S
            while not pm.done_mask(1, 0, CHUNKS).all() and time.monotonic() < deadline:
                time.sleep(0.005)
        finally:
            sock.close()
        c = wm.counters()
        done = int(pm.done_mask(1, 0, CHUNKS).sum())
        ok = done == CHUNKS and c["grow_fail"] == 0 and c["clock_tx"] == CHUNKS - 1
        return ok, (f"{mode} veth: {c['clock_tx']} of {CHUNKS - 1} ACKs grown into DATA, "
                    f"{c['grow_fail']} failed grows, {done}/{CHUNKS} chunks delivered")
