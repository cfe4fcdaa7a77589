# SPDX-License-Identifier: Apache-2.0
"""Traffic through a rig, to check it: blast UDP from workers to the PS and
measure the bottleneck rate and the injected loss (`measure_rate`, `ltp rig
check`), or send one datagram to see whether a path works (`reachable`)."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from .. import netns
from ...errors import RigError

# One sender: as many `size`-byte datagrams to dst:port as it can for `secs`,
# then "<sent> <failed sends>" (a full socket buffer fails a send: counted).
_BLAST = r"""
import socket, sys, time
dst, port, size, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
buf = b"\x00" * size
addr = (dst, port)
end = time.monotonic() + secs
n = err = 0
send = s.sendto
while True:
    for _ in range(256):
        try:
            send(buf, addr)
            n += 1
        except OSError:
            err += 1
    if time.monotonic() >= end:
        break
print(n, err)
"""


def udp_blast(rig: Any, senders: Sequence[Any], dst: Any, seconds: float,
              payload: int = 1472, port: int = 9) -> list[subprocess.Popen]:
    """Start one Python UDP sender per host in `senders` (hosts of the star
    `rig`: Host, name or worker index), each sending `payload`-byte datagrams
    to `dst` as fast as it can for `seconds`. Each process prints how many
    datagrams it sent and how many sends failed."""
    d = rig.host(dst)
    return [rig.spawn(s, [sys.executable, "-c", _BLAST, d.ip, str(port), str(payload),
                          str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      text=True) for s in senders]


def _sent(procs: list[subprocess.Popen], timeout: float) -> tuple[int, int]:
    """(datagrams sent, failed sends) summed over the senders of udp_blast."""
    sent = send_errors = 0
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise RigError(f"UDP sender failed: {err.strip()[-300:]}")
        n, e = (int(x) for x in out.split())
        sent, send_errors = sent + n, send_errors + e
    return sent, send_errors


def measure_rate(rig: Any, seconds: float = 2.0, senders: int = 4, payload: int = 1472,
                 warmup: float = 0.4) -> dict[str, Any]:
    """Blast UDP from up to `senders` workers of the star `rig` to the PS for
    `seconds`; the achieved bottleneck rate is the PS veth's received bytes
    (Ethernet frames, as TBF counts them) over a window that skips `warmup`
    at the start; the measured drop fraction comes from the loss injector's
    counters."""
    port = 9
    sink = rig.socket(rig.ps, socket.AF_INET, socket.SOCK_DGRAM)  # bound, never read: no ICMP
    procs: list[subprocess.Popen] = []
    try:
        sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sink.bind((rig.ps.ip, port))
        c0, q0 = rig.loss_counters(), rig.bottleneck()[0]
        procs = udp_blast(rig, rig.workers[:max(1, senders)], rig.ps, seconds, payload, port)
        time.sleep(warmup)
        s0, t0 = rig.link_stats(rig.ps), time.monotonic()
        time.sleep(max(0.2, seconds - warmup - 0.2))
        s1, t1 = rig.link_stats(rig.ps), time.monotonic()
        sent, send_errors = _sent(procs, seconds + 10)
        c1, q1 = rig.loss_counters(), rig.bottleneck()[0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        sink.close()
    dropped = c1["dropped"] - c0["dropped"]
    passed = c1["passed"] - c0["passed"]
    rate = (s1["rx_bytes"] - s0["rx_bytes"]) * 8 / (t1 - t0)
    return {"rate_requested_bps": rig.config.rate_bps, "rate_measured_bps": rate,
            "rate_ratio": rate / rig.config.rate_bps,
            "loss_requested": rig.get_loss(),
            "loss_measured": dropped / (dropped + passed) if dropped + passed else 0.0,
            "window_s": t1 - t0, "senders": len(procs), "datagrams_sent": sent,
            "send_errors": send_errors,
            "injector_dropped": dropped, "injector_passed": passed,
            "tbf_drops": q1.get("drops", 0) - q0.get("drops", 0),
            "payload_bytes": payload}


def reachable(rig: Any, src: Any, dst: Any, port: int = 9999, timeout_s: float = 1.0) -> bool:
    """Does a UDP datagram from host `src` reach a socket on host `dst` (hosts
    with .netns and .ip; `rig` is not used, kept for callers)?"""
    with netns.inside(dst.netns):
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with netns.inside(src.netns):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind((dst.ip, port))
        rx.settimeout(timeout_s)
        tx.sendto(b"ltp-reach " + src.ip.encode(), (dst.ip, port))
        data, addr = rx.recvfrom(256)
        return addr[0] == src.ip
    except OSError:
        return False
    finally:
        rx.close()
        tx.close()
