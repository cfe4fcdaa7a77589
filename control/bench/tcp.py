# SPDX-License-Identifier: Apache-2.0
"""TCP incast on the rig: barrier-synchronised rounds in which every worker
sends SIZE bytes over TCP to the parameter server.

`run_tcp_incast(rig, size, rounds, cc)` is the measurement (`ltp rig
incast-tcp`, and the TCP side of `ltp bench incast`). It starts two kinds of
agent, each `python -m ltpx.control.bench.tcp ...` inside a rig namespace:

- the PS agent listens, accepts one persistent connection per worker (the
  worker says its index first), then per round writes one "go" byte on every
  connection and reads until each connection has delivered SIZE bytes. The
  round time is from just before the first "go" to the arrival of the last
  byte, measured at the PS (one clock). It prints one JSON line per round,
  with the machine's busy CPU seconds over the same span (cpustat.busy_s).
- a worker agent connects (with the requested TCP congestion control, set
  per socket with TCP_CONGESTION), then waits for "go" and sends SIZE bytes,
  until it reads "q" or EOF.

The "go" byte travels PS -> worker, the data worker -> PS, so the barrier
costs one one-way trip on the unshaped direction. Round 0.. `warmup`-1 are
run but not counted (connection start-up and slow start from the initial
window).
"""
from __future__ import annotations

import argparse
import json
import os
import select
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from ...dataplane.tcp_cc import ensure_cc, set_cc
from ...errors import BenchError, LtpError
from ..accept import accept_workers
from ..procs import stop_all
from .cpustat import busy_s

DEFAULT_PORT = 5201
def _percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), without numpy."""
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(times: list[float], *, workers: int, size: int, rate_bps: int,
              cc: str) -> dict[str, Any]:
    """The result dict of an incast run from its round times."""
    limit = workers * size * 8 / rate_bps
    med = statistics.median(times)
    p99 = _percentile(times, 99)
    return {"median_s": med, "p99_s": p99, "max_s": max(times), "min_s": min(times),
            "mean_s": statistics.fmean(times), "limit_s": limit,
            "median_over_limit": med / limit, "p99_over_limit": p99 / limit,
            "cc": cc, "workers": workers, "size_bytes": size, "rounds": len(times),
            "rate_bps": rate_bps, "round_s": times}


def run_tcp_incast(rig, size: int = 256 * 1024, rounds: int = 20, cc: str = "cubic", *,
                   warmup: int = 1, port: int = DEFAULT_PORT,
                   progress: Callable[[int, int, float], None] | None = None,
                   round_timeout: float = 60.0) -> dict[str, Any]:
    """Run `rounds` incast rounds on `rig` (a dataplane.rig.Rig) and return
    median/p99/max round time, the line-rate limit (N * size * 8 / rate) and
    the ratios. `progress(done, total, seconds)` is called after each counted
    round. Every process started here is gone when this returns or raises."""
    if size < 1:
        raise ValueError(f"size: must be positive, got {size}")
    if rounds < 1:
        raise ValueError(f"rounds: must be positive, got {rounds}")
    ensure_cc(cc)
    workers = rig.workers
    py = sys.executable
    common = ["--port", str(port), "--size", str(size), "--cc", cc]
    procs: list[subprocess.Popen] = []
    try:
        ps = rig.spawn(rig.ps, [py, "-m", "ltpx.control.bench.tcp", "ps", "--bind", rig.ps.ip,
                                "--workers", str(len(workers)), "--rounds", str(rounds + warmup),
                                "--round-timeout", str(round_timeout), *common],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        procs.append(ps)
        line = _readline(ps, 20.0)
        if line.strip() != "ready":
            raise BenchError(f"PS agent did not start: {line.strip()} {_stderr(ps)}")
        for w in workers:
            procs.append(rig.spawn(w, [py, "-m", "ltpx.control.bench.tcp", "worker", "--ps",
                                       rig.ps.ip, "--id", str(w.index), *common],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        times: list[float] = []
        cpu: list[float] = []
        while True:
            line = _readline(ps, round_timeout + 30.0)
            if not line:
                bad = [p for p in procs[1:] if p.poll() not in (None, 0)]
                why = _stderr(bad[0]) if bad else _stderr(ps)
                raise BenchError(f"PS agent stopped early: {why}")
            msg = json.loads(line)
            if "error" in msg:
                raise BenchError(f"PS agent: {msg['error']}")
            if "round" in msg and msg["round"] >= warmup:
                times.append(msg["t"])
                cpu.append(msg["cpu_s"])
                if progress:
                    progress(len(times), rounds, msg["t"])
            if msg.get("done"):
                break
        ps.wait(timeout=10)
    finally:
        stop_all(procs, grace_s=5.0)
    res = summarize(times, workers=len(workers), size=size, rate_bps=rig.config.rate_bps, cc=cc)
    res.update({"warmup_rounds": warmup, "buffer_bytes": rig.config.buffer_bytes,
                "loss": rig.config.loss, "cpu_s": cpu})
    return res


def _readline(p: subprocess.Popen, timeout: float) -> str:
    r, _, _ = select.select([p.stdout], [], [], timeout)
    if not r:
        raise BenchError(f"no word from the PS agent in {timeout:.0f} s")
    return p.stdout.readline()


def _stderr(p: subprocess.Popen) -> str:
    if p.poll() is None:
        return "(still running)"
    try:
        return (p.stderr.read() or "").strip()[-500:] if p.stderr else ""
    except (OSError, ValueError):
        return ""


# --------------------------------------------------------------------------- agents

def _set_cc(s: socket.socket, cc: str) -> None:
    try:
        set_cc(s, cc)
    except LtpError as e:  # an agent reports it as its one error line
        raise SystemExit(str(e)) from None


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _index(raw: bytes, workers: int) -> int | None:
    """A worker agent's hello: its index, 4 bytes big-endian (None: not one)."""
    i = int.from_bytes(raw, "big")
    return i if i < workers else None


def _ps_agent(a: argparse.Namespace) -> int:
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _set_cc(ls, a.cc)
    ls.bind((a.bind, a.port))
    ls.listen(a.workers + 8)
    print("ready", flush=True)
    acc = accept_workers(ls, a.workers, 4, lambda raw: _index(raw, a.workers), 30.0)
    conns = acc.conns
    if len(conns) < a.workers:
        _emit({"error": f"only {len(conns)} of {a.workers} workers connected in 30 s "
                        f"({acc.strays} other connection(s) closed)"})
        return 1
    for c in conns.values():
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    socks = list(conns.values())
    fdmap = {s.fileno(): s for s in socks}
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    ep = select.epoll()
    for s in socks:
        ep.register(s.fileno(), select.EPOLLIN)
    for r in range(a.rounds):
        got = dict.fromkeys(fdmap, 0)
        pending = len(socks)
        b0 = busy_s()
        t0 = time.perf_counter()
        for s in socks:
            s.sendall(b"g")
        deadline = time.monotonic() + a.round_timeout
        while pending:
            events = ep.poll(1.0)
            if not events and time.monotonic() > deadline:
                _emit({"error": f"round {r} took more than {a.round_timeout} s "
                                f"({pending} workers unfinished)"})
                return 1
            for fd, _ in events:
                n = fdmap[fd].recv_into(view)
                if n == 0:
                    _emit({"error": f"a worker closed its connection in round {r}"})
                    return 1
                got[fd] += n
                if got[fd] == a.size:
                    pending -= 1
                elif got[fd] > a.size:
                    _emit({"error": "a worker sent more than SIZE bytes"})
                    return 1
        t = time.perf_counter() - t0
        _emit({"round": r, "t": t, "cpu_s": busy_s() - b0})
    for s in socks:
        try:
            s.sendall(b"q")
        except OSError:
            pass
    _emit({"done": True, "strays": acc.strays})
    for s in socks:
        s.close()
    return 0


def _worker_agent(a: argparse.Namespace) -> int:
    deadline = time.monotonic() + 20.0
    while True:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        _set_cc(s, a.cc)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            s.connect((a.ps, a.port))
            break
        except OSError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    s.sendall(a.id.to_bytes(4, "big"))
    payload = b"\x5a" * a.size
    while True:
        c = s.recv(1)
        if c != b"g":
            break
        s.sendall(payload)
    s.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ltpx.control.bench.tcp",
                                description="TCP incast agents (started by run_tcp_incast)")
    sub = p.add_subparsers(dest="role", required=True)
    for role in ("ps", "worker"):
        q = sub.add_parser(role)
        q.add_argument("--port", type=int, default=DEFAULT_PORT)
        q.add_argument("--size", type=int, required=True)
        q.add_argument("--cc", default="cubic")
        if role == "ps":
            q.add_argument("--bind", required=True)
            q.add_argument("--workers", type=int, required=True)
            q.add_argument("--rounds", type=int, required=True)
            q.add_argument("--round-timeout", type=float, default=60.0)
        else:
            q.add_argument("--ps", required=True)
            q.add_argument("--id", type=int, required=True)
    a = p.parse_args(argv)
    try:
        return _ps_agent(a) if a.role == "ps" else _worker_agent(a)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
