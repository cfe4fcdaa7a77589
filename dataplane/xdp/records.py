# SPDX-License-Identifier: Apache-2.0
"""Where loaded programs are described: the record files and the pin folders.

Every attached ltp_xdp program has a record /run/ltp/xdp/<netns or
"host">/<dev>.json (role, job, geometry, mode, program, link and map ids,
peers, time, owner); a program in a seat of a device's mux (mux.py) has
/run/ltp/xdp/<netns or "host">/<dev>.seats/<port>.json, one per seat, the
mux's link its link. Who owns it decides the rest:

- `ltp load` (pinned): program, link and maps are pinned in
  /sys/fs/bpf/ltp/<netns or "host">/<dev>/ and outlive every process;
- an endpoint (a process): nothing is pinned, everything dies with the
  process; the record names it (pid and start time, so a recycled pid is
  not taken for it) and readers open the maps by kernel id while it lives.

bpffs holds only pins and directories (no regular files, no symlinks), so the
record lives in /run, a tmpfs that is emptied at reboot as bpffs is. This
module names, reads, writes, lists and removes both, and tells whether an
owner lives; it never talks to the kernel beyond files.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from ...errors import RegistryError
from .maps import Geometry

PIN_ROOT = "/sys/fs/bpf/ltp"
RECORD_ROOT = "/run/ltp/xdp"
HOST = "host"                 # directory and display name of the machine's own namespace
RECORD_VERSION = 2            # 2: owner (pinned or a process), pid_start, link and map ids
SEATS_DIR = ".seats"          # <dev>.seats/: the records of the seats of dev's mux
_IFNAME_BAD = re.compile(r"[/:\s]")


# --------------------------------------------------------------------------- names

def check_ifname(dev: str) -> None:
    """Raise ValueError unless `dev` is a name the kernel could give a device."""
    if not dev or len(dev.encode()) > 15 or dev in (".", "..") or _IFNAME_BAD.search(dev):
        raise ValueError(f"{dev!r} is not a device name (1-15 characters, no '/', ':' or "
                         "spaces)")


def ns_key(ns: str | None) -> str:
    return ns or HOST


def ns_arg(text: str | None) -> str | None:
    """--netns value -> namespace (None: the host's own; "host" names it too)."""
    return None if text in (None, "", HOST) else text


def where(dev: str, ns: str | None) -> str:
    return f"{dev} in {'the host namespace' if not ns else 'namespace ' + ns}"


def nsflag(ns: str | None) -> str:
    """The --netns part of a command line that names `ns` again."""
    return f" --netns {ns}" if ns else ""


def pin_dir(dev: str, ns: str | None) -> str:
    return os.path.join(PIN_ROOT, ns_key(ns), dev)


def record_path(dev: str, ns: str | None, port: int = 0) -> str:
    """A device's record, or (port) that of the seat taking `port` on its mux."""
    if port:
        return os.path.join(RECORD_ROOT, ns_key(ns), dev + SEATS_DIR, f"{port}.json")
    return os.path.join(RECORD_ROOT, ns_key(ns), f"{dev}.json")


# --------------------------------------------------------------------------- records

@dataclass
class Record:
    """What one `ltp load` attached and pinned (pinned=True), or what one
    endpoint process attached and holds (pinned=False: `pid` and
    `pid_start` name the owner, `map_ids` the maps)."""

    dev: str
    netns: str | None
    role: str
    job: int
    geometry: Geometry
    mode: str
    prog_id: int
    peers: dict[int, int] = field(default_factory=dict)   # worker id -> slot
    loaded_at: float = 0.0
    pid: int = 0
    version: int = RECORD_VERSION
    pinned: bool = True
    pid_start: int = 0                                    # owner's start time (clock ticks)
    link_id: int = 0
    map_ids: dict[str, int] = field(default_factory=dict)  # map name -> kernel id
    sender: str = ""           # an endpoint's pushes: "xdp" or "socket" ("": `ltp load`)
    sender_why: str = ""       # ... and why (control/transport/options.SenderChoice)
    seat: bool = False         # in a seat of the device's mux, on its port (geometry.port)
    label: str = ""            # what an endpoint serves ("rank 5"), beside its role

    @property
    def pin_dir(self) -> str:
        return pin_dir(self.dev, self.netns)

    @property
    def port(self) -> int:
        """The seat's port; 0 for a program the device carries itself."""
        return self.geometry.port if self.seat else 0

    @property
    def path(self) -> str:
        return record_path(self.dev, self.netns, self.port)

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "netns": ns_key(self.netns), "dev": self.dev,
                "role": self.role, "job": self.job, "mode": self.mode, "prog_id": self.prog_id,
                "geometry": self.geometry.to_dict(),
                "peers": {str(w): s for w, s in sorted(self.peers.items())},
                "loaded_at": self.loaded_at,
                "loaded_at_iso": datetime.datetime.fromtimestamp(self.loaded_at).isoformat(
                    timespec="seconds") if self.loaded_at else None,
                "pid": self.pid, "pin_dir": self.pin_dir, "record": self.path,
                "owner": "ltp load" if self.pinned else "process", "pid_start": self.pid_start,
                "link_id": self.link_id, "map_ids": dict(self.map_ids),
                "sender": self.sender or None, "sender_why": self.sender_why or None,
                "seat_port": self.port or None, "label": self.label or None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Record:
        return cls(dev=d["dev"], netns=ns_arg(d.get("netns")), role=d["role"],
                   job=int(d.get("job", 0)), geometry=Geometry(**d["geometry"]),
                   mode=d["mode"], prog_id=int(d.get("prog_id", 0)),
                   peers={int(w): int(s) for w, s in d.get("peers", {}).items()},
                   loaded_at=float(d.get("loaded_at", 0.0)), pid=int(d.get("pid", 0)),
                   version=int(d.get("version", RECORD_VERSION)),
                   # version 1 records were all pinned (endpoints pinned then too)
                   pinned=d.get("owner", "ltp load") == "ltp load",
                   pid_start=int(d.get("pid_start", 0)), link_id=int(d.get("link_id", 0)),
                   map_ids={str(k): int(v) for k, v in d.get("map_ids", {}).items()},
                   sender=str(d.get("sender") or ""), sender_why=str(d.get("sender_why") or ""),
                   seat=bool(d.get("seat_port")), label=str(d.get("label") or ""))


def read_record(dev: str, ns: str | None, port: int = 0) -> Record | None:
    """The record of `dev` in `ns` (port: of its mux's seat on that port),
    None if there is none."""
    path = record_path(dev, ns, port)
    try:
        with open(path) as f:
            return Record.from_dict(json.load(f))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RegistryError(f"cannot read {path}: {e}; `ltp unload {dev}"
                            f"{nsflag(ns)}` removes it") from None


def write_record(rec: Record) -> None:
    tmp = f"{rec.path}.{os.getpid()}.tmp"
    for tries in range(3):     # a neighbour's remove_record may take an empty folder away
        try:
            os.makedirs(os.path.dirname(rec.path), exist_ok=True)
            with open(tmp, "w") as f:
                json.dump(rec.to_dict(), f, indent=1)
            os.replace(tmp, rec.path)
            return
        except FileNotFoundError:
            if tries == 2:
                raise


def entries(ns: Any = ...) -> list[tuple[str | None, str]]:
    """(netns, dev) of everything `ltp load` left: records and pin folders.
    `ns` given (None: the host's own) keeps that namespace only; ... (the
    default) keeps all."""
    found: set[tuple[str, str]] = set()
    for root, suffix in ((RECORD_ROOT, ".json"), (PIN_ROOT, "")):
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for key in os.listdir(root):
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    for name in os.listdir(os.path.join(root, key)):
                        if suffix and not name.endswith(suffix):
                            continue
                        dev = name[:-len(suffix)] if suffix else name
                        if suffix or os.path.isdir(os.path.join(root, key, name)):
                            found.add((key, dev))
    out = [(ns_arg(k), d) for k, d in sorted(found)]
    if ns is not ...:
        out = [e for e in out if e[0] == ns]
    return out


def _port_file(name: str) -> bool:
    """Is `name` a seat's record, <port>.json (1..65535, no leading zero)?"""
    stem = name[:-5] if name.endswith(".json") else ""
    return stem.isdigit() and str(int(stem)) == stem and 1 <= int(stem) <= 65535


def seat_entries(ns: Any = ..., dev: str | None = None) -> list[tuple[str | None, str, int]]:
    """(netns, dev, port) of every seat record (of `dev` alone if given);
    `ns` as in `entries`."""
    found = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for key in os.listdir(RECORD_ROOT):
            if ns is not ... and ns_arg(key) != ns:
                continue
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for name in os.listdir(os.path.join(RECORD_ROOT, key)):
                    d = name[:-len(SEATS_DIR)]
                    if not name.endswith(SEATS_DIR) or (dev is not None and d != dev):
                        continue
                    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                        found += [(ns_arg(key), d, int(f[:-5]))
                                  for f in os.listdir(os.path.join(RECORD_ROOT, key, name))
                                  if _port_file(f)]
    return sorted(found, key=lambda e: (ns_key(e[0]), e[1], e[2]))


# --------------------------------------------------------------------------- owners

def process_start(pid: int) -> int | None:
    """Start time (clock ticks after boot) of process `pid`, None if there is
    none: with the pid it names one process, even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # field 22; the command (field 2) may hold spaces and parentheses
    return int(stat.rpartition(")")[2].split()[19])


def owner_alive(rec: Record) -> bool | None:
    """Does the process that holds `rec`'s program still run? None for a
    pinned program (`ltp load`'s has no owner process)."""
    if rec.pinned:
        return None
    start = process_start(rec.pid) if rec.pid > 0 else None
    return start is not None and (not rec.pid_start or start == rec.pid_start)


def owner_text(rec: Record) -> str:
    """The owner process as an error names it: pid and command line."""
    try:
        with open(f"/proc/{rec.pid}/cmdline", "rb") as f:
            # one line whatever the arguments hold (a `python -c` script has newlines)
            cmd = " ".join(f.read().replace(b"\0", b" ").decode(errors="replace").split())
    except OSError:
        cmd = ""
    if len(cmd) > 60:
        cmd = cmd[:57] + "..."
    me = " (this process)" if rec.pid == os.getpid() else ""
    return f"pid {rec.pid}{me}" + (f" `{cmd}`" if cmd and not me else "")


# --------------------------------------------------------------------------- removal

def unpin(directory: str) -> None:
    """Remove a pin folder and, when empty, its namespace folder and the root."""
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(directory)
    _rmdir_empty(os.path.dirname(directory), PIN_ROOT)


def remove_record(dev: str, ns: str | None, port: int = 0) -> None:
    """Remove the record of `dev` in `ns` (port: of its mux's seat on that
    port) and, when empty, its folders."""
    path = record_path(dev, ns, port)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    seats = [os.path.dirname(path)] if port else []
    _rmdir_empty(*seats, os.path.dirname(seats[0] if seats else path), RECORD_ROOT)


def _rmdir_empty(*dirs: str) -> None:
    for d in dirs:
        with contextlib.suppress(OSError):   # not empty, or gone: both fine
            os.rmdir(d)
