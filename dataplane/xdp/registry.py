"""What `ltp load` left on this machine: attached programs, their pins and records.

A loaded ltp_xdp program lives in three places:

- attached to a device (the kernel keeps it there after the loader exits);
- pinned, program and every map, under /sys/fs/bpf/ltp/<netns or "host">/<dev>/,
  so any process can open the maps (`open_maps`) while training runs;
- described in /run/ltp/xdp/<netns or "host">/<dev>.json: role, job, geometry,
  mode, program id, peers, time. bpffs holds only pins and directories (no
  regular files, no symlinks), so the record lives in /run, a tmpfs that is
  emptied at reboot as bpffs is.

The pinned maps also tell slots, chunks, chunk size and banks (their sizes),
so `open_maps` checks a record against them and `geometry_from_pins` rebuilds
the geometry when a record is missing. Policy (which ids, which job) comes from
the caller; this module is the mechanism behind `ltp load/unload/status`.
"""
from __future__ import annotations

import contextlib
import ctypes
import datetime
import json
import os
import re
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from .. import clib, netns
from ...errors import DataplaneError, RegistryError
from .loader import open_pinned
from .maps import MAP_NAMES, Geometry
from .wire import PORT

PIN_ROOT = "/sys/fs/bpf/ltp"
RECORD_ROOT = "/run/ltp/xdp"
HOST = "host"                 # directory and display name of the machine's own namespace
ROLES = ("ps", "worker")
RECORD_VERSION = 1
_IFNAME_BAD = re.compile(r"[/:\s]")

# pyroute2's names for IFLA_XDP_ATTACHED, and our mode names
_XDP_ATTACHED = {"xdp": "native", "xdpgeneric": "skb", "xdpoffload": "hw", "xdpmulti": "multi",
                 1: "native", 2: "skb", 3: "hw", 4: "multi"}


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


def pin_dir(dev: str, ns: str | None) -> str:
    return os.path.join(PIN_ROOT, ns_key(ns), dev)


def record_path(dev: str, ns: str | None) -> str:
    return os.path.join(RECORD_ROOT, ns_key(ns), f"{dev}.json")


# --------------------------------------------------------------------------- records

@dataclass
class Record:
    """What one `ltp load` attached and pinned."""

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

    @property
    def pin_dir(self) -> str:
        return pin_dir(self.dev, self.netns)

    @property
    def path(self) -> str:
        return record_path(self.dev, self.netns)

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "netns": ns_key(self.netns), "dev": self.dev,
                "role": self.role, "job": self.job, "mode": self.mode, "prog_id": self.prog_id,
                "geometry": self.geometry.to_dict(),
                "peers": {str(w): s for w, s in sorted(self.peers.items())},
                "loaded_at": self.loaded_at,
                "loaded_at_iso": datetime.datetime.fromtimestamp(self.loaded_at).isoformat(
                    timespec="seconds") if self.loaded_at else None,
                "pid": self.pid, "pin_dir": self.pin_dir, "record": self.path}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Record":
        return cls(dev=d["dev"], netns=ns_arg(d.get("netns")), role=d["role"],
                   job=int(d.get("job", 0)), geometry=Geometry(**d["geometry"]),
                   mode=d["mode"], prog_id=int(d.get("prog_id", 0)),
                   peers={int(w): int(s) for w, s in d.get("peers", {}).items()},
                   loaded_at=float(d.get("loaded_at", 0.0)), pid=int(d.get("pid", 0)),
                   version=int(d.get("version", RECORD_VERSION)))


def read_record(dev: str, ns: str | None) -> Record | None:
    """The record of `dev` in `ns`, None if there is none."""
    path = record_path(dev, ns)
    try:
        with open(path) as f:
            return Record.from_dict(json.load(f))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RegistryError(f"cannot read {path}: {e}; `ltp unload {dev}"
                            f"{' --netns ' + ns if ns else ''}` removes it") from None


def write_record(rec: Record) -> None:
    os.makedirs(os.path.dirname(rec.path), exist_ok=True)
    tmp = f"{rec.path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(rec.to_dict(), f, indent=1)
    os.replace(tmp, rec.path)


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


# --------------------------------------------------------------------------- kernel objects

def _info(fd: int) -> bytes:
    try:
        return clib.obj_info(fd)
    except OSError as e:
        raise RegistryError(f"reading BPF object info: {e.strerror}") from e


def prog_id(fd: int) -> int:
    """Kernel id of the program `fd` (struct bpf_prog_info.id)."""
    return struct.unpack_from("<II", _info(fd))[1]


def map_info(fd: int) -> dict[str, int]:
    """type, id, key_size, value_size, max_entries, flags of the map `fd`."""
    keys = ("type", "id", "key_size", "value_size", "max_entries", "flags")
    return dict(zip(keys, struct.unpack_from("<6I", _info(fd))))


@contextlib.contextmanager
def _pinned(path: str) -> Iterator[int]:
    fd = open_pinned(path)
    try:
        yield fd
    finally:
        os.close(fd)


def pinned_prog_id(directory: str) -> int | None:
    try:
        with _pinned(os.path.join(directory, "prog")) as fd:
            return prog_id(fd)
    except (FileNotFoundError, RegistryError):
        return None


def pinned_maps(directory: str) -> list[str]:
    """Names in MAP_NAMES that are pinned in `directory`."""
    return [n for n in MAP_NAMES if os.path.exists(os.path.join(directory, n))]


def geometry_from_pins(directory: str, port: int = PORT) -> Geometry:
    """The geometry the pinned maps were compiled with (the port is not in any
    map size, so it comes from the caller)."""
    try:
        with _pinned(os.path.join(directory, "ltp_stats")) as fd:
            slots = map_info(fd)["max_entries"]
        with _pinned(os.path.join(directory, "ltp_banks")) as fd:
            banks = map_info(fd)["max_entries"]
        with _pinned(os.path.join(directory, "ltp_mem")) as fd:
            mem = map_info(fd)
    except FileNotFoundError as e:
        raise RegistryError(f"{directory}: maps are not pinned ({e.strerror}); "
                            "`ltp status` shows what is loaded") from None
    return Geometry(slots=slots, max_chunks=mem["max_entries"] // (banks * slots),
                    chunk_bytes=mem["value_size"], banks=banks, port=port)


def xdp_on(dev: str, ns: str | None) -> dict[str, Any] | None:
    """{"prog_id", "mode"} of the XDP program on `dev` in `ns`, None if there
    is none. Raises RegistryError when the namespace or device is missing."""
    from pyroute2 import IPRoute
    if ns and not netns.exists(ns):
        raise RegistryError(f"no network namespace {ns!r} (`ip netns list` shows them)")
    with netns.inside(ns):
        ipr = IPRoute()
    try:
        idx = ipr.link_lookup(ifname=dev)
        if not idx:
            raise RegistryError(f"no device {dev!r} in "
                                f"{'the host namespace' if not ns else 'namespace ' + ns} (`"
                                + (f"ip netns exec {ns} " if ns else "")
                                + "ip -br link` lists them)")
        link = ipr.get_links(idx[0])[0]
    finally:
        ipr.close()
    xdp = link.get_attr("IFLA_XDP")
    if not xdp:
        return None
    pid = xdp.get_attr("IFLA_XDP_PROG_ID")
    if not pid:
        return None
    return {"prog_id": int(pid), "mode": _XDP_ATTACHED.get(xdp.get_attr("IFLA_XDP_ATTACHED"),
                                                           "?")}


# --------------------------------------------------------------------------- load / unload

def load(dev: str, ns: str | None, *, role: str, geometry: Geometry, peers: dict[int, int],
         job: int = 0, mode: str = "native", force: bool = False) -> Record:
    """Compile ltp_xdp, configure job and peers, attach it to `dev` in `ns`,
    pin it and its maps, write the record, and leave it all in place.

    Refuses a device that carries an XDP program (ours or another's) unless
    `force`, which replaces it. On failure nothing new is left behind."""
    from .loader import Dataplane, detach
    if role not in ROLES:
        raise ValueError(f"role must be ps or worker, got {role!r}")
    check_ifname(dev)
    attached = xdp_on(dev, ns)          # also: namespace and device exist
    old = read_record(dev, ns)
    pdir = pin_dir(dev, ns)
    if not force:
        if old is not None or os.path.isdir(pdir):
            what = (f"prog id {old.prog_id}, role {old.role}, job {_job(old.job)}, loaded "
                    f"{_ago(old.loaded_at)}" if old else "pinned, no record")
            raise RegistryError(f"{where(dev, ns)}: an LTP program is loaded already ({what}); "
                                f"`ltp unload {dev}{_nsflag(ns)}` first, or --force replaces it")
        if attached is not None:
            raise RegistryError(f"{where(dev, ns)} carries XDP program id {attached['prog_id']} "
                                f"({attached['mode']}) that `ltp load` did not load; detach it "
                                "(its owner, or `ip link set DEV xdp off`) or --force replaces it")
    dp = Dataplane(geometry, job=job)   # compile before touching the device
    wrote = False
    try:
        dp.maps().set_peers(peers)
        if attached is not None and attached["mode"] in ("native", "skb") \
                and attached["mode"] != mode:
            detach(dev, ns, attached["mode"])   # native and skb cannot be on at once
        if force:
            _unpin(pdir)
        dp.attach(dev, ns, mode, replace=force)
        dp.pin(pdir)
        rec = Record(dev=dev, netns=ns, role=role, job=job, geometry=geometry, mode=mode,
                     prog_id=prog_id(dp.prog_fd), peers=dict(peers), loaded_at=time.time(),
                     pid=os.getpid())
        write_record(rec)
        wrote = True
    except BaseException:
        dp.close()                      # detaches what this call attached
        _unpin(pdir)
        if wrote or force:
            _remove_record(dev, ns)
        raise
    dp.attached = None                  # the program stays attached and pinned
    dp.close()
    return rec


def publish(dp, dev: str, ns: str | None, *, role: str, job: int, mode: str,
            peers: dict[int, int]) -> Record:
    """Pin a running endpoint's program and maps and write its record, so
    `ltp status/flows/top` see it from any process while it runs. The
    endpoint stays the owner: `withdraw` removes both when it closes."""
    pdir = pin_dir(dev, ns)
    _unpin(pdir)
    dp.pin(pdir)
    rec = Record(dev=dev, netns=ns, role=role, job=job, geometry=dp.geometry, mode=mode,
                 prog_id=prog_id(dp.prog_fd), peers=dict(peers), loaded_at=time.time(),
                 pid=os.getpid())
    write_record(rec)
    return rec


def withdraw(dev: str, ns: str | None) -> None:
    """Remove the pins and record `publish` made (the program detaches with its owner)."""
    _unpin(pin_dir(dev, ns))
    _remove_record(dev, ns)


def unload(dev: str, ns: str | None) -> dict[str, Any]:
    """Detach (if the device still carries our program), unpin and remove
    the record of `dev` in `ns`. Works when the namespace is gone too."""
    pdir = pin_dir(dev, ns)
    try:
        rec = read_record(dev, ns)
    except RegistryError:
        rec = None                      # unreadable: remove it all the same
    has_record = os.path.exists(record_path(dev, ns))
    if not has_record and not os.path.isdir(pdir):
        raise RegistryError(f"nothing loaded by `ltp load` on {where(dev, ns)}; "
                            "`ltp status` lists what is")
    ours = {i for i in (pinned_prog_id(pdir), rec.prog_id if rec else None) if i}
    out: dict[str, Any] = {"netns": ns_key(ns), "dev": dev, "prog_id": min(ours) if ours else None,
                           "detached": False, "note": None}
    if ns and not netns.exists(ns):
        out["note"] = f"namespace {ns} is gone; removed what was left"
    else:
        try:
            att = xdp_on(dev, ns)
        except RegistryError as e:
            att, out["note"] = None, f"{e}; removed what was left"
        if att is not None:
            if att["prog_id"] in ours and att["mode"] in ("native", "skb"):
                from .loader import detach
                detach(dev, ns, att["mode"])
                out["detached"] = True
            elif att["prog_id"] not in ours:
                out["note"] = (f"{dev} now carries another XDP program (id {att['prog_id']}); "
                               "left it attached")
    _unpin(pdir)
    _remove_record(dev, ns)
    return out


def unload_all(ns: Any = ...) -> list[dict[str, Any]]:
    """Unload everything `ltp load` left (in namespace `ns` if given, as in `entries`)."""
    return [unload(dev, n) for n, dev in entries(ns)]


def _unpin(directory: str) -> None:
    """Remove a pin folder and, when empty, its namespace folder and the root."""
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(directory)
    _rmdir_empty(os.path.dirname(directory), PIN_ROOT)


def _remove_record(dev: str, ns: str | None) -> None:
    path = record_path(dev, ns)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    _rmdir_empty(os.path.dirname(path), RECORD_ROOT)


def _rmdir_empty(*dirs: str) -> None:
    for d in dirs:
        with contextlib.suppress(OSError):   # not empty, or gone: both fine
            os.rmdir(d)


# --------------------------------------------------------------------------- status

def status(ns: Any = ...) -> list[dict[str, Any]]:
    """One dict per loaded program: the record (if any) and what the kernel
    says now. `state` is ok, detached (device carries no program or another
    one), no netns, no device, no pins, no record or partial (some pins
    missing)."""
    rows = []
    for n, dev in entries(ns):
        pdir = pin_dir(dev, n)
        try:
            rec = read_record(dev, n)
            bad_record = None
        except RegistryError as e:
            rec, bad_record = None, str(e)
        pinned = pinned_maps(pdir)
        pid = pinned_prog_id(pdir)
        row: dict[str, Any] = {"netns": ns_key(n), "dev": dev, "pin_dir": pdir,
                               "maps_pinned": len(pinned), "maps_expected": len(MAP_NAMES),
                               "pinned_prog_id": pid, "attached": None}
        if rec is not None:
            r = rec.to_dict()
            row.update({k: r[k] for k in ("role", "job", "mode", "prog_id", "geometry",
                                          "loaded_at", "loaded_at_iso", "pid")})
            row["workers"] = sorted(rec.peers)
        else:
            row.update({"role": None, "job": None, "mode": None, "prog_id": pid,
                        "geometry": None, "loaded_at": None, "loaded_at_iso": None,
                        "pid": None, "workers": []})
        try:
            row["attached"] = xdp_on(dev, n)
            att_id = row["attached"]["prog_id"] if row["attached"] else None
            if pid is None and not os.path.isdir(pdir):
                state = "no pins"
            elif rec is None:
                state = "no record"
            elif len(pinned) < len(MAP_NAMES) or pid is None:
                state = "partial"     # a pin was removed behind our back
            elif att_id is None or att_id not in (pid, row["prog_id"]):
                state = "detached"
            else:
                state = "ok"
        except RegistryError:
            state = "no netns" if n and not netns.exists(n) else "no device"
        row["state"] = state
        if bad_record:
            row["error"] = bad_record
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- maps

def find(dev: str, ns: str | None) -> Record:
    """The record of `dev` in `ns`, or one rebuilt from its pins; raises
    RegistryError naming what is loaded elsewhere when there is nothing."""
    rec = read_record(dev, ns)
    if rec is not None:
        return rec
    pdir = pin_dir(dev, ns)
    if os.path.isdir(pdir):
        return record_from_pins(dev, ns)
    others = [f"{d} in {ns_key(n)}" for n, d in entries() if d == dev]
    hint = (f"; loaded: {', '.join(others)} (add --netns)" if others
            else "; `ltp status` lists what is loaded")
    raise RegistryError(f"no LTP program loaded on {where(dev, ns)}{hint}")


def record_from_pins(dev: str, ns: str | None) -> Record:
    """A best-effort record for pins whose record is gone: geometry from the
    map sizes, peers from ltp_peers (a scan of 65536 entries), job from ltp_cfg."""
    from .maps import LtpMaps
    pdir = pin_dir(dev, ns)
    g = geometry_from_pins(pdir)
    m = LtpMaps.from_pins(pdir, g)
    try:
        peers = m.peers_of(range(65536))
        job = int(m.cfg.get(0).job)
    finally:
        m.close()
    return Record(dev=dev, netns=ns, role="ps" if g.slots > 1 else "?", job=job, geometry=g,
                  mode="?", prog_id=pinned_prog_id(pdir) or 0, peers=peers)


def open_maps(rec: Record):
    """LtpMaps over the pins of `rec`, after checking the geometry the record
    names against the pinned maps' sizes."""
    from .maps import LtpMaps
    have = geometry_from_pins(rec.pin_dir, rec.geometry.port)
    if have != rec.geometry:
        raise RegistryError(f"{rec.pin_dir}: pinned maps have geometry {have.to_dict()}, the "
                            f"record says {rec.geometry.to_dict()}; `ltp unload {rec.dev}"
                            f"{_nsflag(rec.netns)}` and load again")
    try:
        return LtpMaps.from_pins(rec.pin_dir, rec.geometry)
    except FileNotFoundError as e:
        raise RegistryError(f"{e.strerror} (a map is not pinned); "
                            f"`ltp unload {rec.dev}{_nsflag(rec.netns)}` and load again") from None


# --------------------------------------------------------------------------- helpers

def _nsflag(ns: str | None) -> str:
    return f" --netns {ns}" if ns else ""


def _job(job: int) -> str:
    return "any" if not job else f"{job:#x}"


def _ago(t: float) -> str:
    if not t:
        return "at an unknown time"
    s = max(0.0, time.time() - t)
    if s < 120:
        return f"{s:.0f} s ago"
    if s < 7200:
        return f"{s / 60:.0f} min ago"
    return datetime.datetime.fromtimestamp(t).strftime("at %Y-%m-%d %H:%M")

