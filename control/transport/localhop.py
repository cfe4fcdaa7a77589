# SPDX-License-Identifier: Apache-2.0
"""A push to a rank on this endpoint's own shared device: handed over through
the kernel's test run, not the network.

Two endpoints seated on one device (dataplane/xdp/mux.py) share its
address. A frame from one to the other goes to the host's own address,
which the kernel delivers through its own stack: the NIC, and so XDP, never
sees it. So a push to a target at this endpoint's own address (a worker's
slice for the server beside it, that server's answer to it) runs each DATA
frame through the target's own program with BPF_PROG_TEST_RUN: the program
stores it exactly as it would a frame off the wire (token, bank, bitmaps,
Early Close's counters) and returns its ACK frame, which this endpoint's
own program then takes the same way, recording it for the push's loss
detection. One code path for every frame, a syscall each way a chunk, no
copy of the program's rules in Python.

The target's program is found by its port: the mux's `ltp_mux_ports` give
its seat, `ltp_mux_progs` the program's id there. It is looked up again at
each push (a rank whose endpoint grew has a new program in its seat).
"""
from __future__ import annotations

import ctypes
import os
import socket
import struct

from ...dataplane import clib
from ...dataplane.xdp import wire as W
from ...dataplane.xdp.testrun import XDP_TX, run_xdp

ETH_P_IP = 0x0800
IPPROTO_UDP = 17


def _ip_checksum(head: bytes) -> int:
    s = sum(struct.unpack("!10H", head))
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


class LocalHop:
    """This endpoint's frames to the ranks seated beside it (see the module)."""

    def __init__(self, seat, own_prog_fd: int, ip: str, port: int, mac: str):
        self.seat, self.own_fd, self.ip, self.port = seat, own_prog_fd, ip, port
        self.mac = bytes.fromhex(mac.replace(":", ""))
        self._addr = socket.inet_aton(ip)
        self.fds: dict[int, tuple[int, int]] = {}    # port -> (program id, an fd of it)
        self.frames = 0

    def local(self, ip: str) -> bool:
        """Is `ip` this endpoint's own address (a target seated beside it)?"""
        return ip == self.ip

    def target(self, port: int) -> int:
        """An fd of the program seated for `port` on this device; OSError
        (FileNotFoundError) when no seat holds it."""
        fds = self.seat.mux.fds
        seat = ctypes.c_uint32()
        clib.map_lookup(fds["ltp_mux_ports"], ctypes.c_uint16(port), seat)
        pid = ctypes.c_uint32()
        clib.map_lookup(fds["ltp_mux_progs"], seat, pid)
        have = self.fds.get(port)
        if have is not None and have[0] == pid.value:
            return have[1]
        if have is not None:
            os.close(have[1])
        fd = clib.prog_fd_by_id(pid.value)
        self.fds[port] = (pid.value, fd)
        return fd

    def head(self, port: int, nbytes: int) -> bytes:
        """Ethernet, IPv4 and UDP headers of a frame of `nbytes` of UDP payload
        to `port` at this host's address (UDP checksum 0: none)."""
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + 8 + nbytes, 0, 0x4000, 64,
                         IPPROTO_UDP, 0, self._addr, self._addr)
        ip = ip[:10] + struct.pack("!H", _ip_checksum(ip)) + ip[12:]
        return self.mac + self.mac + struct.pack("!H", ETH_P_IP) + ip + \
            struct.pack("!HHHH", self.port, port, 8 + nbytes, 0)

    def send(self, fd: int, port: int, hdrs, bodies, chunks) -> bool:
        """Chunks `chunks` of a push (their headers in `hdrs`, HDR_LEN bytes
        each, their payloads `bodies`) run as frames through the target
        program `fd`; each ACK it answers with run through this endpoint's
        own. True: sent (Push._send_batch's)."""
        hl = W.HDR_LEN
        for c in chunks:
            body = bytes(hdrs[c * hl:(c + 1) * hl]) + bytes(bodies[c])
            out = run_xdp(fd, self.head(port, len(body)) + body)
            self.frames += 1
            if out.verdict == XDP_TX:
                run_xdp(self.own_fd, out.data)
        return True

    def close(self) -> None:
        for _, fd in self.fds.values():
            os.close(fd)
        self.fds = {}
