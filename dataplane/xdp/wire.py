# SPDX-License-Identifier: Apache-2.0
"""Python mirror of bpf/ltp_wire.h: the LTP header as ctypes and as a scapy layer.

This file must agree with bpf/ltp_wire.h; tests/test_wire.py compares the
ctypes struct here with the one bcc generates from the C definition (sizes and
offsets) and checks that the scapy layer builds the same bytes.
All header fields are big-endian on the wire.
"""
from __future__ import annotations

import ctypes
import sys

import numpy as np
from scapy.fields import (ByteEnumField, ByteField, FlagsField, IntField, LongField, ShortField,
                          XLongField, XShortField)
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_layers

from . import headers

_C = headers.defines("ltp_wire.h")

MAGIC = _C["LTP_MAGIC"]
VERSION = _C["LTP_VERSION"]
PORT = _C["LTP_PORT"]
HDR_LEN = _C["LTP_HDR_LEN"]

T_DATA = _C["LTP_T_DATA"]
T_ACK = _C["LTP_T_ACK"]
T_CTRL_MIN = _C["LTP_T_CTRL_MIN"]

F_CRITICAL = _C["LTP_F_CRITICAL"]
F_LAST = _C["LTP_F_LAST"]
F_RELIABLE = _C["LTP_F_RELIABLE"]
F_RETX = _C["LTP_F_RETX"]
F_GROUP = _C["LTP_F_GROUP"]
F_DUP = _C["LTP_F_DUP"]
F_CLOCK = _C["LTP_F_CLOCK"]  # DATA of the ACK clock; its ACK carries the credit
F_STOP = _C["LTP_F_STOP"]    # ACK: the credit says consume this packet
F_SACK = _C["LTP_F_SACK"]    # ACK: SACK_LEN bytes of its block's delivered bits follow
SACK_LEN = _C["LTP_SACK_LEN"]

RS_OPEN = _C["LTP_RS_OPEN"]
RS_CLOSED = _C["LTP_RS_CLOSED"]

# IPv4 + UDP + LTP header bytes per datagram
IP_UDP_LTP = 20 + 8 + HDR_LEN


def chunk_bytes_for(mtu: int) -> int:
    """The largest LTP chunk one frame of `mtu` carries, in whole float64 pairs
    (control/bench/cluster.py sizes its chunks alike, so a rig round looks the same)."""
    return (mtu - IP_UDP_LTP) // 8 * 8


# every default chunk size but the training path's (an endpoint's, a map's
# geometry, the benches'): 1424 bytes, 1492 IP bytes a frame. It dates from a
# shorter header and stays 8 bytes under what a 1500-byte frame carries
# (chunk_bytes_for(1500), 1432, which the training path uses) so that the
# benchmarks' figures compare across runs
CHUNK_BYTES = 1424

TYPE_NAMES = {T_DATA: "DATA", T_ACK: "ACK"}
FLAG_NAMES = {F_CRITICAL: "critical", F_LAST: "last", F_RELIABLE: "reliable", F_RETX: "retx",
              F_GROUP: "group", F_DUP: "dup", F_CLOCK: "clock", F_STOP: "stop",
              F_SACK: "sack"}


class LtpHdr(ctypes.BigEndianStructure):
    """struct ltp_hdr (bpf/ltp_wire.h), big-endian, packed."""

    _pack_ = 1
    _fields_ = [
        ("magic", ctypes.c_uint16),
        ("version", ctypes.c_uint8),
        ("type", ctypes.c_uint8),
        ("flags", ctypes.c_uint16),
        ("worker", ctypes.c_uint16),
        ("job", ctypes.c_uint32),
        ("round", ctypes.c_uint32),
        ("chunk", ctypes.c_uint32),
        ("nchunks", ctypes.c_uint32),
        ("len", ctypes.c_uint16),
        ("state", ctypes.c_uint8),
        ("pad", ctypes.c_uint8),
        ("rate", ctypes.c_uint32),
        ("token", ctypes.c_uint64),
    ]


assert ctypes.sizeof(LtpHdr) == HDR_LEN

#: the header as a numpy record (big-endian fields), for building many at once
HDR_DTYPE = np.dtype(LtpHdr)
#: byte offset of each header field, e.g. OFF["flags"]
OFF = {name: getattr(LtpHdr, name).offset for name, _ in LtpHdr._fields_}


def pack_header(*, type: int = T_DATA, flags: int = 0, worker: int = 0, job: int = 0,
                round: int = 0, chunk: int = 0, nchunks: int = 1, length: int = 0,
                state: int = 0, rate: int = 0, token: int = 0, magic: int = MAGIC,
                version: int = VERSION) -> bytes:
    """The HDR_LEN header bytes of one packet (no scapy)."""
    h = LtpHdr(magic=magic, version=version, type=type, flags=flags, worker=worker, job=job,
               round=round, chunk=chunk, nchunks=nchunks, len=length, state=state, pad=0,
               rate=rate, token=token)
    return bytes(h)


def clock_stamp(inflight: int, stops: int) -> int:
    """What clocked DATA carries in `rate` (LTP_CLOCK_STAMP in bpf/ltp_wire.h):
    its flow's packets in flight and the STOPs its sender had received."""
    return (max(0, min(int(inflight), 0xffff)) << 16) | (int(stops) & 0xffff)


def token_word(token: int) -> int:
    """The u64 a map holds for `token` (struct ltp_bank/ltp_tx .token): its
    bytes in network order, as the header carries them, so the XDP program
    compares the two as they are."""
    if not 0 <= token < 2**64:
        raise ValueError(f"a token must fit 64 bits, got {token}")
    return int.from_bytes(token.to_bytes(8, "big"), sys.byteorder)


def unpack_header(data: bytes | memoryview) -> LtpHdr:
    if len(data) < HDR_LEN:
        raise ValueError(f"LTP header needs {HDR_LEN} bytes, got {len(data)}")
    return LtpHdr.from_buffer_copy(bytes(data[:HDR_LEN]))


# the scapy field of each LtpHdr field, by size; some get a richer kind
_SCAPY_BY_SIZE = {1: ByteField, 2: ShortField, 4: IntField, 8: LongField}
_SCAPY_SPECIAL = {
    "magic": lambda n: XShortField(n, MAGIC),
    "version": lambda n: ByteField(n, VERSION),
    "type": lambda n: ByteEnumField(n, T_DATA, TYPE_NAMES),
    "flags": lambda n: FlagsField(n, 0, 16, [FLAG_NAMES.get(1 << b, f"b{b}") for b in range(11)]),
    "nchunks": lambda n: IntField(n, 1),
    "len": lambda n: ShortField(n, None),
    "token": lambda n: XLongField(n, 0),
    "state": lambda n: ByteEnumField(n, 0, {0: "-", RS_OPEN: "open", RS_CLOSED: "closed"}),
}


def _scapy_fields() -> list:
    return [_SCAPY_SPECIAL[n](n) if n in _SCAPY_SPECIAL else _SCAPY_BY_SIZE[ctypes.sizeof(ct)](n, 0)
            for n, ct in LtpHdr._fields_]


class LTP(Packet):
    """scapy layer for the LTP header (its fields follow LtpHdr); the payload
    (chunk bytes) follows as Raw."""

    name = "LTP"
    fields_desc = _scapy_fields()

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.len is None:
            at = OFF["len"]
            pkt = pkt[:at] + len(pay).to_bytes(2, "big") + pkt[at + 2:]
        return pkt + pay

    def mysummary(self) -> str:
        return self.sprintf("LTP %type% w=%worker% r=%round% c=%chunk%/%nchunks% "
                            "len=%len% flags=%flags%")


bind_layers(UDP, LTP, dport=PORT)
bind_layers(UDP, LTP, sport=PORT)
