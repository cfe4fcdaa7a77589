# SPDX-License-Identifier: Apache-2.0
"""The flight recorder: what each rank is doing now, and its latest steps, in
a file anyone can read even while the rank is stopped (docs/slow-or-stuck.md).

With LTP_FLIGHT_DIR set (`ltp launch` and `ltp train` set it to a folder of
the job's), every rank maps `rank<R>.now` there: a fixed array of int64
words, preallocated, written in place (no allocation, no syscall) each time
the rank changes phase:

  header  pid, role, index, rank; now: op seq, phase, round, since (ns);
          ops finished, the median op interval (ns), the watchdog's last tick
          (ns: a stopped process's stops), events written, dumps written
  peers   per peer, when this rank last heard from it (ns): a worker its
          server's answer; a server each worker's last chunk at the NIC
  ring    the latest RING phase changes: (seq, phase, round, t_ns)

Times are CLOCK_MONOTONIC ns (`perf_counter_ns`), as in trace.py. A
watchdog thread ticks every median/8 (TICK_MIN_S..TICK_MAX_S: 25-100 ms)
and writes the ring out as JSON (`rank<R>.json`, atomically: a temporary file renamed) when
the rank has waited on others past max(STALL_K x the median op interval,
STALL_MIN_S) (LTP_STALL_K, LTP_STALL_MIN_S), once per stalled wait; also on
SIGUSR1, a FilledWarning, a DeadPeerError a server answered, and an
exception that ends the rank (`trigger`). The launcher (control/launcher/
hangs.py) reads the .now files and dumps and prints one line per rank.
LTP_FLIGHT=0 turns the recorder off.
"""
from __future__ import annotations

import json
import logging
import mmap
import os
import signal
import struct
import threading
import time

from ...dataplane import files
from .. import settings_table
from ..flightfile import EV_REC as _EV, NOW_REC as _NOW
from ..flightfile import (HEADER, MAGIC, OP_START, PEERS, PHASES, RING, RING_AT, SERVER,
                         W_DUMPS, W_EVENTS, W_SEQ, W_STEP, WAITS, WORDS)
from ..flightfile import (BARRIER, COMPUTE, END, GATHER, OPS, PULL, PUSH,  # noqa: F401 (callers'
                         SEND, START, WORKER)                              # phases and roles)

log = logging.getLogger("ltpx.torch.flight")

STALL_K, STALL_MIN_S = (settings_table.TABLE[n].default for n in ("stall_k", "stall_min_s"))
TICK_MIN_S, TICK_MAX_S = 0.025, 0.1
ARMED_AFTER = 3        # ops before the median means anything
INTERVALS = 32         # op intervals the median is taken over
RE_DUMP_S = 10.0       # the same non-stall reason is dumped at most this often
RECORDS = 32           # trace-timeline records a dump carries (the latest)

def _env_float(name: str) -> float:
    """Setting `name`'s variable; its default if that is not a number > 0."""
    try:
        return settings_table.env(name)
    except ValueError:
        return settings_table.TABLE[name].default


class Recorder:
    """This rank's .now file and its watchdog."""

    def __init__(self, folder: str, rank: int, role: int, index: int):
        self.folder, self.rank = folder, rank
        self.path = os.path.join(folder, f"rank{rank}.now")
        self.dump_path = os.path.join(folder, f"rank{rank}.json")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, WORDS * 8)
            self.mm = mmap.mmap(fd, WORDS * 8)
        finally:
            os.close(fd)
        struct.pack_into("<qqqqq", self.mm, 0, MAGIC, os.getpid(), role, index, rank)
        self.role, self.index = role, index
        self.events = 0
        self.seq = self.phase = self.round = 0
        self.since = time.perf_counter_ns()
        self.last_start = 0
        self.iv = [0] * INTERVALS       # op intervals (ns), a ring
        self.ops = 0
        self.k, self.floor_s = _env_float("stall_k"), _env_float("stall_min_s")
        self.dumped: tuple | None = None        # the stalled wait dumped already
        self.last_reason: dict[str, float] = {}
        self.records = None                     # a callable: the trace timeline's records
        self.asked: list[tuple[str, str]] = []  # reasons waiting for the watchdog
        self.wake = threading.Event()
        self.stopped = False
        self.enter(START, 0)
        self.thread = threading.Thread(target=self.loop, name="ltpx-flight", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------ the hot path
    def enter(self, phase: int, seq: int, rnd: int = -1) -> None:
        """This rank now does `phase` of op `seq` (round rnd)."""
        t = time.perf_counter_ns()
        if phase in OP_START and seq != self.seq:
            if self.last_start:
                self.iv[self.ops % INTERVALS] = t - self.last_start
                self.ops += 1
            self.last_start = t
        self.seq, self.phase, self.round, self.since = seq, phase, rnd, t
        mm = self.mm
        _NOW.pack_into(mm, W_SEQ * 8, seq, phase, rnd, t, self.ops)
        _EV.pack_into(mm, (RING_AT + 4 * (self.events % RING)) * 8, seq, phase, rnd, t)
        self.events += 1
        struct.pack_into("<q", mm, W_EVENTS * 8, self.events)

    def heard(self, peer: int, t_ns: int) -> None:
        """The latest packet from `peer` came at t_ns."""
        if 0 <= peer < PEERS and t_ns:
            struct.pack_into("<q", self.mm, (HEADER + peer) * 8, t_ns)

    # ------------------------------------------------------------ the watchdog
    def median_s(self) -> float | None:
        n = min(self.ops, INTERVALS)
        if self.ops < ARMED_AFTER:
            return None
        return sorted(self.iv[:n])[n // 2] / 1e9

    def threshold_s(self) -> float | None:
        med = self.median_s()
        return None if med is None else max(self.k * med, self.floor_s)

    def loop(self) -> None:
        while not self.stopped:
            med = self.median_s()
            tick = min(TICK_MAX_S, max(TICK_MIN_S, (med or 1.0) / 8))
            self.wake.wait(tick)
            self.wake.clear()
            if self.stopped:
                return
            now = time.perf_counter_ns()
            struct.pack_into("<qq", self.mm, W_STEP * 8, int((med or 0) * 1e9), now)
            try:
                while self.asked:
                    reason, detail = self.asked.pop(0)
                    self.dump(reason, detail)
                self.check_stall(now)
            except Exception as e:   # a recorder never takes its rank down
                log.warning("flight recorder: %s", e)

    def check_stall(self, now: int) -> None:
        limit = self.threshold_s()
        at = (self.seq, self.phase, self.round, self.since)
        if limit is None or self.phase not in WAITS or self.dumped == at:
            return
        if (now - self.since) / 1e9 > limit:
            self.dumped = at
            self.dump("stall", f"waited past {limit:.3f} s (max({self.k:g} x the median op "
                      f"interval, {self.floor_s:g} s))")

    def trigger(self, reason: str, detail: str = "", now: bool = False) -> None:
        """Write the ring out (by the watchdog, or here if now): `reason` at most
        every RE_DUMP_S, except SIGUSR1."""
        t = time.monotonic()
        if reason != "SIGUSR1" and t - self.last_reason.get(reason, -RE_DUMP_S) < RE_DUMP_S:
            return
        self.last_reason[reason] = t
        if now:
            self.dump(reason, detail)
        else:
            self.asked.append((reason, detail))
            self.wake.set()

    def snapshot(self, reason: str, detail: str) -> dict:
        now = time.perf_counter_ns()
        peers = struct.unpack_from(f"<{PEERS}q", self.mm, HEADER * 8)
        ring = [_EV.unpack_from(self.mm, (RING_AT + 4 * (i % RING)) * 8)
                for i in range(max(0, self.events - RING), self.events)]
        recs = []
        if self.records is not None:
            try:
                recs = self.records()[-RECORDS:]
            except Exception:    # noqa: BLE001 (a timeline changing under the watchdog)
                recs = []
        return {"rank": self.rank, "role": "server" if self.role == SERVER else "worker",
                "index": self.index, "pid": os.getpid(), "reason": reason, "detail": detail,
                "t_ns": now, "time": time.time(),
                "now": {"seq": self.seq, "phase": PHASES[self.phase], "round": self.round,
                        "for_s": round((now - self.since) / 1e9, 4)},
                "median_op_s": self.median_s(), "threshold_s": self.threshold_s(),
                "ops": self.ops,
                "peers": {str(p): {"last_packet_age_s": round((now - t) / 1e9, 4)}
                          for p, t in enumerate(peers) if t},
                "events": [{"seq": s, "phase": PHASES[ph], "round": r,
                            "age_s": round((now - t) / 1e9, 4)} for s, ph, r, t in ring],
                "records": recs}

    def dump(self, reason: str, detail: str = "") -> str:
        """Write the ring as JSON (atomically); its path."""
        d = self.snapshot(reason, detail)
        tmp = f"{self.dump_path}.{os.getpid()}.tmp"
        with files.create(tmp, binary=False) as f:  # 0600, never through a symlink
            json.dump(d, f, separators=(",", ":"), default=str)
        os.replace(tmp, self.dump_path)
        n = struct.unpack_from("<q", self.mm, W_DUMPS * 8)[0] + 1
        struct.pack_into("<q", self.mm, W_DUMPS * 8, n)
        log.info("flight recorder: %s (%s) -> %s", reason, detail, self.dump_path)
        return self.dump_path

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.enter(END, self.seq)
        self.wake.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=1.0)


_rec: Recorder | None = None


def current() -> Recorder | None:
    return _rec


def start(rank: int, role: int, index: int, records=None) -> Recorder | None:
    """This rank's recorder, if LTP_FLIGHT_DIR names a folder (and LTP_FLIGHT
    is not 0); SIGUSR1 then dumps its ring."""
    global _rec
    folder = settings_table.env("flight_dir")
    if not folder or not settings_table.env("flight"):
        return None
    try:
        os.makedirs(folder, exist_ok=True)
        rec = Recorder(folder, rank, role, index)
    except OSError as e:
        log.warning("flight recorder off: %s: %s", folder, e)
        return None
    rec.records = records
    _rec = rec
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGUSR1, lambda signum, frame: rec.trigger("SIGUSR1"))
    return rec


def stop() -> None:
    global _rec
    rec, _rec = _rec, None
    if rec is not None:
        rec.stop()


def enter(phase: int, seq: int, rnd: int = -1) -> None:
    if _rec is not None:
        _rec.enter(phase, seq, rnd)


def heard(peer: int, t_ns: int) -> None:
    if _rec is not None:
        _rec.heard(peer, t_ns)


def trigger(reason: str, detail: str = "", now: bool = False) -> None:
    if _rec is not None:
        _rec.trigger(reason, detail, now)
