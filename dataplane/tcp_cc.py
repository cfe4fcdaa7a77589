# SPDX-License-Identifier: Apache-2.0
"""TCP congestion control on this host: which the kernel offers, loading one
(modprobe tcp_<cc>), and choosing it for a socket (TCP_CONGESTION). The TCP
baselines of the benchmarks and of training use it."""
from __future__ import annotations

import socket
import subprocess

from ..errors import LtpError

AVAILABLE_CC = "/proc/sys/net/ipv4/tcp_available_congestion_control"
TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)


def available_cc() -> list[str]:
    try:
        with open(AVAILABLE_CC) as f:
            return f.read().split()
    except OSError:
        return []


def ensure_cc(cc: str) -> None:
    """Make sure congestion control `cc` can be set on a socket: load
    tcp_<cc> with modprobe when it is not registered yet."""
    if cc in available_cc():
        return
    try:
        subprocess.run(["modprobe", f"tcp_{cc}"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        pass
    if cc not in available_cc():
        raise LtpError(f"TCP congestion control {cc!r} is not available (the kernel offers: "
                       f"{' '.join(available_cc()) or 'nothing readable'}); `modprobe tcp_{cc}` "
                       f"failed or the module is not built for this kernel")


def set_cc(sock: socket.socket, cc: str) -> None:
    try:
        sock.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, cc.encode())
    except OSError as e:
        raise LtpError(f"setsockopt(TCP_CONGESTION, {cc}): {e.strerror} "
                       f"(`modprobe tcp_{cc}`; ensure_cc does it)") from e
