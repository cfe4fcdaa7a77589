# SPDX-License-Identifier: Apache-2.0
"""Removing a rig, complete or half-built: what LTP programs left in its
namespaces (records, and the pins of programs `ltp load` loaded there), its
namespaces (their veths, qdiscs, tc filters and XDP programs go with them),
its pins and its state file. Removal goes on past errors and reports them
all at the end, so one stuck piece never leaves the rest behind."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

from .. import netns
from . import leafspine_plan, netlink, star_plan
from ...errors import RigError
from ..xdp import registry


def remove_all(namespaces: Sequence[str], pins: str, state: str) -> list[str]:
    """Remove the LTP records and pins of the namespaces, the namespaces,
    every pin in the folder `pins`, and the state file; go on past errors
    and return them."""
    errors: list[str] = []
    for ns in namespaces:
        # A pinned program (`ltp load`) outlives its namespace until unpinned;
        # an endpoint killed there left only its record.
        errors += registry.clear_namespace(ns)
    for ns in namespaces:
        try:
            netns.remove(ns)
        except Exception as e:  # noqa: BLE001
            errors.append(f"namespace {ns}: {e}")
    if os.path.isdir(pins):
        for f in os.listdir(pins):
            try:
                os.unlink(os.path.join(pins, f))
            except OSError as e:
                errors.append(f"unpin {pins}/{f}: {e}")
        with contextlib.suppress(OSError):
            os.rmdir(pins)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(state)
    return errors


def remove_links(ns: str) -> list[str]:
    """Delete every link but lo in namespace `ns` (deleting a veth end
    deletes its peer, and the qdiscs, tc filters and XDP programs on both)
    at once, even while another process keeps the namespace alive."""
    try:
        with netlink.iproute(ns) as ipr:
            for link in ipr.get_links():
                if link.get_attr("IFLA_IFNAME") != "lo":
                    with contextlib.suppress(Exception):
                        ipr.link("del", index=link["index"])
    except Exception as e:  # noqa: BLE001
        return [f"links in {ns}: {e}"]
    return []


def remove_star(name: str, known_ns: Sequence[str] = ()) -> None:
    """Remove everything star rig `name` may have: the links of its switch
    namespace first, then its namespaces (`known_ns`, those that look like
    its own, and, when it surely existed, any ltp-<name>-*), pins and state."""
    sw = star_plan.switch_ns(name)
    errors = remove_links(sw) if netns.exists(sw) else []
    spaces = set(known_ns) | set(star_plan.namespaces_by_rig().get(name, []))
    if sw in known_ns or os.path.exists(star_plan.state_path(name)):
        spaces |= {ns for ns in netns.listnetns()
                   if (m := star_plan.NS_RE.match(ns)) and m.group(1) == name}
    errors += remove_all(sorted(spaces, key=lambda s: s != sw), star_plan.pin_dir(name),
                         star_plan.state_path(name))
    if errors:
        raise RigError(f"tearing down rig {name!r}: " + "; ".join(errors))


def remove_leafspine(name: str) -> None:
    """Remove leaf-spine rig `name` (its namespaces are found by their names)."""
    errors = remove_all(leafspine_plan.find_namespaces(name), leafspine_plan.pin_dir(name),
                        leafspine_plan.state_path(name))
    if errors:
        raise RigError(f"tearing down leaf-spine rig {name!r}: " + "; ".join(errors))
