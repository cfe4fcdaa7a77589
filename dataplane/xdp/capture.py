"""Decode LTP packets with the scapy layer (wire.LTP): live on a device inside
a network namespace, or from a pcap file.

Live capture is an AF_PACKET socket made inside the namespace (socket
creation fixes its namespace) with a classic BPF filter for UDP to or from
the LTP port, so Python sees only LTP. What it can see: an XDP program runs
before the kernel's packet taps, so on a host whose ltp_xdp consumes DATA
(native or skb mode) the DATA never reaches AF_PACKET, nor do the ACKs it
sends with XDP_TX. Capture on the sending side (a worker's device shows its
DATA going out and, when the worker runs no ltp_xdp, the ACKs coming in), or
on the switch port in between.
"""
from __future__ import annotations

import ctypes
import datetime
import socket
import struct
import time
from typing import Any, Iterator

from .. import netns
from ...errors import DataplaneError
from . import wire as W

ETH_P_ALL = 0x0003
SO_ATTACH_FILTER = 26
SOL_PACKET = 263
PACKET_STATISTICS = 6
PACKET_OUTGOING = 4


class CaptureError(DataplaneError):
    """A capture could not start or read its input; the message names the fix.
    An LtpError, so `ltp capture` reports it as one line with no wrapping."""


# --------------------------------------------------------------------------- decoding

def _type_name(t: int) -> str:
    if t in W.TYPE_NAMES:
        return W.TYPE_NAMES[t]
    return f"CTRL{t}" if W.T_CTRL_MIN <= t <= 15 else f"TYPE{t}"


def decode(pkt, port: int = W.PORT, direction: str | None = None) -> dict[str, Any] | None:
    """One scapy packet -> a dict of its LTP header, or None if it is not
    UDP to or from `port`."""
    from scapy.layers.inet import IP, UDP
    ip, udp = pkt.getlayer(IP), pkt.getlayer(UDP)
    if ip is None or udp is None or port not in (udp.sport, udp.dport):
        return None
    raw = bytes(udp.payload)
    d: dict[str, Any] = {"time": float(pkt.time), "dir": direction, "src": ip.src,
                         "sport": int(udp.sport), "dst": ip.dst, "dport": int(udp.dport),
                         "wire_len": len(pkt)}
    if len(raw) < W.HDR_LEN:
        d.update(type="?", bad=f"short: {len(raw)} of {W.HDR_LEN} header bytes")
        return d
    ltp = pkt.getlayer(W.LTP) if port == W.PORT else None
    if ltp is None:
        ltp = W.LTP(raw)
    flags = int(ltp.flags)
    d.update({"type": _type_name(int(ltp.type)), "worker": int(ltp.worker), "job": int(ltp.job),
              "round": int(ltp.round), "chunk": int(ltp.chunk), "nchunks": int(ltp.nchunks),
              "flags": [n for bit, n in sorted(W.FLAG_NAMES.items()) if flags & bit],
              "len": int(ltp.len), "payload_bytes": len(raw) - W.HDR_LEN,
              "state": {W.RS_OPEN: "open", W.RS_CLOSED: "closed"}.get(int(ltp.state)),
              "rate_kbps": int(ltp.rate)})
    if ltp.magic != W.MAGIC:
        d["bad"] = f"magic {int(ltp.magic):#06x}"
    elif ltp.version != W.VERSION:
        d["bad"] = f"version {int(ltp.version)}"
    return d


def line(d: dict[str, Any]) -> str:
    """One text line per packet: time, direction, addresses, type, worker,
    round, chunk/nchunks, length, flags (and state and rate of an ACK)."""
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
    if "bad" in d:
        out += f" BAD {d['bad']}"
    return out


# --------------------------------------------------------------------------- pcap

def read_pcap(path: str) -> Iterator[Any]:
    """scapy packets of a pcap or pcapng file."""
    from scapy.error import Scapy_Exception
    from scapy.utils import PcapReader
    try:
        reader = PcapReader(path)
    except FileNotFoundError:
        raise CaptureError(f"{path}: no such file") from None
    except (Scapy_Exception, OSError) as e:
        raise CaptureError(f"{path}: not a pcap file ({e})") from None
    with reader:
        yield from reader


def pcap_writer(path: str):
    from scapy.utils import PcapWriter
    try:
        return PcapWriter(path, linktype=1, sync=True)
    except OSError as e:
        raise CaptureError(f"cannot write {path}: {e.strerror}") from None


# --------------------------------------------------------------------------- live

def _udp_port_filter(port: int) -> bytes:
    """Classic BPF for `udp port PORT` on IPv4 (tcpdump -dd, first fragments only)."""
    ins = [
        (0x28, 0, 0, 12),          # ldh [12]            ethertype
        (0x15, 0, 10, 0x0800),     # jeq IPv4            else drop
        (0x30, 0, 0, 23),          # ldb [23]            protocol
        (0x15, 0, 8, 17),          # jeq UDP             else drop
        (0x28, 0, 0, 20),          # ldh [20]            flags + fragment offset
        (0x45, 6, 0, 0x1fff),      # jset offset         -> drop
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
    ...     for ts, frame, direction in cap.frames(timeout=5): ...
    """

    def __init__(self, dev: str, ns: str | None, port: int = W.PORT):
        self.dev, self.ns, self.port = dev, ns, port
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
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
            self.sock.bind((dev, ETH_P_ALL))
        except OSError as e:
            self.sock.close()
            raise CaptureError(f"capturing on {dev}: {e.strerror}") from None

    def frames(self, timeout: float | None = None) -> Iterator[tuple[float, bytes, str]]:
        """(time, frame, "in" | "out") until `timeout` seconds pass (None: forever)."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return
            self.sock.settimeout(0.2 if left is None else min(0.2, left))
            try:
                frame, addr = self.sock.recvfrom(65535)
            except socket.timeout:
                continue
            yield time.time(), frame, "out" if addr[2] == PACKET_OUTGOING else "in"

    def drops(self) -> int:
        """Frames the kernel dropped for this socket since the last call."""
        try:
            _, dropped = struct.unpack("II", self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
            return dropped
        except OSError:
            return 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "LiveCapture":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def frame_packet(frame: bytes, ts: float):
    """scapy Ether of a captured frame, stamped with its capture time."""
    from scapy.layers.l2 import Ether
    pkt = Ether(frame)
    pkt.time = ts
    return pkt

