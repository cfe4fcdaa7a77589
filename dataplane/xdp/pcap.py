# SPDX-License-Identifier: Apache-2.0
"""pcap and pcapng files, read and written with struct (no per-packet dissection).

Reading yields `Frame`s (kernel time in ns, captured bytes, length on the
wire, link type, and what a pcapng comment or flag says: direction, XDP
verdict). Both byte orders and both pcap time resolutions are read; pcapng's
section, interface (with if_tsresol), enhanced and simple packet blocks are
read and other blocks skipped. Writing makes a nanosecond pcap, or a pcapng
whose packets carry their direction (epb_flags) and, for frames ltp_xdp
recorded, its verdict as the packet comment.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import BinaryIO
from collections.abc import Iterator

from ...errors import DataplaneError
from .. import files

LINKTYPE_ETHERNET = 1
PCAP_MAGIC_US, PCAP_MAGIC_NS = 0xA1B2C3D4, 0xA1B23C4D
PCAPNG_SHB, PCAPNG_IDB, PCAPNG_SPB, PCAPNG_EPB = 0x0A0D0D0A, 1, 3, 6
BYTE_ORDER_MAGIC = 0x1A2B3C4D
OPT_END, OPT_COMMENT, IDB_NAME, IDB_TSRESOL, EPB_FLAGS = 0, 1, 2, 9, 2
EPB_IN, EPB_OUT = 1, 2                      # epb_flags bits 0-1: inbound / outbound
MAX_SNAPLEN = 262144
_PAD = [b"\0" * n for n in range(4)]


class PcapError(DataplaneError):
    """A capture file could not be read or written; the message names it."""


@dataclass(slots=True)
class Frame:
    ts_ns: int                  # capture time, ns since the epoch
    data: bytes                 # captured bytes
    wire_len: int               # length on the wire
    linktype: int = LINKTYPE_ETHERNET
    direction: str | None = None    # "in" | "out" when known
    comment: str | None = None      # pcapng packet comment


# --------------------------------------------------------------------------- reading

def read(path: str, notes: list[str] | None = None) -> Iterator[Frame]:
    """The frames of a pcap or pcapng file, in file order. A file that ends
    inside a record or block (cut short while being written) stops at the
    last whole one, with a line in `notes` saying where; a record or block
    that cannot be what it says is a PcapError naming the file and offset."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise PcapError(f"{path}: no such file") from None
    except OSError as e:
        raise PcapError(f"{path}: {e.strerror}") from None
    cut = _CutShort(path, notes)
    with f:
        head = f.read(4)
        if len(head) < 4:
            raise PcapError(f"{path}: not a pcap file (too short)")
        magic_le, magic_be = struct.unpack("<I", head)[0], struct.unpack(">I", head)[0]
        if magic_le == PCAPNG_SHB:
            yield from _read_pcapng(f, path, cut)
        elif PCAP_MAGIC_US in (magic_le, magic_be) or PCAP_MAGIC_NS in (magic_le, magic_be):
            yield from _read_pcap(f, path, "<" if magic_le in (PCAP_MAGIC_US, PCAP_MAGIC_NS)
                                  else ">", PCAP_MAGIC_NS in (magic_le, magic_be), cut)
        else:
            raise PcapError(f"{path}: not a pcap file (magic {head.hex()})")


class _CutShort:
    """Says where a file ends inside a record or block (into `notes`)."""

    def __init__(self, path: str, notes: list[str] | None):
        self.path, self.notes = path, notes

    def __call__(self, at: int, what: str, need: int, got: int) -> None:
        if self.notes is not None:
            self.notes.append(f"{self.path}: cut short at offset {at} ({what}: {need} "
                              f"bytes, {got} there): read up to the last whole one")


def _read_pcap(f: BinaryIO, path: str, bo: str, ns: bool, cut: _CutShort) -> Iterator[Frame]:
    hdr = f.read(20)
    if len(hdr) < 20:
        raise PcapError(f"{path}: not a pcap file (short header)")
    linktype = struct.unpack(bo + "HHiIII", hdr)[5] & 0xFFFF
    rec = struct.Struct(bo + "IIII")
    scale = 1 if ns else 1000
    while True:
        at = f.tell()
        h = f.read(16)
        if len(h) < 16:
            if h:
                cut(at, "record header", 16, len(h))
            return
        sec, frac, incl, orig = rec.unpack(h)
        if incl > MAX_SNAPLEN:
            raise PcapError(f"{path}: corrupt record at offset {at} ({incl} bytes)")
        data = f.read(incl)
        if len(data) < incl:
            cut(at, "record", 16 + incl, 16 + len(data))
            return
        yield Frame(sec * 1_000_000_000 + frac * scale, data, orig, linktype)


# the least length of each block type read (header, fields, trailing length)
_LEAST = {PCAPNG_SHB: 28, PCAPNG_IDB: 20, PCAPNG_EPB: 32, PCAPNG_SPB: 16}
_NAMES = {PCAPNG_SHB: "section header", PCAPNG_IDB: "interface description",
          PCAPNG_EPB: "enhanced packet", PCAPNG_SPB: "simple packet"}


def _block_at(f: BinaryIO, path: str, bo: str, cut: _CutShort) -> tuple[int, str, bytes] | None:
    """(type, byte order, body less the trailing length) of the block at f's
    position; None at the end of the file or where it is cut short."""
    at = f.tell()
    h = f.read(12)
    if len(h) < 12:
        if h:
            cut(at, "block header", 12, len(h))
        return None
    if struct.unpack("<I", h[:4])[0] == PCAPNG_SHB:     # a section sets the byte order
        bo = "<" if struct.unpack("<I", h[8:])[0] == BYTE_ORDER_MAGIC else ">"
    btype, blen = struct.unpack(bo + "II", h[:8])
    least = _LEAST.get(btype, 12)
    if blen < least or blen % 4:
        what = _NAMES.get(btype, f"type {btype:#x}")
        raise PcapError(f"{path}: corrupt pcapng block at offset {at} ({what} block of "
                        f"length {blen}; at least {least}, a multiple of 4)")
    rest = f.read(blen - 12)
    if len(rest) < blen - 12:
        cut(at, f"{_NAMES.get(btype, 'pcapng')} block", blen, 12 + len(rest))
        return None
    return btype, bo, (h[8:] + rest)[:-4]


def _read_pcapng(f: BinaryIO, path: str, cut: _CutShort) -> Iterator[Frame]:
    f.seek(0)
    bo = "<"
    ifaces: list[tuple[int, int]] = []      # (linktype, ns per tick) per interface
    while True:
        at = f.tell()
        block = _block_at(f, path, bo, cut)
        if block is None:
            return
        btype, bo, body = block
        if btype == PCAPNG_SHB:
            ifaces = []
        elif btype == PCAPNG_IDB:
            linktype = struct.unpack_from(bo + "H", body)[0]
            ifaces.append((linktype, _tsresol(_options(body[8:], bo).get(IDB_TSRESOL))))
        elif btype == PCAPNG_EPB:
            iface, hi, lo, incl, orig = struct.unpack_from(bo + "IIIII", body)
            if 20 + incl > len(body):
                raise PcapError(f"{path}: corrupt pcapng block at offset {at} (a packet of "
                                f"{incl} bytes in a block of {len(body) + 12})")
            linktype, tick = ifaces[iface] if iface < len(ifaces) else (LINKTYPE_ETHERNET, 1000)
            data = body[20:20 + incl]
            opts = _options(body[20 + (incl + 3) // 4 * 4:], bo)
            yield Frame(((hi << 32) | lo) * tick, data, orig, linktype,
                        _direction(opts.get(EPB_FLAGS), bo), _text(opts.get(OPT_COMMENT)))
        elif btype == PCAPNG_SPB:
            orig = struct.unpack_from(bo + "I", body)[0]
            linktype = ifaces[0][0] if ifaces else LINKTYPE_ETHERNET
            yield Frame(0, body[4:4 + orig], orig, linktype)


def _options(raw: bytes, bo: str) -> dict[int, bytes]:
    out, at = {}, 0
    while at + 4 <= len(raw):
        code, n = struct.unpack_from(bo + "HH", raw, at)
        if code == OPT_END:
            break
        out.setdefault(code, raw[at + 4:at + 4 + n])
        at += 4 + (n + 3) // 4 * 4
    return out


def _tsresol(raw: bytes | None) -> int:
    """ns per timestamp tick from if_tsresol (default: microseconds)."""
    if not raw:
        return 1000
    v = raw[0]
    if v & 0x80:
        return max(1, round(1e9 / (2 ** (v & 0x7F))))
    return max(1, 10 ** (9 - v)) if v <= 9 else 1


def _direction(raw: bytes | None, bo: str) -> str | None:
    if not raw or len(raw) < 4:
        return None
    return {EPB_IN: "in", EPB_OUT: "out"}.get(struct.unpack(bo + "I", raw[:4])[0] & 3)


def _text(raw: bytes | None) -> str | None:
    return raw.decode("utf-8", "replace") if raw else None


# --------------------------------------------------------------------------- writing

class Writer:
    """A capture file: nanosecond pcap, or pcapng when the name ends .pcapng.
    Buffered; `flush` after a batch, `close` at the end."""

    def __init__(self, path: str, snaplen: int = MAX_SNAPLEN,
                 linktype: int = LINKTYPE_ETHERNET, ifname: str | None = None):
        self.path, self.pcapng = path, str(path).endswith(".pcapng")
        self._opts: dict = {}
        try:
            # frames hold tokens: 0600 when new, never through a symlink
            self.f = files.create(path, replace=True, buffering=1 << 20)
        except OSError as e:
            raise PcapError(f"cannot write {path}: {e.strerror}") from None
        if self.pcapng:
            self.f.write(_block(PCAPNG_SHB, struct.pack("<IHHq", BYTE_ORDER_MAGIC, 1, 0, -1)))
            opts = _opt(IDB_TSRESOL, b"\x09") + (_opt(IDB_NAME, ifname.encode()) if ifname
                                                 else b"")
            self.f.write(_block(PCAPNG_IDB, struct.pack("<HHI", linktype, 0, snaplen)
                                + opts + _opt(OPT_END, b"")))
        else:
            self.f.write(struct.pack("<IHHiIII", PCAP_MAGIC_NS, 2, 4, 0, 0, snaplen, linktype))

    def write(self, ts_ns: int, data: bytes, wire_len: int | None = None,
              direction: str | None = None, comment: str | None = None) -> None:
        self.write_many([(ts_ns, data, len(data) if wire_len is None else wire_len, direction,
                          comment)])

    def write_many(self, rows) -> None:
        """(ts_ns, data, wire_len, direction, comment) per frame."""
        w, pack = self.f.write, struct.pack
        if not self.pcapng:
            for ts_ns, data, wire, _, _ in rows:
                sec, nsec = divmod(ts_ns, 1_000_000_000)
                w(pack("<IIII", sec, nsec, len(data), wire))
                w(data)
            return
        opts = self._opts
        for ts_ns, data, wire, direction, comment in rows:
            tail = opts.get((direction, comment))
            if tail is None:
                tail = opts[(direction, comment)] = _epb_options(direction, comment)
            pad = -len(data) % 4
            n = 32 + len(data) + pad + len(tail)
            w(pack("<IIIIIII", PCAPNG_EPB, n, 0, ts_ns >> 32, ts_ns & 0xFFFFFFFF, len(data),
                   wire))
            w(data)
            w(_PAD[pad] + tail + pack("<I", n))

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def _epb_options(direction: str | None, comment: str | None) -> bytes:
    """An enhanced packet block's options: direction (epb_flags) and comment."""
    opts = b""
    if direction in ("in", "out"):
        opts += _opt(EPB_FLAGS, struct.pack("<I", EPB_IN if direction == "in" else EPB_OUT))
    if comment:
        opts += _opt(OPT_COMMENT, comment.encode())
    return opts + _opt(OPT_END, b"") if opts else b""


def _opt(code: int, value: bytes) -> bytes:
    return struct.pack("<HH", code, len(value)) + value + b"\0" * (-len(value) % 4)


def _block(btype: int, body: bytes) -> bytes:
    n = 12 + len(body)
    return struct.pack("<II", btype, n) + body + struct.pack("<I", n)
