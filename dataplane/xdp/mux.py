# SPDX-License-Identifier: Apache-2.0
"""One interface shared by several LTP endpoints: seats in bpf/ltp_mux.c.

A device carries one XDP program, and an endpoint's own program owns the
device it attaches to. Where several ranks of a host share one NIC (eight
GPUs, one or two NICs), each takes a *seat* of the device's mux instead:
its ltp_xdp, compiled for its own UDP port, is tail-called for every frame
to that port. Each rank keeps its own program and maps, so its flows, banks
and tokens are its own and a rank that dies frees its own memory, not its
neighbours'.

Lifetimes, with nothing pinned:
- The first rank to take a seat on a device attaches the mux through a BPF
  link; every later one opens that link by its kernel id and holds an fd
  of it. The link, and with it the mux, lives while any seat holder lives,
  and goes with the last (its fds close with the processes).
- A seat is the rank's program in `ltp_mux_progs`, its port in
  `ltp_mux_ports` and its holder (pid and process start time) in
  `ltp_mux_seats`. `leave` empties it. A holder killed before it could is
  swept by the next rank to take or leave a seat on the device (its pid no
  longer names a process with that start time). Until then its program and
  maps stay, and its program still takes its port's frames (a worker's,
  which beats for no owner, even ACKs them), where an attachment of its own
  would have gone with it. Sweeping reads /proc: the ranks sharing a
  device must share a pid namespace (and the lock file's /run).
- Each seat's endpoint writes a record of its own (records.py: <dev>.seats/
  <port>.json), so `ltp status`, `ltp flows` and `ltp top` list every
  rank on the device with its role; a sweep removes a dead holder's.
- Taking and leaving hold a lock per device (flock on a file beside the
  endpoints' records), so two ranks starting at once never take one seat.

A shared rank binds its socket to its own port, so the ACKs of its pushes
and the answers to it come back to that port. A group (broadcast) answer
reaches one program only: a rank on a shared device takes its answers by
unicast.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import time
from dataclasses import dataclass, field
from collections.abc import Iterator

from .. import clib, netns
from ...errors import RegistryError
from . import lookup
from .loader import attach_link, compile_program
from .records import RECORD_ROOT, ns_key, process_start, read_record, remove_record, where

PROGRAM = "ltp_mux"
SEATS = 64                 # MUX_SEATS in bpf/ltp_mux.c
MAPS = ("ltp_mux_progs", "ltp_mux_ports", "ltp_mux_seats", "ltp_mux_count")
COUNTERS = ("dispatched", "no_seat", "fell_through", "emptied")
BPF_NOEXIST = 1
VANISH_TRIES, VANISH_WAIT_S = 20, 0.01   # a mux on its way out, waited out (_attachment)


class SeatValue(ctypes.Structure):
    """struct ltp_mux_seat: who holds a seat."""
    _fields_ = [("pid", ctypes.c_uint32), ("port", ctypes.c_uint16), ("pad", ctypes.c_uint16),
                ("start", ctypes.c_uint64)]


@dataclass
class Mux:
    """This process's hold on a device's mux: fds of its link and maps."""

    dev: str
    ns: str | None
    link_fd: int
    fds: dict[str, int] = field(default_factory=dict)

    def close(self) -> None:
        """Close this process's fds (once: a second call closes nothing)."""
        for fd in [self.link_fd, *self.fds.values()]:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.link_fd, self.fds = -1, {}

    def holders(self) -> dict[int, SeatValue]:
        """Seat -> its holder, as the map says now."""
        return {int(k.value): v for k, v in clib.map_items(self.fds["ltp_mux_seats"],
                                                           ctypes.c_uint32, SeatValue)}

    def counters(self) -> dict[str, int]:
        """The mux's counters, summed over CPUs."""
        ncpu = clib.num_possible_cpus()
        out = {}
        for i, name in enumerate(COUNTERS):
            vals = (ctypes.c_uint64 * ncpu)()
            clib.map_lookup(self.fds["ltp_mux_count"], ctypes.c_uint32(i), vals)
            out[name] = int(sum(vals))
        return out


@dataclass
class Seat:
    """A rank's seat on a shared device (take_seat); `leave()` frees it."""

    mux: Mux
    seat: int
    port: int

    def link_id(self) -> int:
        """The kernel id of the mux's link (what the seat's record names)."""
        return lookup.link_info(self.mux.link_fd)["id"]

    def swap(self, prog_fd: int) -> None:
        """This seat's program becomes `prog_fd` (an ltp_xdp for the same
        port), in one map update: the mux's next frame for the port
        tail-calls the new program, none falls through meanwhile."""
        clib.map_update(self.mux.fds["ltp_mux_progs"], ctypes.c_uint32(self.seat),
                        ctypes.c_uint32(prog_fd))

    def leave(self) -> None:
        """Empty this seat; the mux goes with its last holder's fds (closed
        under the lock, so a rank taking a seat meanwhile never meets a mux
        on its way out)."""
        if not self.mux.fds:
            self.mux.close()
            return
        with _device_lock(self.mux.dev, self.mux.ns):
            try:
                _empty(self.mux, self.seat, self.port)
                sweep(self.mux)
            finally:
                self.mux.close()


LOCK_SUFFIX = ".mux.lock"


def _lock_path(dev: str, ns: str | None) -> str:
    """The device's lock file, by the namespace's name whether given or the
    process's own (records are kept by it too)."""
    return os.path.join(RECORD_ROOT, ns_key(ns or netns.current()), dev + LOCK_SUFFIX)


@contextlib.contextmanager
def _device_lock(dev: str, ns: str | None) -> Iterator[None]:
    path = _lock_path(dev, ns)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)               # and the lock with it


def _attachment(dev: str, ns: str | None) -> tuple[int, dict | None]:
    """lookup.attachment, but a program on its way out (a killed holder's
    last fds closing, which takes no lock) is waited out briefly, so the
    device reads as free rather than as someone else's."""
    for _ in range(VANISH_TRIES):
        ifindex, att = lookup.attachment(dev, ns)
        if att is None or lookup.prog_name(att["prog_id"]) is not None:
            return ifindex, att
        time.sleep(VANISH_WAIT_S)
    return ifindex, att


def _mux_on(dev: str, ns: str | None, mode: str) -> Mux:
    """This process's hold on dev's mux: the one attached, else a new one."""
    ifindex, att = _attachment(dev, ns)
    if att is None:
        bpf, fn = compile_program("ltp_mux.c", PROGRAM)
        link = -1
        try:
            link = attach_link(fn.fd, dev, ns, mode,
                               fix="a shared device carries the mux alone")
            fds = {n: os.dup(bpf[n.encode()].get_fd()) for n in MAPS}
        except BaseException:
            if link >= 0:
                os.close(link)     # and the mux with it: nobody else holds it yet
            raise
        finally:
            bpf.cleanup()          # the link holds the program, the program its maps
        return Mux(dev, ns, link, fds)
    if lookup.prog_name(att["prog_id"]) != PROGRAM:
        raise RegistryError(f"{where(dev, ns)} carries {lookup.describe(att)}, not LTP's "
                            "mux: a device is shared only by endpoints that all ask for it "
                            "(stop the endpoint or program that holds it)")
    if att["mode"] != mode:
        raise RegistryError(f"{where(dev, ns)}: its mux runs in {att['mode']} mode, this "
                            f"endpoint asks for {mode}: give every rank sharing it one mode")
    lid = lookup.xdp_link(att["prog_id"], ifindex)
    if lid is None:
        raise RegistryError(f"{where(dev, ns)}: its mux is attached without a link (not "
                            "by an LTP endpoint): detach it (`ip link set DEV xdp off`)")
    mux = Mux(dev, ns, clib.link_fd_by_id(lid))
    try:
        prog = clib.prog_fd_by_id(att["prog_id"])
        try:
            ids = clib.prog_map_ids(prog)
        finally:
            os.close(prog)
        for mid in ids:
            fd = clib.map_fd_by_id(mid)
            name = lookup.map_info(fd)["name"]
            if name in MAPS and name not in mux.fds:
                mux.fds[name] = fd
            else:
                os.close(fd)
        missing = set(MAPS) - set(mux.fds)
        if missing:
            raise RegistryError(f"{where(dev, ns)}: its mux lacks map(s) {sorted(missing)} "
                                "(another build's?): stop its ranks first")
    except BaseException:
        mux.close()
        raise
    return mux


def _empty(mux: Mux, seat: int, port: int) -> None:
    """Seat `seat` (port `port`) emptied: its port, its program, its holder."""
    for name, key in (("ltp_mux_ports", ctypes.c_uint16(port)),
                      ("ltp_mux_progs", ctypes.c_uint32(seat)),
                      ("ltp_mux_seats", ctypes.c_uint32(seat))):
        with contextlib.suppress(FileNotFoundError):
            clib.map_delete(mux.fds[name], key)


def sweep(mux: Mux) -> list[int]:
    """Empty the seats whose holder is dead, and remove their records (the
    holder's own: records.py); the seats emptied."""
    gone = []
    for seat, v in mux.holders().items():
        if process_start(v.pid) != v.start:
            _empty(mux, seat, v.port)
            gone.append(seat)
            ns = mux.ns or netns.current()
            with contextlib.suppress(RegistryError):
                rec = read_record(mux.dev, ns, v.port)
                if rec is not None and rec.seat and rec.pid == v.pid:
                    remove_record(mux.dev, ns, v.port)
    return gone


def take_seat(dev: str, ns: str | None, mode: str, prog_fd: int, port: int) -> Seat:
    """The program `prog_fd` (an ltp_xdp compiled with LTP_PORT=port) into a
    free seat of dev's mux, attached now if the device carries none.
    RegistryError when the device carries another program, or a live rank
    holds `port` there already."""
    if not 1 <= port <= 65535:
        raise ValueError(f"port must be in 1..65535, got {port}")
    mine = None
    with _device_lock(dev, ns):
        mux = _mux_on(dev, ns, mode)
        try:
            sweep(mux)
            held = mux.holders()
            for s, v in held.items():
                if v.port == port:
                    raise RegistryError(f"{where(dev, ns)}: UDP port {port} is held by "
                                        f"process {v.pid} (seat {s}): give each rank "
                                        "sharing the device a port of its own (LTP_UDP_PORT)")
            free = [s for s in range(SEATS) if s not in held]
            if not free:
                raise RegistryError(f"{where(dev, ns)}: all {SEATS} seats of its mux are "
                                    "held")
            pid = os.getpid()
            me = SeatValue(pid=pid, port=port, start=process_start(pid) or 0)
            clib.map_update(mux.fds["ltp_mux_seats"], ctypes.c_uint32(free[0]), me,
                            BPF_NOEXIST)
            mine = free[0]
            clib.map_update(mux.fds["ltp_mux_progs"], ctypes.c_uint32(mine),
                            ctypes.c_uint32(prog_fd))
            clib.map_update(mux.fds["ltp_mux_ports"], ctypes.c_uint16(port),
                            ctypes.c_uint32(mine), BPF_NOEXIST)
        except BaseException:
            if mine is not None:
                with contextlib.suppress(OSError):
                    _empty(mux, mine, port)
            mux.close()
            raise
    return Seat(mux, mine, port)


def seats(dev: str, ns: str | None) -> list[dict]:
    """The seats of dev's mux (for `ltp status`): seat, port, pid, alive;
    [] when the device carries no mux."""
    _, att = lookup.attachment(dev, ns)
    if att is None or lookup.prog_name(att["prog_id"]) != PROGRAM:
        return []
    mux = _mux_on(dev, ns, att["mode"])
    try:
        return [{"seat": s, "port": v.port, "pid": v.pid,
                 "alive": process_start(v.pid) == v.start}
                for s, v in sorted(mux.holders().items())]
    finally:
        mux.close()


