# SPDX-License-Identifier: Apache-2.0
"""An endpoint made in another's place (`Endpoint(..., succeeds=old)`).

A worker whose answers outgrow its endpoint's room makes a larger one. Made
after the old one closed, the device went without a program for as long as
the new one took to load: 70-150 ms with a warm compile cache on a 2-core
VM, the compile's seconds with a cold one (scripts/remake_gap.py). Frames meanwhile met
no program: a server's re-sends of an answer's tail went unheard, and its
push could take a live worker for dead. A successor instead loads its
program beside the old one and then takes the old one's place in one
update: a device it owns by BPF_LINK_UPDATE of the old link
(`Dataplane.take_over`), a seat of the device's mux by writing its program
into the seat (`Seat.swap`). Either way every frame runs one of the two
programs. The socket, bound to the port, passes to the successor too.
"""
from __future__ import annotations


def check(old, dev: str, ns: str | None, port: int, shared: bool) -> None:
    """`old` (an Endpoint) can be succeeded by an endpoint of (dev, ns, port, shared): the
    same four, and old still holding the device or seat (ValueError)."""
    if old.sock is None or (old.seat is None and old.dp.attached is None):
        raise ValueError("succeeds: that endpoint holds no device (closed, or succeeded)")
    if (old.dev, old.ns, old.port, old.seat is not None) != (dev, ns, port, shared):
        raise ValueError(f"succeeds: that endpoint is on {old.dev} (ns {old.ns}, port "
                         f"{old.port}, shared {old.seat is not None}), not {dev} (ns {ns}, "
                         f"port {port}, shared {shared})")


def take_place(new, old) -> None:
    """`old`'s seat or device becomes `new`'s program's in one update, and
    old's socket new's (old closes nothing of them after)."""
    if old.seat is not None:
        old.seat.swap(new.dp.prog_fd)
        new.seat, old.seat = old.seat, None
    else:
        new.dp.take_over(old.dp)
    old.sock = None
