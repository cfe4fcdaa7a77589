# SPDX-License-Identifier: Apache-2.0
"""Can a device run the ACK clock? (`ltp doctor`, docs/transport.md)

The clock grows each ACK the receiver sent with XDP_TX back into a DATA
packet (bpf_xdp_adjust_tail). Where the driver builds the XDP buffer with
no tail room, the grow fails and the socket sender is the one to use. This
check runs the clock for real on a veth pair in two namespaces of its own
(ltp-g<pid>-a/-b, removed afterwards): ltp_xdp on both ends, one clocked
flow of 8 chunks primed with one packet from a socket; the other 7 must be
made by the sender's program from ACKs, with no failed grow.

`grow_verdict` is the same check for an endpoint choosing its default
sender (control/transport/options.py): asked once per process and mode,
and its answer kept in the compile cache's folder (bpfcache), keyed by the
kernel, the toolchain and the BPF sources, so the ranks of a job and the
next jobs on this kernel read it instead of building a pair each. Only a
definite answer is kept: a pass, or a fail with grows that failed; a check
that could not run or ran out of time on a loaded machine is this
process's answer alone.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass

import numpy as np

from ... import BPF_DIR
from ..xdp import bpfcache

from ..rig.pair import VethPair
from ..xdp import clockmaps
from ..xdp import wire as W
from ..xdp.loader import MODES, Dataplane, Geometry

CHUNKS = 8
DEADLINE_S = 5.0   # ends as soon as all chunks are in; generous for a loaded machine


log = logging.getLogger("ltpx.growcheck")


@dataclass(frozen=True)
class Verdict:
    """The grow check's answer. definite: it ran and either passed or saw
    grows fail (kept across processes); `source`: "checked" (this process
    ran it now), "process" (an earlier answer of this process) or "cache"
    (the file another process wrote)."""

    ok: bool
    detail: str
    definite: bool = True
    source: str = "checked"


def grow_check(mode: str = "native", prefix: str | None = None) -> tuple[bool, str]:
    """(ok, what happened) for a veth pair in `mode` (native or skb)."""
    v = _run(mode, prefix)
    return v.ok, v.detail


def _run(mode: str, prefix: str | None = None) -> Verdict:
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
        clockmaps.load(wm, 1, payload, list(range(CHUNKS)), np.zeros(CHUNKS, bool), cb)
        clockmaps.start(wm, 1, 0, nchunks=CHUNKS, last_len=cb, flags=0, primed=1)
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
        return Verdict(ok, f"{mode} veth: {c['clock_tx']} of {CHUNKS - 1} ACKs grown into DATA, "
                       f"{c['grow_fail']} failed grows, {done}/{CHUNKS} chunks delivered",
                       definite=ok or c["grow_fail"] > 0)


_memo: dict[str, Verdict] = {}
_memo_lock = threading.Lock()


def _key(mode: str) -> str:
    """What the answer depends on: kernel build, toolchain, the BPF sources, mode."""
    srcs = sorted(p for p in BPF_DIR.rglob("*") if p.suffix in (".c", ".h"))
    parts = {"mode": mode, "uname": list(os.uname())[2:4], "toolchain": bpfcache.toolchain(),
             "sources": [[str(p.relative_to(BPF_DIR)), hashlib.sha256(p.read_bytes())
                          .hexdigest()] for p in srcs]}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def grow_verdict(mode: str = "native", fresh: bool = False) -> Verdict:
    """The grow check's answer for `mode`, run at most once per process and,
    while the compile cache's folder is usable, once per kernel and BPF
    sources (concurrent first askers wait for one check). fresh: run it now
    and keep what it says (`ltp doctor`). Never raises: a check that cannot
    run is a fail, not definite."""
    with _memo_lock:
        if mode in _memo and not fresh:
            v = _memo[mode]
            return Verdict(v.ok, v.detail, v.definite, "process")
        try:
            v = _cached(mode, fresh)
        except Exception as e:  # noqa: BLE001 - any failure is the socket sender's case
            v = Verdict(False, f"the check could not run: {e}", definite=False)
        _memo[mode] = v
        return v


def _cached(mode: str, fresh: bool = False) -> Verdict:
    if mode not in MODES:
        raise ValueError(f"mode must be native or skb, got {mode!r}")
    try:
        cache = bpfcache.Cache(bpfcache.cache_dir())
        key = "grow-" + _key(mode)[:32]
    except (bpfcache.Unusable, ImportError, OSError) as e:
        log.debug("grow check not cached: %s", e)
        return _run(mode)
    path = cache.dir / f"{key}.json"
    with cache.lock(key):
        kept = None if fresh else _read(path)
        if kept is not None:
            return kept
        v = _run(mode)
        if v.definite:
            tmp = path.with_name(f".tmp-{key}-{os.getpid()}")
            with contextlib.suppress(OSError):
                tmp.write_text(json.dumps({**asdict(v), "at": time.strftime("%Y-%m-%dT%H:%M:%S")}))
                os.chmod(tmp, 0o644)
                os.replace(tmp, path)
        return v


def _read(path) -> Verdict | None:
    """The answer kept in `path`, if it is there, root's and whole."""
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        st = path.stat()
        if st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022:
            d = json.loads(path.read_text())
            return Verdict(bool(d["ok"]), str(d["detail"]), True, "cache")
    return None


def forget() -> None:
    """Drop this process's answers (the cache's file stays): the next
    grow_verdict reads the file or checks again."""
    with _memo_lock:
        _memo.clear()
