# SPDX-License-Identifier: Apache-2.0
"""What `ltp status` reports of each loaded program, and the records of
the endpoints in seats of devices' muxes (registry.py re-exports both):
a row per record and pin folder (records.entries) and one per seat
record (records.seat_entries), each checked against its owner, its pins
and what the kernel says now."""
from __future__ import annotations

import os
from typing import Any

from .. import netns
from ...errors import RegistryError
from . import lookup
from .lookup import open_map_ids, pinned_maps, pinned_prog_id, xdp_on
from .maps import MAP_NAMES
from .mux import PROGRAM as MUX
from .records import (Record, entries, ns_arg, ns_key, owner_alive, pin_dir, read_record,
                      seat_entries)


def status(ns: Any = ...) -> list[dict[str, Any]]:
    """One dict per loaded program: the record (if any) and what the kernel
    says now. `state` is ok, dead (the endpoint that held it exited: its
    program and maps are gone, the record is left), detached (device
    carries no program or another one), no netns, no device, no pins, no
    record or partial (some pins missing). `maps` counts the maps reachable
    (pinned, or by id while the owner lives)."""
    return [_status_row(n, dev) for n, dev in entries(ns)] + \
        [_seat_row(n, dev, port) for n, dev, port in seat_entries(ns)]


def _seat_row(n: str | None, dev: str, port: int) -> dict[str, Any]:
    """A status row of an endpoint in a seat of dev's mux: ok while its
    owner lives, its maps open and the device carries a program (the mux),
    else dead, detached, no netns or no device."""
    try:
        rec, err = read_record(dev, n, port), None
    except RegistryError as e:
        rec, err = None, str(e)
    r = rec.to_dict() if rec is not None else {}
    row: dict[str, Any] = {"netns": ns_key(n), "dev": dev, "seat_port": port,
                           "pin_dir": None, "maps_pinned": 0, "maps_expected": len(MAP_NAMES),
                           "pinned_prog_id": None, "attached": None,
                           "workers": sorted(rec.peers) if rec else [],
                           "owner_alive": owner_alive(rec) if rec else None}
    row.update({k: r.get(k) for k in ("role", "label", "job", "mode", "prog_id", "geometry",
                                      "loaded_at", "loaded_at_iso", "pid", "owner", "link_id")})
    row["maps"] = _maps_by_id(rec) if row["owner_alive"] else 0
    row["state"] = "ok" if row["maps"] == len(MAP_NAMES) else "dead"
    if row["state"] == "ok":          # and the device still carries the mux
        try:
            row["attached"] = xdp_on(dev, n)
        except RegistryError:
            row["state"] = "no netns" if n and not netns.exists(n) else "no device"
        else:     # the mux, not another program
            att = row["attached"]
            row["state"] = "ok" if att and lookup.prog_name(att["prog_id"]) == MUX else \
                "detached"
    if err:
        row["error"] = err
    return row


def seat_records(ns: Any = ..., dev: str | None = None) -> list[Record]:
    """The records of the endpoints in seats of devices' muxes (of `dev`
    alone if given; `ns` as in `entries`), readable ones only."""
    out = []
    for n, d, port in seat_entries(ns, dev):
        try:
            rec = read_record(d, n, port)
        except RegistryError:
            continue
        if rec is not None:
            out.append(rec)
    return out


def _status_row(n: str | None, dev: str) -> dict[str, Any]:
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
                           "maps": len(pinned), "pinned_prog_id": pid, "attached": None,
                           "owner": None, "owner_alive": None}
    if rec is not None:
        r = rec.to_dict()
        row.update({k: r[k] for k in ("role", "label", "job", "mode", "prog_id", "geometry",
                                      "loaded_at", "loaded_at_iso", "pid", "owner", "link_id")})
        row["workers"] = sorted(rec.peers)
        row["owner_alive"] = owner_alive(rec)
    else:
        row.update({"role": None, "label": None, "job": None, "mode": None, "prog_id": pid,
                    "geometry": None, "loaded_at": None, "loaded_at_iso": None,
                    "pid": None, "workers": [], "link_id": None})
    row["state"] = _state(row, rec, pdir, len(pinned))
    if bad_record:
        row["error"] = bad_record
    return row


def _state(row: dict[str, Any], rec: Record | None, pdir: str, npinned: int) -> str:
    """The STATE of a status row (and its `attached` and `maps`)."""
    n, dev, pid = ns_arg(row["netns"]), row["dev"], row["pinned_prog_id"]
    endpoint = rec is not None and not rec.pinned
    if endpoint and not row["owner_alive"]:
        return "dead"
    try:
        row["attached"] = xdp_on(dev, n)
    except RegistryError:
        return "no netns" if n and not netns.exists(n) else "no device"
    att_id = row["attached"]["prog_id"] if row["attached"] else None
    if endpoint:
        row["maps"] = _maps_by_id(rec)
        return "ok" if att_id == rec.prog_id else "detached"
    if pid is None and not os.path.isdir(pdir):
        return "no pins"
    if rec is None:
        return "no record"
    if npinned < len(MAP_NAMES) or pid is None:
        return "partial"                # a pin was removed behind our back
    if att_id is None or att_id not in (pid, row["prog_id"]):
        return "detached"
    return "ok"


def _maps_by_id(rec: Record) -> int:
    """How many of an endpoint's maps its record's ids still open (all or none)."""
    try:
        fds = open_map_ids(rec.map_ids)
    except RegistryError:
        return 0
    for fd in fds.values():
        os.close(fd)
    return len(fds)
