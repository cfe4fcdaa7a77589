# SPDX-License-Identifier: Apache-2.0
"""What is attached where on this machine: loaded ltp_xdp programs, their
owners, records and pins.

A program has one of two owners (records.py has the files, lookup.py the
kernel's side):

- `ltp load`, the operator's explicit choice: the program stays attached,
  its BPF link, program and maps pinned under
  /sys/fs/bpf/ltp/<netns or "host">/<dev>/, until `ltp unload`;
- an endpoint process (`publish`): nothing is pinned, so attachment and maps
  die with the process; its record names the process and the kernel ids,
  and readers open the maps by id while it lives. A record whose owner died
  is `dead` in `status`; `unload` (or the rig's teardown) removes it.

Either way /run/ltp/xdp/<netns or "host">/<dev>.json describes it: role,
job, geometry, mode, ids, peers, time, owner; an endpoint in a seat of a
device's mux (mux.py) has <dev>.seats/<port>.json, listed with the rest.
This module is the mechanism
behind `ltp load/unload/status/flows`: it loads, publishes, unloads and
reports, checking records against pins, owners and the kernel. Callers use
this module alone: it re-exports the names they need from both. Policy
(which ids, which job) comes from the caller.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import time
from typing import Any

from .. import clib, netns
from ...errors import RegistryError
from .maps import Geometry
# The names callers had from this module before the split (re-exported on purpose).
from .lookup import (describe, geometry_from_fds, geometry_from_pins, link_info,  # noqa: F401
                     map_info, open_map_ids, pinned_maps, pinned_prog_id, prog_id, xdp_on)
from .records import (HOST, PIN_ROOT, RECORD_ROOT, Record, check_ifname, entries,  # noqa: F401
                      ns_arg, ns_key, nsflag, owner_alive, owner_text, pin_dir, process_start,
                      read_record, record_path, remove_record, seat_entries, unpin, where,
                      write_record)
from .loader import Dataplane
from .status import seat_records, status  # noqa: F401 (re-exported, as above)
from .mux import LOCK_SUFFIX
from .loader import detach, detach_link_id
from .maps import LtpMaps

ROLES = ("ps", "worker")
LOAD_FIX = "--force replaces it"


# --------------------------------------------------------------------------- load / unload

def load(dev: str, ns: str | None, *, role: str, geometry: Geometry, peers: dict[int, int],
         job: int = 0, mode: str = "native", force: bool = False) -> Record:
    """Compile ltp_xdp, configure job and peers, attach it to `dev` in `ns`
    through a BPF link, pin link, program and maps, write the record, and
    leave it all in place.

    Refuses a device that carries an XDP program (ours, an endpoint's or
    another's) unless `force`, which replaces it. On failure nothing new is
    left behind."""
    if role not in ROLES:
        raise ValueError(f"role must be ps or worker, got {role!r}")
    check_ifname(dev)
    if force:
        xdp_on(dev, ns)                 # the namespace and device exist
    else:
        check_free(dev, ns, fix=LOAD_FIX)
    pdir = pin_dir(dev, ns)
    dp = Dataplane(geometry, job=job)   # compile before touching the device
    wrote = False
    try:
        dp.maps().set_peers(peers)
        dp.attach(dev, ns, mode, force=force, fix=LOAD_FIX)
        unpin(pdir)                     # a replaced program's pins (force)
        rec = _pin_and_record(dp, dev, ns, role=role, job=job, mode=mode, peers=peers)
        wrote = True
    except BaseException:
        dp.close()                      # detaches what this call attached
        unpin(pdir)
        if wrote or force:
            remove_record(dev, ns)
        raise
    dp.leave_attached()                 # the pinned link keeps it attached
    dp.close()
    return rec


def check_free(dev: str, ns: str | None, *, fix: str) -> None:
    """Raise RegistryError if `dev` in `ns` carries a program, naming it (an
    endpoint by its process, `ltp load`'s by its record, any other by its
    id and name) and the way out: stop or unload it, or `fix`. A record
    whose owner died does not count. Also raises when the namespace or the
    device is missing."""
    rec = read_record(dev, ns)
    if rec is not None and owner_alive(rec) is False:
        rec = None                      # dead: its program went with its owner
    if rec is not None and not rec.pinned:
        raise RegistryError(f"{where(dev, ns)} is taken by an LTP endpoint, "
                            f"{owner_text(rec)} ({_about(rec)}); stop that process (its "
                            f"program goes with it) or {fix}")
    if rec is not None or os.path.isdir(pin_dir(dev, ns)):
        what = _about(rec) if rec else "pinned, no record"
        raise RegistryError(f"{where(dev, ns)}: an LTP program is loaded already ({what}); "
                            f"`ltp unload {dev}{nsflag(ns)}` first, or {fix}")
    att = xdp_on(dev, ns)
    if att is not None:
        raise RegistryError(f"{where(dev, ns)} carries {describe(att)}, not loaded by LTP; "
                            "detach it (its owner, or `ip link set DEV xdp off`) or " + fix)


def publish(dp, dev: str, ns: str | None, *, role: str, job: int, mode: str,
            peers: dict[int, int], sender: str = "", sender_why: str = "",
            seat_link: int = 0, label: str = "") -> Record:
    """Write the record of a running endpoint's program (attached by `dp`
    through a link this process holds), so `ltp status/flows/top` see it
    from any process while it runs. Nothing is pinned: program, link and
    maps die with this process. `withdraw` removes the record when the
    endpoint closes; after a crash `status` shows it `dead`. sender,
    sender_why: which sender the endpoint's pushes use and why (`ltp flows`).
    seat_link: the id of the mux's link, for an endpoint in a seat of it
    (its record is the seat's, on its port). label: what the endpoint
    serves (EndpointConfig.label), shown beside its role."""
    me = os.getpid()
    rec = Record(dev=dev, netns=ns, role=role, job=job, geometry=dp.geometry, mode=mode,
                 prog_id=prog_id(dp.prog_fd), peers=dict(peers), loaded_at=time.time(),
                 pid=me, pinned=False, pid_start=process_start(me) or 0,
                 link_id=seat_link or dp.link_id(), map_ids=dp.map_ids(), sender=sender,
                 sender_why=sender_why, seat=bool(seat_link), label=label)
    if not seat_link:
        unpin(pin_dir(dev, ns))         # pins of a program this endpoint replaced (force)
    write_record(rec)
    return rec


def _pin_and_record(dp, dev: str, ns: str | None, *, role: str, job: int, mode: str,
                    peers: dict[int, int]) -> Record:
    """Pin `dp`'s link, program and maps for `dev` in `ns` and write their record."""
    dp.pin(pin_dir(dev, ns))
    rec = Record(dev=dev, netns=ns, role=role, job=job, geometry=dp.geometry, mode=mode,
                 prog_id=prog_id(dp.prog_fd), peers=dict(peers), loaded_at=time.time(),
                 pid=os.getpid(), pinned=True, link_id=dp.link_id(), map_ids=dp.map_ids())
    write_record(rec)
    return rec


def withdraw(published: Record) -> None:
    """Remove the record `publish` returned, if it is still the device's
    (the program detaches with its link); a record another endpoint wrote
    since (one that took the device with force) stays."""
    try:
        rec = read_record(published.dev, published.netns, published.port)
    except RegistryError:
        return
    if rec is not None and not rec.pinned and (rec.pid, rec.prog_id) == (published.pid,
                                                                      published.prog_id):
        remove_record(published.dev, published.netns, published.port)


def unload(dev: str, ns: str | None) -> dict[str, Any]:
    """Detach (if the device still carries our program), unpin and remove
    the record of `dev` in `ns`; works when the namespace is gone too. An
    endpoint's record is removed only when its owner died: a live endpoint
    is refused (it detaches when its process exits)."""
    pdir = pin_dir(dev, ns)
    try:
        rec = read_record(dev, ns)
    except RegistryError:
        rec = None                      # unreadable: remove it all the same
    has_record = os.path.exists(record_path(dev, ns))
    if not has_record and not os.path.isdir(pdir):
        if seat_entries(ns, dev):
            return _forget_seats(dev, ns)
        raise RegistryError(f"nothing loaded by `ltp load` on {where(dev, ns)}; "
                            "`ltp status` lists what is")
    if rec is not None and not rec.pinned:
        return _forget_endpoint(rec)
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
            if att["prog_id"] in ours:
                out["detached"] = _detach_ours(dev, ns, pdir, att["mode"])
            else:
                out["note"] = (f"{dev} now carries another XDP program (id {att['prog_id']}); "
                               "left it attached")
    unpin(pdir)
    remove_record(dev, ns)
    return out


def _forget_seats(dev: str, ns: str | None) -> dict[str, Any]:
    """`unload` of a device shared through its mux: the records of the seats
    whose holders died are removed; refused when every holder lives."""
    rows = _seat_rows_removed(seat_entries(ns, dev))
    live = ", ".join(str(r["seat_port"]) for r in rows if r.get("skipped"))
    gone = [r for r in rows if not r.get("skipped")]
    if live and not gone:
        raise RegistryError(f"{where(dev, ns)} is shared by running LTP endpoints (seats of "
                            f"its mux on ports {live}): each leaves its seat when its "
                            "process exits")
    return {"netns": ns_key(ns), "dev": dev, "prog_id": None, "detached": False,
            "seats": len(gone),
            "note": f"removed the records of {len(gone)} seat(s) whose holders had died"
                    + (f"; left those of running endpoints (ports {live})" if live else "")}


def _seat_rows_removed(seats: list[tuple[str | None, str, int]]) -> list[dict[str, Any]]:
    """Remove the records of these seats whose holders died; a row each,
    `skipped` for one a running endpoint holds."""
    out = []
    for n, dev, port in seats:
        try:
            rec = read_record(dev, n, port)
        except RegistryError:
            rec = None
        row = {"netns": ns_key(n), "dev": dev, "seat_port": port, "detached": False,
               "prog_id": rec.prog_id if rec else None}
        if rec is not None and owner_alive(rec):
            out.append({**row, "skipped": True, "note": "a seat held by a running endpoint, "
                        f"{owner_text(rec)}; left alone"})
            continue
        remove_record(dev, n, port)
        out.append({**row, "note": "its owner had died (its seat goes at the next take or "
                    "leave on the device); removed the record"})
    return out


def _forget_endpoint(rec: Record) -> dict[str, Any]:
    """`unload` of an endpoint's record: removed if its owner died."""
    dev, ns = rec.dev, rec.netns
    if owner_alive(rec):
        raise RegistryError(f"{where(dev, ns)} is held by a running LTP endpoint, "
                            f"{owner_text(rec)}: its program detaches when that process "
                            "exits; `ltp unload` removes only what `ltp load` left and dead "
                            "owners' records")
    unpin(pin_dir(dev, ns))
    remove_record(dev, ns)
    return {"netns": ns_key(ns), "dev": dev, "prog_id": rec.prog_id, "detached": False,
            "note": f"its owner (pid {rec.pid}) had died, and its program with it; "
                    "removed the record"}


def _detach_ours(dev: str, ns: str | None, pdir: str, mode: str) -> bool:
    """Detach `ltp load`'s program: through its pinned link, or over netlink
    (what older versions attached)."""
    link = os.path.join(pdir, "link")
    if os.path.exists(link):
        try:
            fd = clib.obj_get(link)
        except OSError:
            return False
        try:
            return detach_link_id(link_info(fd)["id"])
        finally:
            os.close(fd)
    if mode in ("native", "skb"):
        detach(dev, ns, mode)
        return True
    return False


def unload_all(ns: Any = ...) -> list[dict[str, Any]]:
    """Unload everything `ltp load` left, and dead owners' records (in
    namespace `ns` if given, as in `entries`); live endpoints are listed as
    skipped."""
    out = []
    for n, dev in entries(ns):
        try:
            rec = read_record(dev, n)
        except RegistryError:
            rec = None
        if rec is not None and owner_alive(rec):
            out.append({"netns": ns_key(n), "dev": dev, "prog_id": rec.prog_id,
                        "detached": False, "skipped": True,
                        "note": f"held by a running endpoint, {owner_text(rec)}; left alone"})
            continue
        out.append(unload(dev, n))
    return out + _seat_rows_removed(seat_entries(ns))


def clear_namespace(ns: str) -> list[str]:
    """Remove every record and pin of namespace `ns`, whoever owns them (the
    rig that made `ns` removes it): pinned links are detached, pins removed
    (programs and maps are freed once no process holds them), records
    removed. Goes on past errors and returns them."""
    errors = []
    for n, dev in entries(ns):
        pdir = pin_dir(dev, n)
        try:
            if os.path.exists(os.path.join(pdir, "link")):
                _detach_ours(dev, n, pdir, "?")
            unpin(pdir)
            remove_record(dev, n)
        except Exception as e:  # noqa: BLE001
            errors.append(f"LTP program on {where(dev, n)}: {e}")
    for n, dev, port in seat_entries(ns):
        remove_record(dev, n, port)
    _remove_locks(ns)
    return errors


def _remove_locks(ns: str) -> None:
    """The muxes' lock files of namespace `ns` (its rig removes it: nobody
    holds them), and the namespace's folder once empty."""
    folder = os.path.join(RECORD_ROOT, ns_key(ns))
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if name.endswith(LOCK_SUFFIX):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
    with contextlib.suppress(OSError):
        os.rmdir(folder)
        os.rmdir(RECORD_ROOT)


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
    """LtpMaps over the maps of `rec`: its pins (`ltp load`), or its map ids
    while its owner lives (an endpoint), after checking the geometry the
    record names against the maps' sizes."""
    if not rec.pinned:
        fds = _endpoint_map_fds(rec)
        try:
            _check_geometry(rec, geometry_from_fds(fds, rec.geometry.port))
            return LtpMaps(fds, rec.geometry, owns_fds=True)
        except BaseException:
            for fd in fds.values():
                os.close(fd)
            raise
    _check_geometry(rec, geometry_from_pins(rec.pin_dir, rec.geometry.port))
    try:
        return LtpMaps.from_pins(rec.pin_dir, rec.geometry)
    except FileNotFoundError as e:
        raise RegistryError(f"{e.strerror} (a map is not pinned); "
                            f"`ltp unload {rec.dev}{nsflag(rec.netns)}` and load again") from None


def _endpoint_map_fds(rec: Record) -> dict[str, int]:
    gone = (f"; `ltp unload {rec.dev}{nsflag(rec.netns)}` removes the record")
    if not owner_alive(rec):
        raise RegistryError(f"{where(rec.dev, rec.netns)}: its endpoint (pid {rec.pid}) died, "
                            f"and its program and maps with it{gone}")
    try:
        return open_map_ids(rec.map_ids)
    except RegistryError as e:
        raise RegistryError(f"{where(rec.dev, rec.netns)}: {e} (its endpoint, pid {rec.pid}, "
                            "is closing?)") from None


def _check_geometry(rec: Record, have: Geometry) -> None:
    # the maps' sizes show all but the bank stride (a sharded server's): the record's holds
    if dataclasses.replace(have, stride=rec.geometry.stride) != rec.geometry:
        what = rec.pin_dir if rec.pinned else where(rec.dev, rec.netns)
        raise RegistryError(f"{what}: the maps have geometry {have.to_dict()}, the record "
                            f"says {rec.geometry.to_dict()}; `ltp unload {rec.dev}"
                            f"{nsflag(rec.netns)}` and load again")


# --------------------------------------------------------------------------- helpers

def _about(rec: Record) -> str:
    return (f"prog id {rec.prog_id}, role {rec.role}, job {_job(rec.job)}, loaded "
            f"{_ago(rec.loaded_at)}")


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
