# SPDX-License-Identifier: Apache-2.0
"""Capture at the NIC: switch ltp_xdp's capture on and off, and drain its ring.

While ltp_capcfg holds a lease in the future, bpf/ltp_xdp.c copies each LTP
frame (as it arrived, at most snaplen bytes) with its kernel timestamp and
verdict into the ring buffer ltp_capring, and counts what the ring had no
room for in ltp_capstat. This module finds those maps through the program a
device carries (kernel ids: the same for a program `ltp load` left and for a
running endpoint's), holds the lease (renewed while draining, so a capture
killed without clean-up switches itself off), and reads the ring through two
mmaps as libbpf's ring_buffer__consume does: one producer position read and
one consumer position store per batch, no system call per frame.
"""
from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import select
import struct
import time
from dataclasses import dataclass
from collections.abc import Callable, Iterator

import numpy as np

from .. import clib
from ...errors import DataplaneError
from . import headers
from .maps import COUNTERS, FdMap, read_counters

_D = headers.defines("ltp_maps.h")
CAP_F_JOB, CAP_F_WORKER = _D["LTP_CAP_F_JOB"], _D["LTP_CAP_F_WORKER"]
CAP_F_ROUND, CAP_F_TX = _D["LTP_CAP_F_ROUND"], _D["LTP_CAP_F_TX"]
CAP_HDR_LEN = _D["LTP_CAP_HDR_LEN"]
DIRS = {_D["LTP_CAP_RX"]: "in", _D["LTP_CAP_TX"]: "out"}
#: the maps a capture uses; a program without them predates capture
CAP_MAPS = ("ltp_capcfg", "ltp_capbuf", "ltp_capstat", "ltp_capring", "ltp_counters")
#: counter classes that are not an LTP frame coming in (ACKs the program sent)
NOT_INGRESS = ("pass", "ack_tx", "ack_fail")
DRAIN_POLL_S = 0.001    # how often a stopping capture drains the ring until all it counted is out

LEASE_NS = 5_000_000_000      # the program stops capturing this long after the last renewal
RENEW_NS = 500_000_000
#: a record is released once the kernel clock is this far past its timestamp:
#: frames from other CPUs stamped earlier have been committed by then
REORDER_NS = 5_000_000
XDP_VERDICTS = {0: "XDP_ABORTED", 1: "XDP_DROP", 2: "XDP_PASS", 3: "XDP_TX", 4: "XDP_REDIRECT"}


class CapCfg(ctypes.Structure):
    """struct ltp_capcfg (bpf/ltp_maps.h)."""

    _fields_ = [("until_ns", ctypes.c_uint64), ("owner", ctypes.c_uint32),
                ("snaplen", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("job", ctypes.c_uint32), ("round", ctypes.c_uint32),
                ("worker", ctypes.c_uint16), ("pad", ctypes.c_uint16)]


class CapStats(ctypes.Structure):
    """struct ltp_cap_stats."""

    _fields_ = [("captured", ctypes.c_uint64), ("lost", ctypes.c_uint64)]


#: struct ltp_cap_rec up to data[]: ts_ns, wire_len, cap_len, verdict, dir, ifindex, cpu
REC = struct.Struct("=QIHBBII")
assert REC.size == CAP_HDR_LEN
RINGBUF_BUSY, RINGBUF_DISCARD, RINGBUF_HDR = 1 << 31, 1 << 30, 8
#: the ring's own record header (length with busy/discard bits, page offset), then REC
_RING_REC = struct.Struct("=II" + REC.format[1:])


class CaptureError(DataplaneError):
    """A capture could not start or read its input; the message names the fix."""


@dataclass(slots=True)
class Record:
    ts_ns: int            # bpf_ktime_get_ns: CLOCK_MONOTONIC
    frame: bytes
    wire_len: int
    verdict: int
    direction: str        # "in": as it arrived; "out": what XDP_TX sent
    cpu: int

    @property
    def verdict_name(self) -> str:
        return XDP_VERDICTS.get(self.verdict, str(self.verdict))


def _map_info(fd: int) -> tuple[int, int, str]:
    """(value_size, max_entries, name) of the map `fd`."""
    raw = clib.obj_info(fd)
    _, _, _, value_size, max_entries, _, name = struct.unpack_from("<6I16s", raw)
    return value_size, max_entries, name.split(b"\0", 1)[0].decode(errors="replace")


class CaptureMaps:
    """The capture maps of one ltp_xdp program, by fd."""

    def __init__(self, fds: dict[str, int], owns_fds: bool = False):
        self.fds, self._owns = fds, owns_fds
        self.cfg = FdMap(fds["ltp_capcfg"], CapCfg)
        self.stats = FdMap(fds["ltp_capstat"], CapStats, percpu=True)
        self.counter_map = FdMap(fds["ltp_counters"], ctypes.c_uint64, percpu=True)
        self.frame_max = _map_info(fds["ltp_capbuf"])[0] - CAP_HDR_LEN
        self.ring_bytes = _map_info(fds["ltp_capring"])[1]

    @classmethod
    def from_dataplane(cls, dp) -> CaptureMaps:
        """The maps of a Dataplane this process compiled (tests, benchmarks)."""
        return cls({n: dp.table(n).get_fd() for n in CAP_MAPS})

    @classmethod
    def of_program(cls, prog_id: int) -> CaptureMaps | None:
        """The capture maps of the loaded program `prog_id`, found by its map
        ids and checked by name; None if it has none (not ltp_xdp, or built
        before capture existed)."""
        try:
            pfd = clib.prog_fd_by_id(prog_id)
        except OSError as e:
            raise CaptureError(f"XDP program id {prog_id}: {e.strerror}") from None
        fds: dict[str, int] = {}
        try:
            for mid in clib.prog_map_ids(pfd):
                try:
                    fd = clib.map_fd_by_id(mid)
                except OSError:
                    continue
                name = _map_info(fd)[2]
                if name in CAP_MAPS and name not in fds:
                    fds[name] = fd
                else:
                    os.close(fd)
        except OSError as e:
            raise CaptureError(f"XDP program id {prog_id}: {e.strerror}") from None
        finally:
            os.close(pfd)
        if set(fds) != set(CAP_MAPS):
            for fd in fds.values():
                os.close(fd)
            return None
        return cls(fds, owns_fds=True)

    def stat_totals(self) -> tuple[int, int]:
        """(records output, records lost) over all CPUs since the program loaded."""
        per_cpu = self.stats.get(0)
        return sum(v.captured for v in per_cpu), sum(v.lost for v in per_cpu)

    def ingress_frames(self) -> int:
        """LTP frames the program counted coming in (every class but those in NOT_INGRESS;
        a program built from an older bpf/, `ltp bench xdp --against`, may have fewer)."""
        counts = read_counters(self.counter_map, COUNTERS)
        return sum(v for name, v in counts.items() if name not in NOT_INGRESS)

    def close(self) -> None:
        if self._owns:
            for fd in self.fds.values():
                os.close(fd)
            self._owns = False


class Ring:
    """Consumer side of a BPF ring buffer map, through mmap (x86 memory order:
    a load is never reordered with an earlier load, so reading a record after
    seeing its busy bit clear needs no fence)."""

    def __init__(self, fd: int, size: int):
        page = mmap.PAGESIZE
        self.mask = size - 1
        # MAP_POPULATE: the pages are mapped now, not by a fault on each first read
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        self._cons_mm = mmap.mmap(fd, page, flags, mmap.PROT_READ | mmap.PROT_WRITE)
        # the data pages are mapped twice in a row: a record that wraps is contiguous
        self._prod_mm = mmap.mmap(fd, page + 2 * size, flags, mmap.PROT_READ, offset=page)
        # 8-byte aligned numpy views: one load or store each, never torn
        self._cons = np.frombuffer(self._cons_mm, np.uint64, 1)
        self._prod = np.frombuffer(self._prod_mm, np.uint64, 1)
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def skip(self) -> None:
        """Drop what the ring holds."""
        self._cons[0] = self._prod[0]

    def wait(self, timeout_s: float) -> None:
        """Until the ring has data (the kernel wakes us once per batch) or timeout."""
        self._poll.poll(max(0, int(timeout_s * 1000)))

    def drain(self) -> list[Record]:
        """Every committed record, in ring order; frees their space."""
        cons, prod = int(self._cons[0]), int(self._prod[0])
        mm, base, mask, out = self._prod_mm, mmap.PAGESIZE, self.mask, []
        unpack, add, dirs = _RING_REC.unpack_from, out.append, DIRS
        while cons < prod:
            off = base + (cons & mask)
            hdr, _, ts, wire, cap, verdict, d, _, cpu = unpack(mm, off)
            if hdr & RINGBUF_BUSY:
                break                   # reserved, not yet committed
            n = hdr & ~(RINGBUF_BUSY | RINGBUF_DISCARD)
            if not hdr & RINGBUF_DISCARD and n >= CAP_HDR_LEN:
                at = off + RINGBUF_HDR + CAP_HDR_LEN
                add(Record(ts, mm[at:at + min(cap, n - CAP_HDR_LEN)], wire, verdict,
                           dirs.get(d, "?"), cpu))
            cons += (n + RINGBUF_HDR + 7) & ~7
        self._cons[0] = cons
        return out

    def close(self) -> None:
        self._poll = None
        del self._cons, self._prod
        for mm in (self._cons_mm, self._prod_mm):
            mm.close()


class RingCapture:
    """One capture on one program: on when started, its lease renewed while
    batches are taken, off (and the last frames drained) when closed.

    >>> with RingCapture(maps, snaplen=128) as cap:       # doctest: +SKIP
    ...     for batch in cap.batches(duration=5): ...
    """

    def __init__(self, maps: CaptureMaps, *, snaplen: int | None = None, job: int | None = None,
                 worker: int | None = None, round_: int | None = None, tx: bool = False):
        self.maps = maps
        self.snaplen = min(snaplen or maps.frame_max, maps.frame_max)
        flags = (CAP_F_JOB if job is not None else 0) | (CAP_F_WORKER if worker is not None
                                                         else 0)
        flags |= (CAP_F_ROUND if round_ is not None else 0) | (CAP_F_TX if tx else 0)
        self._want = CapCfg(owner=os.getpid(), snaplen=self.snaplen, flags=flags, job=job or 0,
                            round=round_ or 0, worker=worker or 0)
        self.filtered = bool(flags & ~CAP_F_TX)
        self.ring: Ring | None = None
        self.taken = self.reordered = self.lapsed = 0
        self.on_ns = self._renewed = self._last_ts = 0
        self._pending: list[Record] = []
        self._base = (0, 0, 0)
        #: add to a record's ts_ns for ns since the epoch (one offset: order is kept)
        self.epoch_offset_ns = time.time_ns() - time.monotonic_ns()

    def start(self) -> RingCapture:
        now = time.monotonic_ns()
        cur = self.maps.cfg.get(0)
        if cur.until_ns > now and cur.owner != os.getpid() and _alive(cur.owner):
            raise CaptureError(f"a capture is running on this program already (pid {cur.owner});"
                               " stop it first (one capture per program)")
        self.ring = Ring(self.maps.fds["ltp_capring"], self.maps.ring_bytes)
        try:
            self.ring.skip()                # what a killed capture left
            self._base = (*self.maps.stat_totals(), self.maps.ingress_frames())
            self.on_ns = now
            self._renew(now)
        except BaseException:   # __exit__ does not run when __enter__ raises
            self.maps.cfg.set(0, CapCfg())
            self.ring.close()
            self.ring = None
            raise
        return self

    def renew(self) -> None:
        """Extend the lease (batches() does this itself while it runs)."""
        self._renew(time.monotonic_ns())

    def _renew(self, now: int) -> None:
        if self._want.until_ns and now >= self._want.until_ns:
            self.lapsed += 1            # frames went uncaptured (and uncounted) meanwhile
        self._want.until_ns = now + LEASE_NS
        self.maps.cfg.set(0, self._want)
        self._renewed = now

    def batches(self, duration: float | None = None,
                stop: Callable[[], bool] | None = None) -> Iterator[list[Record]]:
        """Batches of records in timestamp order until `duration` seconds
        pass or `stop()` says so (checked at least every 50 ms; None: until
        the caller stops taking them); renews the lease."""
        end = None if duration is None else self.on_ns + int(duration * 1e9)
        while True:
            now = time.monotonic_ns()
            if (end is not None and now >= end) or (stop is not None and stop()):
                return
            if now - self._renewed >= RENEW_NS:
                self._renew(now)
            self.ring.wait(min(0.05, (end - now) / 1e9) if end else 0.05)
            batch = self._release(self.ring.drain(), time.monotonic_ns() - REORDER_NS)
            if batch:
                yield batch

    def _release(self, new: list[Record], upto: int | None) -> list[Record]:
        """Records of `new` and those held back, sorted; those stamped after
        `upto` (None: all) stay held back for the next call."""
        pend = self._pending
        pend.extend(r for r in new if r.ts_ns >= self.on_ns)
        self.taken += len(new)
        pend.sort(key=_ts)
        n = len(pend) if upto is None else bisect.bisect_right(pend, upto, key=_ts)
        out, self._pending = pend[:n], pend[n:]
        for r in out:
            if r.ts_ns < self._last_ts:
                self.reordered += 1
            self._last_ts = max(self._last_ts, r.ts_ns)
        return out

    def stop(self) -> list[Record]:
        """Switch capture off; the records still in the ring or held back."""
        if self.ring is None:
            return []
        self.maps.cfg.set(0, CapCfg())
        out, deadline = [], time.monotonic() + 0.2
        while True:     # a CPU that began a frame before the switch outputs it after
            out += self._release(self.ring.drain(), None)
            if self.taken >= self.stats()["captured"] or time.monotonic() > deadline:
                break
            time.sleep(DRAIN_POLL_S)
        self.ring.close()
        self.ring = None
        return out

    def stats(self) -> dict[str, int]:
        """Since start: records the program output and lost, LTP frames it
        counted coming in (all frames, filters or not), records read here,
        those read out of timestamp order, and how often the lease ran out
        before this process renewed it (capture was off meanwhile)."""
        cap, lost = self.maps.stat_totals()
        return {"captured": cap - self._base[0], "lost": lost - self._base[1],
                "program_frames": self.maps.ingress_frames() - self._base[2],
                "read": self.taken, "reordered": self.reordered, "lapsed": self.lapsed}

    def __enter__(self) -> RingCapture:
        return self.start()

    def __exit__(self, *exc) -> None:
        if self.ring is not None:
            self.maps.cfg.set(0, CapCfg())
            self.ring.close()
            self.ring = None


def _ts(r: Record) -> int:
    return r.ts_ns


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
