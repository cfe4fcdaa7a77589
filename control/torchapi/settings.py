# SPDX-License-Identifier: Apache-2.0
"""`lt.init()`'s settings: each from its keyword, else its environment variable
(what `ltp launch` sets, and what a torchrun user may export), else a default.

`Settings` is generated from the settings table (control/settings_table.py):
one field per init() option (the table's OPTIONS: every setting but the
internal ones), its default the table's; `resolve` and `check` read
the table's types, bounds and variables. `node_seat` gives a node's several
ranks over LTP (torchrun --nproc-per-node) seats of its one device. Importing
this module needs neither torch nor numpy.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import field, make_dataclass

from ...errors import UsageError
from ..settings_table import MAX_SERVERS, OPTIONS, TABLE, read

__all__ = ["ENV", "MAX_SERVERS", "Settings", "node_seat"]

# keyword -> environment variable
ENV = {s.name: s.env for s in OPTIONS.values()}


def _resolve(cls, options: dict, environ=None):
    """Keywords over environment (`environ`, default os.environ) over defaults;
    UsageError for an unknown or bad one, naming it and where it came from."""
    environ = os.environ if environ is None else environ
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise UsageError(f"init(): unknown option {unknown[0]!r} (options: "
                         f"{', '.join(OPTIONS)})")
    values = {}
    for name, s in OPTIONS.items():
        if options.get(name) is not None:
            values[name] = read(name, options[name], f"init({name}=...)")
        elif environ.get(s.env):
            values[name] = read(name, environ[s.env], s.env)
    settings = cls(**values)
    settings.check()
    return settings


def _check(self) -> None:
    """UsageError naming the first setting out of its bounds."""
    for name, s in OPTIONS.items():
        why = s.problem(getattr(self, name))
        if why:
            raise UsageError(f"init(): {name} {why} (keyword {name}=, or {s.env})")


Settings = make_dataclass(
    "Settings",
    [(s.name, s.type if s.default is not None else s.type | None, field(default=s.default))
     for s in OPTIONS.values()],
    frozen=True,
    namespace={"resolve": classmethod(_resolve), "check": _check,
               "__doc__": "Where and how this rank talks (docs/training.md, \"ltpx.torch\"; "
                          "control/settings_table.py says what each field means)."})
Settings.__module__ = __name__


def _local(environ, name: str, default: int) -> int:
    raw = environ.get(name) or ""
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"init(): {name}={raw!r} is not a whole number (torchrun sets it: "
                         "the ranks on this node, and this one's place among them)") from None
    if value < 0:
        raise UsageError(f"init(): {name}={raw!r} is negative")
    return value


def node_seat(s, options: dict, environ=None):
    """`s` for one of several ranks on one node over LTP (torchrun
    --nproc-per-node R sets LOCAL_WORLD_SIZE=R and LOCAL_RANK): R ranks
    cannot each own the node's device, so unless share_dev or udp_port is
    given (keyword or variable), each takes a seat of it on a port of its
    own, udp_port's default + 1 + LOCAL_RANK (7411, 7412, ...; a co-located
    trainer's server 1000 above), as `ltp launch --share-nic` gives them
    (docs/deploy.md, "Several ranks on one NIC"). A rank given a device of
    its own sets LTP_SHARE_DEV=0."""
    environ = os.environ if environ is None else environ
    if s.transport != "ltp":
        return s
    if any(options.get(n) is not None or environ.get(ENV[n]) for n in ("share_dev", "udp_port")):
        return s
    ranks, rank = _local(environ, "LOCAL_WORLD_SIZE", 1), _local(environ, "LOCAL_RANK", 0)
    if ranks <= 1:
        return s
    if rank >= ranks:
        raise UsageError(f"init(): LOCAL_RANK={rank} with LOCAL_WORLD_SIZE={ranks}: a node's "
                         "ranks are 0..LOCAL_WORLD_SIZE-1")
    return dataclasses.replace(s, share_dev=True, udp_port=TABLE["udp_port"].default + 1 + rank)
