# SPDX-License-Identifier: Apache-2.0
"""`ltp demo`: one tensor through the XDP program on a veth pair in namespaces.

A worker namespace sends the tensor as LTP DATA chunks in random order; the
parameter-server namespace's XDP program writes them into mapped memory and
answers each with an ACK built at the NIC; the worker's XDP program records
the ACKs. Unacknowledged chunks are re-sent until all are in. Everything is
removed afterwards.
"""
from __future__ import annotations

import sys
import time

from .common import UsageError, add_command, add_json, emit, need_bcc, need_root, wants_json
from .flags import add_xdp_mode


def register(sub) -> None:
    p = add_command(sub, "demo", "push one tensor through the XDP program on a veth pair",
                    epilog="examples:\n  sudo ltp demo\n  sudo ltp demo --elements 1000000 -j\n"
                           "  sudo ltp demo --mode skb\n")
    p.add_argument("--elements", type=int, default=262144,
                   help="float32 elements in the tensor (default 262144 = 1 MiB)")
    add_xdp_mode(p)
    p.add_argument("--seed", type=int, default=0, help="random seed of the tensor")
    add_json(p)
    p.set_defaults(func=cmd_demo)


def cmd_demo(args) -> None:
    if not 1 <= args.elements <= 8_000_000:
        raise UsageError("--elements must be in 1..8000000")
    need_root("ltp demo")
    need_bcc()
    import numpy as np

    from ..dataplane.xdp import wire as W
    from ..dataplane.xdp.loader import Dataplane, Geometry
    from ..dataplane.rig.pair import VethPair

    g = Geometry(slots=1, max_chunks=-(-args.elements * 4 // W.CHUNK_BYTES))
    tensor = np.random.default_rng(args.seed).standard_normal(args.elements).astype(np.float32)
    raw = tensor.tobytes()
    nchunks = -(-len(raw) // g.chunk_bytes)
    chunks = [raw[i * g.chunk_bytes:(i + 1) * g.chunk_bytes] for i in range(nchunks)]
    say = (lambda m: None) if wants_json(args) else (lambda m: print(m, file=sys.stderr))
    worker_id, round_ = 1, 1
    with VethPair() as pair, Dataplane(g) as ps, Dataplane(g) as wk:
        say(f"namespaces {pair.a.ns} (worker {pair.a.ip}) and {pair.b.ns} (PS {pair.b.ip}), "
            f"XDP {args.mode} mode")
        pm, wm = ps.maps(), wk.maps()
        pm.set_peers({worker_id: 0})
        wm.set_peers({worker_id: 0})
        pm.open_bank(round_, nchunks, len(chunks[-1]))
        wm.tx_start(round_, 0)
        pair.attach(ps, pair.b, args.mode)
        pair.attach(wk, pair.a, args.mode)
        sock = pair.udp_socket(pair.a)
        sock.setblocking(False)
        order = np.random.default_rng(args.seed + 1).permutation(nchunks)
        msgs = [W.pack_header(worker=worker_id, round=round_, chunk=c, nchunks=nchunks,
                              length=len(chunks[c])) + chunks[c] for c in range(nchunks)]
        t0 = time.perf_counter()
        sent, passes = _send_until_acked(sock, (pair.b.ip, g.port), msgs, order, wm, round_)
        elapsed = time.perf_counter() - t0
        pm.close_bank(round_)
        got = pm.slot_values(round_, 0, args.elements)
        delivered = pm.done_mask(round_, 0, nchunks)
        out = {
            "elements": args.elements, "bytes": len(raw), "chunks": nchunks,
            "datagrams_sent": sent, "send_passes": passes,
            "acked": int(wm.tx_state(round_, 0)["acked"]), "delivered": int(delivered.sum()),
            "bit_exact": bool(np.array_equal(got, tensor)), "seconds": round(elapsed, 4),
            "goodput_mbit_s": round(len(raw) * 8 / elapsed / 1e6, 1),
            "first_elements": [round(float(x), 6) for x in got[:4]],
            "ps_counters": {k: v for k, v in pm.counters().items() if v},
            "worker_counters": {k: v for k, v in wm.counters().items() if v},
        }
        sock.close()
    emit(args, out, _text)
    return 0 if out["bit_exact"] else 1


def _send_until_acked(sock, dst, msgs: list[bytes], order, wm, round_: int) -> tuple[int, int]:
    """Send the chunks not ACKed yet, in `order`, until all are (at most 50
    passes; each waits up to 50 ms for ACKs); datagrams sent and passes."""
    nchunks = len(msgs)
    sent = passes = 0
    while True:
        acked = wm.acked_mask(round_, 0, nchunks)
        todo = [c for c in order if not acked[c]]
        if not todo or passes >= 50:
            return sent, passes
        passes += 1
        for c in todo:
            try:
                sock.sendto(msgs[c], dst)
                sent += 1
            except BlockingIOError:
                time.sleep(0.0005)
        deadline = time.perf_counter() + 0.05
        while time.perf_counter() < deadline and wm.tx_state(round_, 0)["acked"] < nchunks:
            time.sleep(0.001)


def _text(o: dict) -> str:
    return (f"pushed {o['elements']} float32 ({o['bytes']} bytes) as {o['chunks']} chunks "
            f"in random order: {o['datagrams_sent']} datagrams, {o['send_passes']} pass(es)\n"
            f"PS memory holds {o['delivered']}/{o['chunks']} chunks, worker saw "
            f"{o['acked']} ACKs built by the PS's XDP program\n"
            f"bit-exact: {o['bit_exact']}   first elements {o['first_elements']}\n"
            f"{o['seconds']:.3f} s, {o['goodput_mbit_s']} Mbit/s\n"
            f"PS counters: {o['ps_counters']}\nworker counters: {o['worker_counters']}")
