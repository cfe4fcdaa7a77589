# SPDX-License-Identifier: Apache-2.0
"""How an endpoint's pushes leave: the sender and the ACK clock's A/B knobs.

One frozen `PushOptions` per endpoint (`Endpoint(push_options=...)`, or
`Endpoint(sender=...)` for the sender alone) and, for a benchmark taking
turns between arms on one endpoint, one per push
(`Endpoint.push(..., options=...)`). The defaults are what a job runs.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..settings_table import SENDERS

RTO_RTTS = 2        # the ACK clock's RTO in round trips (at least clock.RTO_MIN)


@dataclass(frozen=True)
class PushOptions:
    """sender: "socket" (every DATA from Python's socket) or "xdp" (the ACK
    clock, clock.ClockPush); the other fields apply to the ACK clock alone.

    xdp_recovery: the XDP program recovers the losses of what it sent (RACK
    over its send log, before new chunks) and Python only those of its own
    socket sends and the RTO; False leaves all recovery to Python (the
    recovery A/B, `ltp bench recovery`).

    poll_s: None polls every clock.POLL_S while Python has sends of its own
    outstanding (priming, growth, re-sends) and otherwise sleeps half the
    time the slowest unfinished target needs at its ACK rate so far, at most
    clock.NAP_MAX; a number polls at that fixed period
    (`ltp bench incast --transports ltp-xdp:poll=250`).

    rto_rtts: the RTO is this many round trips, at least clock.RTO_MIN; 0 is
    clock.RTO_MIN whatever the round trip (`ltp-xdp:rto=0`)."""

    sender: str = "socket"
    xdp_recovery: bool = True
    poll_s: float | None = None
    rto_rtts: int = RTO_RTTS

    def __post_init__(self) -> None:
        if self.sender not in SENDERS:
            raise ValueError(f"sender must be one of {', '.join(SENDERS)}, got {self.sender!r}")
        if self.poll_s is not None and not self.poll_s > 0:
            raise ValueError(f"poll_s must be > 0 seconds or None, got {self.poll_s!r}")
        if self.rto_rtts < 0:
            raise ValueError(f"rto_rtts must be >= 0 round trips, got {self.rto_rtts!r}")


DEFAULTS = PushOptions()   # what a job runs: the socket sender, the clock's knobs as documented
