# SPDX-License-Identifier: Apache-2.0
"""Decode LTP frames with struct (no per-packet dissection), and the AF_PACKET
capture that serves where the device's XDP program is not ours.

Decoding takes the header layout from wire.LtpHdr (the one Python
description of bpf/ltp_wire.h). Frames come from the XDP ring
(capring.RingCapture: each frame as ltp_xdp saw it, with its verdict), from a
capture file (pcap.read), or from `LiveCapture`: an AF_PACKET socket made
inside the namespace with a classic BPF filter for UDP to or from the LTP
port, stamped by the kernel (SO_TIMESTAMPNS). An XDP program runs before the
kernel's packet taps, so on a device whose XDP program consumes LTP frames
the socket sees none of them nor the ACKs XDP_TX sends; there the ring is
the way in.
"""
from __future__ import annotations

import ctypes
import datetime
import socket
import struct
import time
from typing import Any
from collections.abc import Iterator

from .. import netns
from . import wire as W
from .capring import CaptureError
from .pcap import LINKTYPE_ETHERNET

ETH_P_ALL = 0x0003
SO_ATTACH_FILTER = 26
SO_TIMESTAMPNS = 35             # SO_TIMESTAMPNS_OLD: struct timespec of two longs
SO_RCVBUFFORCE = 33
SOL_PACKET = 263
IP_FRAG_OFFSET = 0x1fff         # the IPv4 header's fragment offset bits: a fragment has some set
PACKET_STATISTICS = 6
PACKET_OUTGOING = 4
# link types a capture file may have, and where their IPv4 header starts
LINKTYPE_LINUX_SLL, LINKTYPE_RAW, LINKTYPE_LINUX_SLL2 = 113, 101, 276

#: the LTP header as struct reads it, in LtpHdr's field order (network order)
HDR = struct.Struct("!" + "".join({1: "B", 2: "H", 4: "I", 8: "Q"}[ctypes.sizeof(t)]
                                  for _, t in W.LtpHdr._fields_))
HDR_NAMES = [n for n, _ in W.LtpHdr._fields_]
_IP = struct.Struct("!BBHHHBBH4s4s")
_UDP = struct.Struct("!HHHH")
STATES = {W.RS_OPEN: "open", W.RS_CLOSED: "closed"}


def type_name(t: int) -> str:
    if t in W.TYPE_NAMES:
        return W.TYPE_NAMES[t]
    return f"CTRL{t}" if W.T_CTRL_MIN <= t <= 15 else f"TYPE{t}"


def _l3(frame: bytes, linktype: int) -> int | None:
    """Offset of the IPv4 header in `frame`, None if it carries none."""
    if linktype == LINKTYPE_ETHERNET:
        if len(frame) < 14:
            return None
        off, proto = 14, frame[12:14]
        while proto in (b"\x81\x00", b"\x88\xa8") and len(frame) >= off + 4:  # VLAN tags
            proto, off = frame[off + 2:off + 4], off + 4
        return off if proto == b"\x08\x00" else None
    if linktype == LINKTYPE_LINUX_SLL:
        return 16 if frame[14:16] == b"\x08\x00" else None
    if linktype == LINKTYPE_LINUX_SLL2:
        return 20 if frame[0:2] == b"\x08\x00" else None
    if linktype == LINKTYPE_RAW:
        return 0
    return None


def decode(frame: bytes, *, ts_ns: int = 0, wire_len: int | None = None,
           direction: str | None = None, port: int = W.PORT,
           linktype: int = LINKTYPE_ETHERNET) -> dict[str, Any] | None:
    """One frame -> a dict of its LTP header, or None if it is not IPv4 UDP
    to or from `port` (later fragments included: they carry no UDP header).
    payload_bytes is what the frame carried on the wire, snaplen or not;
    time_ns is exact (time, a float, keeps about a quarter of a microsecond)."""
    at = _l3(frame, linktype)
    if at is None or len(frame) < at + 28:
        return None
    vihl, _, tot_len, _, frag, _, proto, _, src, dst = _IP.unpack_from(frame, at)
    if vihl >> 4 != 4 or proto != 17 or frag & 0x1FFF:
        return None
    l4 = at + (vihl & 15) * 4
    if len(frame) < l4 + 8:
        return None
    sport, dport, _, _ = _UDP.unpack_from(frame, l4)
    if port not in (sport, dport):
        return None
    wire = len(frame) if wire_len is None else wire_len
    body = min(at + tot_len, wire) - l4 - 8        # UDP payload on the wire
    sec, ns = divmod(ts_ns, 1_000_000_000)
    d: dict[str, Any] = {"time": sec + ns / 1e9, "time_ns": ts_ns, "dir": direction,
                         "src": socket.inet_ntoa(src),
                         "sport": sport, "dst": socket.inet_ntoa(dst), "dport": dport,
                         "wire_len": wire}
    if body < W.HDR_LEN or len(frame) < l4 + 8 + W.HDR_LEN:
        d.update(type="?", bad=f"short: {max(body, 0)} of {W.HDR_LEN} header bytes")
        return d
    h = dict(zip(HDR_NAMES, HDR.unpack_from(frame, l4 + 8)))
    d.update({"type": type_name(h["type"]), "worker": h["worker"], "job": h["job"],
              "round": h["round"], "chunk": h["chunk"], "nchunks": h["nchunks"],
              "flags": [n for bit, n in sorted(W.FLAG_NAMES.items()) if h["flags"] & bit],
              "len": h["len"], "payload_bytes": body - W.HDR_LEN,
              "state": STATES.get(h["state"]), "rate_kbps": h["rate"], "token": h["token"]})
    if h["magic"] != W.MAGIC:
        d["bad"] = f"magic {h['magic']:#06x}"
    elif h["version"] != W.VERSION:
        d["bad"] = f"version {h['version']}"
    return d


def matches(d: dict[str, Any], job: int | None, worker: int | None, round_: int | None) -> bool:
    """Does a decoded frame pass the --job/--worker/--round filters (a frame
    too short for a header passes only when none is set)?"""
    want = {"job": job, "worker": worker, "round": round_}
    return all(v is None or d.get(k) == v for k, v in want.items())


def line(d: dict[str, Any]) -> str:
    """One text line per packet: time, direction, addresses, type, worker,
    round, chunk/nchunks, length, flags (and state and rate of an ACK, and
    the verdict of ltp_xdp when the frame came from its ring)."""
    ts = datetime.datetime.fromtimestamp(d["time"]).strftime("%H:%M:%S.%f")
    out = (f"{ts} {d['dir'] or '-':3} {d['src']}:{d['sport']} > {d['dst']}:{d['dport']} "
           f"{d['type']}")
    if "worker" in d:
        out += (f" w={d['worker']} r={d['round']} c={d['chunk']}/{d['nchunks']} len={d['len']}"
                f" flags={','.join(d['flags']) or '-'}")
        if d["job"]:
            out += f" job={d['job']:#x}"
        if d["type"] == "ACK":
            out += f" state={d['state'] or '-'} rate={d['rate_kbps']}k"
    if d.get("verdict"):
        out += f" {d['verdict']}"
    if "bad" in d:
        out += f" BAD {d['bad']}"
    return out


# --------------------------------------------------------------------------- live (AF_PACKET)

def _udp_port_filter(port: int) -> bytes:
    """Classic BPF for `udp port PORT` on IPv4 (tcpdump -dd, first fragments only)."""
    ins = [
        (0x28, 0, 0, 12),          # ldh [12]            ethertype
        (0x15, 0, 10, 0x0800),     # jeq IPv4            else drop
        (0x30, 0, 0, 23),          # ldb [23]            protocol
        (0x15, 0, 8, 17),          # jeq UDP             else drop
        (0x28, 0, 0, 20),          # ldh [20]            flags + fragment offset
        (0x45, 6, 0, IP_FRAG_OFFSET),   # jset offset    -> drop
        (0xb1, 0, 0, 14),          # ldxb 4*([14]&0xf)   IP header length
        (0x48, 0, 0, 14),          # ldh [x+14]          source port
        (0x15, 2, 0, port),        # jeq port            -> accept
        (0x48, 0, 0, 16),          # ldh [x+16]          destination port
        (0x15, 0, 1, port),        # jeq port            -> accept, else drop
        (0x06, 0, 0, 0x40000),     # accept
        (0x06, 0, 0, 0),           # drop
    ]
    return b"".join(struct.pack("=HBBI", *i) for i in ins)


class LiveCapture:
    """AF_PACKET socket on `dev` inside `ns` that sees UDP to or from `port`.

    >>> with LiveCapture("ltp-w0", "ltp-x-w0") as cap:      # doctest: +SKIP
    ...     for ts_ns, frame, wire_len, direction in cap.frames(timeout=5): ...
    """

    def __init__(self, dev: str, ns: str | None, port: int = W.PORT):
        self.dev, self.ns, self.port = dev, ns, port
        self.dropped = 0
        if ns and not netns.exists(ns):
            raise CaptureError(f"no network namespace {ns!r} (`ip netns list` shows them)")
        with netns.inside(ns):
            try:
                socket.if_nametoindex(dev)
            except OSError:
                raise CaptureError(f"no device {dev!r} in "
                                   f"{'namespace ' + ns if ns else 'the host namespace'}") from None
            # protocol 0: receives nothing until bound, so the filter is on first
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        try:
            prog = _udp_port_filter(port)
            self._prog = ctypes.create_string_buffer(prog)
            fprog = struct.pack("HL", len(prog) // 8, ctypes.addressof(self._prog))
            self.sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
            self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 1 << 26)
            except OSError:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
            self.sock.bind((dev, ETH_P_ALL))
        except OSError as e:
            self.sock.close()
            raise CaptureError(f"capturing on {dev}: {e.strerror}") from None

    def frames(self, timeout: float | None = None) -> Iterator[tuple[int, bytes, int, str]]:
        """(kernel time in ns since the epoch, frame, wire length, "in" | "out")
        until `timeout` seconds pass (None: forever)."""
        end = None if timeout is None else time.monotonic() + timeout
        cmsg_len = socket.CMSG_SPACE(16)
        while True:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return
            self.sock.settimeout(0.2 if left is None else min(0.2, left))
            try:
                frame, anc, _, addr = self.sock.recvmsg(65535, cmsg_len)
            except TimeoutError:
                continue
            ts = time.time_ns()
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
                    sec, nsec = struct.unpack("=qq", data[:16])
                    ts = sec * 1_000_000_000 + nsec
            yield ts, frame, len(frame), "out" if addr[2] == PACKET_OUTGOING else "in"

    def drops(self) -> int:
        """Frames the kernel dropped for this socket so far (the kernel
        resets its count on each read; this adds them up)."""
        try:
            _, dropped = struct.unpack("II", self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
            self.dropped += dropped
        except OSError:
            pass
        return self.dropped

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> LiveCapture:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
