# SPDX-License-Identifier: Apache-2.0
"""What the operator commands (load, unload, status in cmd_ops.py; flows, top
in cmd_flows.py; capture in cmd_capture.py) share: their parser style, the
OSError guard, the checks of DEV and --netns, and the job format."""
from __future__ import annotations

import argparse
import functools

from ..errors import RegistryError
from .common import LtpError, UsageError, add_command
from ..dataplane import netns


def add_parser(sub, name: str, help: str, epilog: str) -> argparse.ArgumentParser:
    """An operator command: its help line is also its description."""
    return add_command(sub, name, help, description=help[0].upper() + help[1:] + ".",
                       epilog=epilog)


def guard(func):
    """Run a command; an OSError from a map or socket becomes one line (exit 1)."""

    @functools.wraps(func)
    def run(args):
        try:
            return func(args)
        except (LtpError, PermissionError):
            raise
        except OSError as e:
            raise LtpError(f"{args.command}: {e.strerror or e}"
                           + (f" ({e.filename})" if getattr(e, "filename", None) else "")) from None
    return run


def registry():
    """dataplane.xdp.registry, imported when a command runs (not at `ltp -h`)."""
    from ..dataplane.xdp import registry  # noqa: PLC0415 (the ltp command's start)
    return registry


def check_dev(dev: str | None, flag: str = "DEV") -> str | None:
    if dev is None:
        return None
    try:
        registry().check_ifname(dev)
    except ValueError as e:
        raise UsageError(f"{flag}: {e}") from None
    return dev


def netns_arg(text: str | None) -> str | None:
    """--netns value -> namespace (None: the host's own)."""
    if text is not None and ("/" in text or not text.strip() or text in (".", "..")):
        raise UsageError(f"--netns: {text!r} is not a namespace name (`ip netns list`)")
    return registry().ns_arg(text)


def ns_filter(text: str | None):
    """--netns for listing commands: ... (all) when not given."""
    return ... if text is None else netns_arg(text)


def listed_ns(text: str | None):
    """ns_filter, but a namespace that neither exists nor holds anything
    `ltp load` left is an error (exit 1), as it is for a command with DEV:
    a typo must not read as "nothing loaded". A gone namespace that still
    has records stays listable (`ltp status` shows them as "no netns")."""
    ns = ns_filter(text)
    if ns not in (..., None) and not netns.exists(ns) and not registry().entries(ns) and \
            not registry().seat_entries(ns):
        raise RegistryError(f"no network namespace {ns!r} (`ip netns list` shows them)")
    return ns


def dev_text(row: dict) -> str:
    """A row's device, `DEV:PORT` for a rank in a seat of the device's mux
    (as the exporter's `dev` label, metrics.dev_label)."""
    return f"{row['dev']}:{row['seat_port']}" if row.get("seat_port") else row["dev"]


def job_text(job: int | None) -> str:
    return "-" if job is None else ("any" if not job else f"{job:#x}")


def role_text(row: dict) -> str:
    """A program's role, with the rank it serves where its record says
    (`worker (rank 5)`): `ltp status`'s ROLE, `ltp flows`' heading."""
    return (row["role"] or "-") + (f" ({row['label']})" if row.get("label") else "")
