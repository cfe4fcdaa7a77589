# SPDX-License-Identifier: Apache-2.0
"""What a process tree holds, read from outside: its processes (descendants
by parent pid in /proc), each one's RSS, open fds and the BPF programs and
maps its fds refer to (/proc/PID/fdinfo), and every BPF program and map on
the machine (the kernel's id spaces).

Nothing here asks the processes anything or imports their code, so a job
measured with it stays a black box (`ltp bench soak`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ...dataplane import clib
from ..settings_table import TABLE

PROC = "/proc"


@dataclass(frozen=True)
class ProcSample:
    """One process at one moment. `start` (clock ticks after boot) tells a
    pid reused by a new process from the old one."""

    pid: int
    start: int
    comm: str
    rank: int | None        # its place in the LTP job: LTP_RANK of its environment, else RANK
    rss_kb: int
    fds: int
    progs: frozenset[int]   # BPF program ids its fds hold (programs, and links' programs)
    maps: frozenset[int]    # BPF map ids its fds hold

    @property
    def key(self) -> tuple[int, int]:
        return self.pid, self.start


def _stat(pid: int) -> tuple[str, int, int, str] | None:
    """(comm, ppid, start time, state) from /proc/PID/stat, None if it is
    gone. comm may hold spaces and parentheses: the fields start after the
    last ')'."""
    try:
        with open(f"{PROC}/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    return head.partition("(")[2], int(fields[1]), int(fields[19]), fields[0]


def parents() -> dict[int, int]:
    """pid -> parent pid of every process on the machine."""
    out = {}
    for name in os.listdir(PROC):
        if name.isdigit():
            st = _stat(int(name))
            if st:
                out[int(name)] = st[1]
    return out


def descendants(root: int) -> list[int]:
    """`root` and every process below it, parents before children."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents().items():
        children.setdefault(ppid, []).append(pid)
    out = [root]
    for pid in out:          # grows while it is walked: breadth first
        out.extend(sorted(children.get(pid, [])))
    return out


def running(pid: int, start: int) -> bool:
    """Is the process `pid` that started at `start` still running (not
    gone, not a zombie waiting for its parent)?"""
    st = _stat(pid)
    return st is not None and st[2] == start and st[3] != "Z"


def _rss_kb(pid: int) -> int:
    with open(f"{PROC}/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0                 # a zombie or a kernel thread has no VmRSS line


def _rank(pid: int) -> int | None:
    """LTP_RANK (servers first: ltp launch sets it), else RANK (torchrun's)."""
    with open(f"{PROC}/{pid}/environ", "rb") as f:
        env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    raw = env.get(TABLE["rank"].env.encode(), env.get(b"RANK"))
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def held_bpf(pid: int) -> tuple[int, set[int], set[int]]:
    """(open fds, program ids, map ids) of process `pid`. The fdinfo of a
    BPF map fd names its map_id; a program's and a link's name prog_id."""
    fd_dir = f"{PROC}/{pid}/fd"
    names = os.listdir(fd_dir)
    progs: set[int] = set()
    maps: set[int] = set()
    for fd in names:
        try:
            if not os.readlink(f"{fd_dir}/{fd}").startswith("anon_inode:bpf"):
                continue
            with open(f"{PROC}/{pid}/fdinfo/{fd}") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key == "prog_id":
                        progs.add(int(value))
                    elif key == "map_id":
                        maps.add(int(value))
        except (OSError, ValueError):
            continue         # closed while we looked
    return len(names), progs, maps


def sample(pid: int, with_rank: bool = True) -> ProcSample | None:
    """Process `pid` now, or None if it exited (or is exiting) meanwhile."""
    st = _stat(pid)
    if st is None:
        return None
    try:
        nfds, progs, maps = held_bpf(pid)
        rss = _rss_kb(pid)
        rank = _rank(pid) if with_rank else None
    except (OSError, ValueError):
        return None
    return ProcSample(pid=pid, start=st[2], comm=st[0], rank=rank, rss_kb=rss, fds=nfds,
                      progs=frozenset(progs), maps=frozenset(maps))


def machine_ids() -> tuple[set[int], set[int]]:
    """(program ids, map ids) of every BPF program and map on the machine."""
    return set(clib.prog_ids()), set(clib.map_ids())


def maps_of(prog_ids: set[int]) -> set[int]:
    """The map ids the programs `prog_ids` use (a program holds its maps
    even when no fd does); programs gone meanwhile are skipped."""
    out: set[int] = set()
    for pid in prog_ids:
        try:
            fd = clib.prog_fd_by_id(pid)
        except OSError:
            continue
        try:
            out.update(clib.prog_map_ids(fd))
        except OSError:
            pass
        finally:
            os.close(fd)
    return out


def holders(progs: set[int], maps: set[int]) -> dict[str, list[str]]:
    """Which processes on the machine hold these program and map ids:
    "prog 12" / "map 40" -> ["pid 123 (comm)", ...]; ids nobody holds are left
    out (they live on through an attachment, a pin or a program)."""
    out: dict[str, list[str]] = {}
    if not progs and not maps:
        return out
    for pid in parents():
        try:
            _, p, m = held_bpf(pid)
        except OSError:
            continue
        hits = [f"prog {i}" for i in sorted(p & progs)] + [f"map {i}" for i in sorted(m & maps)]
        if hits:
            st = _stat(pid)
            who = f"pid {pid} ({st[0] if st else '?'})"
            for h in hits:
                out.setdefault(h, []).append(who)
    return out
