# SPDX-License-Identifier: Apache-2.0
"""`lt.init()`'s settings: each from its keyword, else its environment variable
(what `ltp launch` sets, and what a torchrun user may export), else a default.

`Settings` is generated from the settings table (control/settings_table.py):
one field per init() option (the table's OPTIONS: every setting but the
internal ones), its default the table's; `resolve` and `check` read
the table's types, bounds and variables. Importing this module needs neither
torch nor numpy.
"""
from __future__ import annotations

import os
from dataclasses import field, make_dataclass

from ...errors import UsageError
from ..settings_table import MAX_SERVERS, OPTIONS, read

__all__ = ["ENV", "MAX_SERVERS", "Settings"]

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
