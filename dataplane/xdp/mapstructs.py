# SPDX-License-Identifier: Apache-2.0
"""The value structs of the LTP maps (bpf/ltp_maps.h) as ctypes and numpy
dtypes, the compiled-in geometry, and array maps by fd.

tests/test_wire.py checks every struct here against the ctypes types bcc
generates from the C; maps.py builds the typed views of one program's maps
from them (and re-exports them, where callers take them).
"""
from __future__ import annotations

import ctypes
import mmap
from dataclasses import asdict, dataclass

import numpy as np

from ... import BPF_DIR
from .. import clib
from . import headers
from .wire import CHUNK_BYTES, PORT

_D = headers.defines("ltp_maps.h")

BANK_FREE, BANK_OPEN, BANK_CLOSED = _D["LTP_BANK_FREE"], _D["LTP_BANK_OPEN"], _D["LTP_BANK_CLOSED"]
BANK_STATES = {BANK_FREE: "free", BANK_OPEN: "open", BANK_CLOSED: "closed"}
CFG_SELF = _D["LTP_CFG_SELF"]  # self_* set: group DATA accepted
CFG_CSUM = _D["LTP_CFG_CSUM"]  # DATA's UDP checksum verified


MAX_SHARDS = 8   # servers that may share one endpoint's rounds (banks 2 per server)


@dataclass(frozen=True)
class Geometry:
    """Size of the reassembly memory; compiled into the program.

    slots: peers this host receives from (workers on a PS, 1 on a worker).
    max_chunks: most chunks one round's buffer may have (rounded up to 64).
    chunk_bytes: payload bytes per chunk; 1424 fits a 1500-byte MTU and is a
    multiple of 8, so the mapped memory of one slot is one contiguous run of
    float32 elements.
    """

    slots: int = 16
    max_chunks: int = 256
    chunk_bytes: int = CHUNK_BYTES
    banks: int = 2
    port: int = PORT
    stride: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.slots <= 1024:
            raise ValueError(f"slots must be in 1..1024, got {self.slots}")
        if self.max_chunks < 1 or self.max_chunks > 1 << 20:
            raise ValueError(f"max_chunks must be in 1..{1 << 20}, got {self.max_chunks}")
        if self.chunk_bytes % 8 or not 8 <= self.chunk_bytes <= 8192:
            raise ValueError(f"chunk_bytes must be a multiple of 8 in 8..8192, got {self.chunk_bytes}")
        if self.banks % 2 or not 2 <= self.banks <= 2 * MAX_SHARDS:
            raise ValueError(f"banks must be even, 2..{2 * MAX_SHARDS}, got {self.banks}")
        if not 1 <= self.stride <= MAX_SHARDS:
            raise ValueError(f"stride must be in 1..{MAX_SHARDS}, got {self.stride}")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.max_chunks % 64:
            object.__setattr__(self, "max_chunks", (self.max_chunks + 63) // 64 * 64)

    @property
    def mem_bytes(self) -> int:
        return self.banks * self.slots * self.max_chunks * self.chunk_bytes

    def cflags(self) -> list[str]:
        return [f"-I{BPF_DIR}", f"-DLTP_SLOTS={self.slots}",
                f"-DLTP_MAX_CHUNKS={self.max_chunks}", f"-DLTP_CHUNK_BYTES={self.chunk_bytes}",
                f"-DLTP_BANKS={self.banks}", f"-DLTP_BANK_STRIDE={self.stride}",
                f"-DLTP_PORT={self.port}",
                "-Wno-ignored-attributes"]

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class Cfg(ctypes.Structure):
    _fields_ = [("job", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("self_ip", ctypes.c_uint8 * 4), ("self_worker", ctypes.c_uint16),
                ("self_mac", ctypes.c_uint8 * 6), ("pad", ctypes.c_uint32),
                ("beat_ns", ctypes.c_uint64), ("limit_ns", ctypes.c_uint64)]


class Bank(ctypes.Structure):
    _fields_ = [("round", ctypes.c_uint32), ("state", ctypes.c_uint32),
                ("nchunks", ctypes.c_uint32), ("last_len", ctypes.c_uint32),
                ("token", ctypes.c_uint64),  # wire.token_word of the round's token
                ("thresh", ctypes.c_uint32),  # chunks per slot that stamp thresh_ns (0: none)
                ("group", ctypes.c_uint32),   # 1: GROUP DATA taken with `token`
                ("prev_round", ctypes.c_uint32),  # the round the bank held before (if prev)
                ("prev", ctypes.c_uint32)]    # 1: it held one (SlotTok.prev_*: its tokens)


class SlotTok(ctypes.Structure):
    """struct ltp_slot_tok: one [bank][slot]'s tokens (wire.token_word each)."""
    _fields_ = [("data", ctypes.c_uint64), ("ack", ctypes.c_uint64),
                ("open", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("prev_data", ctypes.c_uint64), ("prev_ack", ctypes.c_uint64)]


class Progress(ctypes.Structure):
    _fields_ = [("chunks", ctypes.c_uint32), ("retx", ctypes.c_uint32),
                ("bytes", ctypes.c_uint64),
                # arrival times at the NIC, CLOCK_MONOTONIC ns (bpf/ltp_maps.h)
                ("first_ns", ctypes.c_uint64), ("last_ns", ctypes.c_uint64),
                ("thresh_ns", ctypes.c_uint64), ("flow", ctypes.c_uint64),
                ("stops", ctypes.c_uint64)]


SLOT_STATS = ["rx_packets", "rx_bytes", "delivered", "acks_tx", "dup", "late", "stale",
              "future", "out_of_range", "acks_rx", "acks_stale"]


class SlotStats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in SLOT_STATS]


#: the ACK clock's fields of struct ltp_tx, after the token (docs/transport.md)
TX_CLOCK_FIELDS = [("clock", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                   ("nchunks", ctypes.c_uint32), ("last_len", ctypes.c_uint32),
                   ("tail", ctypes.c_uint32), ("window", ctypes.c_uint32),
                   ("window_min", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                   ("next", ctypes.c_uint64), ("added", ctypes.c_uint64),
                   ("consumed", ctypes.c_uint64), ("stops", ctypes.c_uint64),
                   ("sent", ctypes.c_uint64),
                   # recovery in XDP (RACK over its send log)
                   ("xseq", ctypes.c_uint64), ("scan", ctypes.c_uint64),
                   ("newest", ctypes.c_uint64), ("rexmit", ctypes.c_uint64),
                   ("rack", ctypes.c_uint32), ("pad2", ctypes.c_uint32),
                   ("dtoken", ctypes.c_uint64)]  # wire.token_word of the flow's DATA token


class Tx(ctypes.Structure):
    _fields_ = [("round", ctypes.c_uint32), ("closed", ctypes.c_uint32),
                ("rate_kbps", ctypes.c_uint32), ("acked", ctypes.c_uint32),
                ("token", ctypes.c_uint64),  # wire.token_word of the flow's ACK token
                *TX_CLOCK_FIELDS]


#: Round outcomes, as Receiver.collect decides them; field names of RoundStats.
ROUND_REASONS = ("complete", "early", "deadline", "timeout")
ROUND_TIME_BUCKETS = _D["LTP_ROUND_TIME_BUCKETS"]
#: upper bounds (seconds) of RoundStats.time_hist's buckets but the last,
#: which takes every longer round
ROUND_TIME_BOUNDS_S = tuple((_D["LTP_ROUND_TIME_BASE_US"] << i) / 1e6
                            for i in range(ROUND_TIME_BUCKETS - 1))


LATE_BUCKETS = _D["LTP_LATE_BUCKETS"]
#: upper bounds (seconds) of RoundStats.late_hist's buckets but the last
LATE_BOUNDS_S = tuple((_D["LTP_LATE_BASE_US"] << i) / 1e6 for i in range(LATE_BUCKETS - 1))


class RoundStats(ctypes.Structure):
    """struct ltp_round_stats: one slot's round outcomes (written by user space)."""

    _fields_ = [*((n, ctypes.c_uint64) for n in ROUND_REASONS),
                ("delivered", ctypes.c_uint64), ("filled", ctypes.c_uint64),
                ("last_round", ctypes.c_uint32), ("last_delivered", ctypes.c_uint32),
                ("last_filled", ctypes.c_uint32), ("last_budget_ppm", ctypes.c_uint32),
                ("time_us", ctypes.c_uint64), ("time_hist", ctypes.c_uint64 * ROUND_TIME_BUCKETS),
                ("straggler", ctypes.c_uint64), ("late_hist", ctypes.c_uint64 * LATE_BUCKETS)]


class Share(ctypes.Structure):
    _fields_ = [("active", ctypes.c_uint32), ("share_kbps", ctypes.c_uint32),
                ("window", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


class SendSlot(ctypes.Structure):
    """struct ltp_sendslot: the chunk at one send position, and its payload's sum."""

    _fields_ = [("chunk", ctypes.c_uint32), ("csum", ctypes.c_uint32)]


SO_CHUNK, SO_CRITICAL = _D["LTP_SO_CHUNK"], _D["LTP_SO_CRITICAL"]


# numpy views of the mmapable maps use the same layouts
SHARE_DTYPE = np.dtype(Share)
TX_DTYPE = np.dtype(Tx)
#: struct ltp_tx's 32-bit fields as word indices into a row viewed as uint32
#: (push.py reads closed and rate_kbps so in its loop)
TX_WORD = {name: getattr(Tx, name).offset // 4 for name, ctype in Tx._fields_
           if ctype is ctypes.c_uint32}
TX_CLOSED, TX_RATE = TX_WORD["closed"], TX_WORD["rate_kbps"]
SLOTTOK_DTYPE = np.dtype(SlotTok)
SENDSLOT_DTYPE = np.dtype(SendSlot)
PROGRESS_DTYPE = np.dtype(Progress)


class FdMap:
    """An array map by fd: lookup/update of ctypes values, per-CPU aware."""

    def __init__(self, fd: int, value_type, percpu: bool = False):
        self.fd, self.value_type, self.percpu = fd, value_type, percpu
        self.ncpu = clib.num_possible_cpus() if percpu else 1
        self.stride = (ctypes.sizeof(value_type) + 7) // 8 * 8

    def get(self, index: int):
        buf = ctypes.create_string_buffer(self.stride * self.ncpu)
        clib.map_lookup(self.fd, index, buf)
        vals = [self.value_type.from_buffer_copy(buf.raw[i * self.stride:
                                                         i * self.stride + ctypes.sizeof(self.value_type)])
                for i in range(self.ncpu)]
        return vals if self.percpu else vals[0]

    def set(self, index: int, value) -> None:
        if self.percpu:
            raise TypeError("per-CPU maps are written by the kernel only here")
        clib.map_update(self.fd, index, value)


def read_counters(counter_map: FdMap, names: list[str]) -> dict[str, int]:
    """Each drop or event class of an `ltp_counters` map, summed over CPUs,
    in the program's order. A program built from an older bpf/ (pinned
    before an upgrade, or `ltp bench xdp --against`) has fewer classes: those
    past its last are absent from the result, not an error."""
    out = {}
    for i, name in enumerate(names):
        try:
            out[name] = int(sum(v.value for v in counter_map.get(i)))
        except FileNotFoundError:      # past the older program's last class
            break
    return out


def mmap_rw(fd: int, nbytes: int) -> mmap.mmap:
    page = mmap.PAGESIZE
    return mmap.mmap(fd, (nbytes + page - 1) // page * page, mmap.MAP_SHARED,
                     mmap.PROT_READ | mmap.PROT_WRITE)
