# SPDX-License-Identifier: Apache-2.0
"""The host's floors beside a training run (`ltp train --floors`): what a
step's gradient path could take at best on this machine and rig.

  memcpy, add   GB/s of input read by np.copyto and the streaming add in
                place (np.add(a, b, out=a), issue 40's floor), one thread and
                one per CPU (as `ltp bench agg` times them)
  tcp           one TCP stream over 127.0.0.1 for about a second: the rate
                the TCP transport has at best between two processes here
  line          the rig's configured rate per port

`per_step` turns them into seconds per step for a model of P float32
parameters, W workers and S servers: the server's port carrying every
worker's gradient in (`wire_s`), the summing reading it (`aggregate_s`), a
gradient's copy (`copy_s`), and the same bytes over loopback TCP
(`loopback_s`); `against` sets a run's breakdown beside them.
"""
from __future__ import annotations

import socket
import threading
import time

import numpy as np

from ..transport.aggregate import cpu_threads, over_spans

BYTES = 64 * 2**20       # the memory arms' input: well past the caches
PIECE = 1 << 20          # what the TCP stream sends per call


def memory(nbytes: int = BYTES, min_s: float = 0.25) -> dict:
    """GB/s of memcpy and the in-place add, one thread and all: the best of 3 blocks."""
    flat = np.ones(nbytes // 4, dtype=np.float32)
    copy = np.empty_like(flat)
    half = flat.size // 2
    a, b = flat[:half], flat[half:2 * half]
    everyone = cpu_threads()
    arms = {}
    for tag, t in (("1", 1), ("all", everyone)):
        arms[f"memcpy_{tag}"] = (lambda t=t: over_spans(
            flat.size, lambda lo, hi: np.copyto(copy[lo:hi], flat[lo:hi]), t))
        arms[f"add_{tag}"] = (lambda t=t: over_spans(
            half, lambda lo, hi: np.add(a[lo:hi], b[lo:hi], out=a[lo:hi]), t))
    out = {}
    for name, f in arms.items():
        f()     # page faults, thread pools
        best = 0.0
        for _ in range(3):
            n, t0 = 0, time.perf_counter()
            while True:
                f()
                n += 1
                dt = time.perf_counter() - t0
                if dt >= min_s / 3:
                    break
            best = max(best, n * flat.nbytes / dt / 1e9)
        out[name] = round(best, 3)
    return {**out, "threads_all": everyone}


def tcp_loopback(seconds: float = 1.0) -> dict:
    """One TCP stream over 127.0.0.1 for `seconds`: bytes/s the receiver took."""
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    got = {"bytes": 0, "s": 0.0}

    def receive():
        conn, _ = lsock.accept()
        buf = bytearray(PIECE)
        with conn:
            t0 = time.perf_counter()
            while True:
                n = conn.recv_into(buf)
                if not n:
                    break
                got["bytes"] += n
            got["s"] = time.perf_counter() - t0
    th = threading.Thread(target=receive, name="ltpx-floor-rx", daemon=True)
    th.start()
    payload = bytes(PIECE)
    with socket.create_connection(lsock.getsockname()) as s:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            s.sendall(payload)
    th.join(10)
    lsock.close()
    bps = got["bytes"] / got["s"] if got["s"] > 0 else 0.0
    return {"tcp_loopback_gbps": round(bps / 1e9, 3), "tcp_bytes": got["bytes"],
            "tcp_s": round(got["s"], 3)}


def measure(line_bps: float, seconds: float = 1.0) -> dict:
    """Every floor, now: memory, loopback TCP, and the line rate given."""
    return {**memory(min_s=seconds / 2), **tcp_loopback(seconds), "line_bps": line_bps}


def per_step(floors: dict, params: int, workers: int, servers: int = 1) -> dict:
    """Seconds per step at each floor for P float32 parameters (see the module)."""
    grad = 4 * params
    inbound = workers * grad / max(1, servers)        # bytes into one server's port
    return {"wire_s": inbound * 8 / floors["line_bps"],
            "aggregate_s": inbound / (floors["add_all"] * 1e9),
            "copy_s": grad / (floors["memcpy_1"] * 1e9),
            "loopback_s": inbound / (floors["tcp_loopback_gbps"] * 1e9)
            if floors.get("tcp_loopback_gbps") else None}


def against(breakdown: dict, step: dict) -> dict:
    """A run's breakdown over the floors (per_step): how many times each floor
    its step (the run's mean, and the median worker's median), summing,
    staging and copy back took (medians)."""
    w = (breakdown.get("worker") or {}).get("median", {})
    s = (breakdown.get("server") or {}).get("median", {})

    def over(x, floor):
        return round(x / floor, 2) if x is not None and floor else None
    return {"floors_s": {k: (round(v, 6) if v is not None else None) for k, v in step.items()},
            "step_over_wire": over(breakdown.get("step_s"), step["wire_s"]),
            "wall_over_wire": over(w.get("wall"), step["wire_s"]),
            "aggregate_over_floor": over(s.get("aggregate"), step["aggregate_s"]),
            "staging_over_copy": over(w.get("staging"), step["copy_s"]),
            "copy_back_over_copy": over(w.get("copy_back"), step["copy_s"])}
