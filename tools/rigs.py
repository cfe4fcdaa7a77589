# SPDX-License-Identifier: Apache-2.0
"""What the `ltp rig` commands share: a rig config from their flags, the
checks before building, finding the rig a command means, the rate format."""
from __future__ import annotations

from typing import Any

from .common import LtpError, UsageError, need_bcc, need_root
from .flags import DEFAULT_RIG, check_bytes, check_loss, check_rate, check_workers
from ..dataplane.rig.star import RigConfig
from ..dataplane.rig.star import Rig

# RigConfig field -> the flag that sets it (flags.add_shape and add_loss)
SHAPE_FLAGS = {"workers": "--workers", "rate_bps": "--rate", "buffer_bytes": "--buffer",
               "burst_bytes": "--burst", "loss": "--loss"}


def shaped(args) -> dict[str, Any]:
    """The checked values of --workers, --rate, --buffer, --burst and --loss,
    by RigConfig field (None: not given)."""
    return {"workers": check_workers(args.workers), "rate_bps": check_rate(args.rate),
            "buffer_bytes": check_bytes(args.buffer, "--buffer"),
            "burst_bytes": check_bytes(args.burst, "--burst"), "loss": check_loss(args.loss)}


def config(cls, **kw: Any):
    """cls(**kw) without the None values (the config's defaults apply); a
    ValueError from it, which names the field first ("rate: ..."), becomes a
    usage error naming the flag."""
    try:
        return cls(**{k: v for k, v in kw.items() if v is not None})
    except ValueError as e:
        field, _, msg = str(e).partition(":")
        raise UsageError(f"--{field.replace('_', '-')}:{msg}") from None


def star_config(**kw: Any):
    return config(RigConfig, **kw)


def prepare(what: str = "ltp rig") -> None:
    """Root and bcc, both needed to build a rig."""
    need_root(what)
    need_bcc()


def choose(name: str | None, names, what: str, none: str, default: str | None = None) -> str:
    """The rig a command means: --name, else the only `what` that is up
    (`names()` lists them), else `default` when that is up. `none` is the
    error when no rig is up."""
    if name:
        return name
    up = names()
    if not up:
        raise LtpError(none)
    if len(up) == 1:
        return up[0]
    if default in up:
        return default
    raise UsageError(f"--name: several {what}s are up ({', '.join(up)}); pick one")


def resolve(name: str | None) -> str:
    """The star rig a command means: --name, else the only rig, else 'default'."""
    return choose(name, Rig.names, "rig", "no rig is up: `sudo ltp rig up` builds one",
                  DEFAULT_RIG)


def attach(name: str | None):
    """The star rig `name` means (see `resolve`), attached; a RigError when it is gone."""
    return Rig.attach(resolve(name))


def fmt_rate(bps: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.4g} {unit}"
    return f"{bps:.0f} bit/s"
