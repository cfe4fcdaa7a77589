"""What `ltp load` left on this machine: attached programs, their pins and records.

A loaded ltp_xdp program lives in three places:

- attached to a device (the kernel keeps it there after the loader exits);
- pinned, program and every map, under /sys/fs/bpf/ltp/<netns or "host">/<dev>/,
  so any process can open the maps (`open_maps`) while training runs;
- described in /run/ltp/xdp/<netns or "host">/<dev>.json: role, job, geometry,
  mode, program id, peers, time.

This module is the mechanism behind `ltp load/unload/status/flows`: it loads,
publishes, unloads and reports, checking records against pins and the kernel.
The files themselves are records.py's; the kernel lookups are lookup.py's.
Callers use this module alone: it re-exports the names they need from both.
Policy (which ids, which job) comes from the caller.
"""
from __future__ import annotations

import datetime
import os
import time
from typing import Any

from .. import netns
from ...errors import RegistryError
from .maps import MAP_NAMES, Geometry
# The names callers had from this module before the split (re-exported on purpose).
from .lookup import (geometry_from_pins, map_info, pinned_maps, pinned_prog_id,  # noqa: F401
                     prog_id, xdp_on)
from .records import (HOST, PIN_ROOT, RECORD_ROOT, Record, check_ifname, entries,  # noqa: F401
                      ns_arg, ns_key, nsflag, pin_dir, read_record, record_path,
                      remove_record, unpin, where, write_record)

ROLES = ("ps", "worker")


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
                                f"`ltp unload {dev}{nsflag(ns)}` first, or --force replaces it")
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
            unpin(pdir)
        dp.attach(dev, ns, mode, replace=force)
        rec = _pin_and_record(dp, dev, ns, role=role, job=job, mode=mode, peers=peers)
        wrote = True
    except BaseException:
        dp.close()                      # detaches what this call attached
        unpin(pdir)
        if wrote or force:
            remove_record(dev, ns)
        raise
    dp.attached = None                  # the program stays attached and pinned
    dp.close()
    return rec


def publish(dp, dev: str, ns: str | None, *, role: str, job: int, mode: str,
            peers: dict[int, int]) -> Record:
    """Pin a running endpoint's program and maps and write its record, so
    `ltp status/flows/top` see it from any process while it runs. The
    endpoint stays the owner: `withdraw` removes both when it closes."""
    unpin(pin_dir(dev, ns))
    return _pin_and_record(dp, dev, ns, role=role, job=job, mode=mode, peers=peers)


def _pin_and_record(dp, dev: str, ns: str | None, *, role: str, job: int, mode: str,
                    peers: dict[int, int]) -> Record:
    """Pin `dp`'s program and maps for `dev` in `ns` and write their record."""
    dp.pin(pin_dir(dev, ns))
    rec = Record(dev=dev, netns=ns, role=role, job=job, geometry=dp.geometry, mode=mode,
                 prog_id=prog_id(dp.prog_fd), peers=dict(peers), loaded_at=time.time(),
                 pid=os.getpid())
    write_record(rec)
    return rec


def withdraw(dev: str, ns: str | None) -> None:
    """Remove the pins and record `publish` made (the program detaches with its owner)."""
    unpin(pin_dir(dev, ns))
    remove_record(dev, ns)


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
    unpin(pdir)
    remove_record(dev, ns)
    return out


def unload_all(ns: Any = ...) -> list[dict[str, Any]]:
    """Unload everything `ltp load` left (in namespace `ns` if given, as in `entries`)."""
    return [unload(dev, n) for n, dev in entries(ns)]


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
                            f"{nsflag(rec.netns)}` and load again")
    try:
        return LtpMaps.from_pins(rec.pin_dir, rec.geometry)
    except FileNotFoundError as e:
        raise RegistryError(f"{e.strerror} (a map is not pinned); "
                            f"`ltp unload {rec.dev}{nsflag(rec.netns)}` and load again") from None


# --------------------------------------------------------------------------- helpers

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

