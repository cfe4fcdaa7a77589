# SPDX-License-Identifier: Apache-2.0
"""How an endpoint's pushes leave: the sender and the ACK clock's A/B knobs
(`PushOptions`), and what one push is given besides its round, buffer and
targets (`PushSpec`).

One frozen `PushOptions` per endpoint (`Endpoint(push_options=...)`, or
`Endpoint(sender=...)` for the sender alone) and, for a benchmark taking
turns between arms on one endpoint, one per push
(`Endpoint.push(..., options=...)`). The defaults are what a job runs.

The sender by default is "auto": the ACK clock where this kernel grows an
XDP_TX frame back into DATA (`ltp doctor`'s grow check, asked once per
process and cached per kernel: dataplane/doctor/growcheck.py), else the
paced socket. `choose_sender` makes that choice once per endpoint and says
why; an explicit "socket" or "xdp" is taken as asked.
"""
from __future__ import annotations

import logging
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from ..settings_table import SENDERS

AUTO = "auto"       # the sender chosen by the grow check (choose_sender)
log = logging.getLogger("ltpx.sender")

RTO_RTTS = 2        # the ACK clock's RTO in round trips (at least ackclock.RTO_MIN)
PUSH_TIMEOUT_S = 10.0   # how long a push tries a silent target before DeadPeerError


@dataclass(frozen=True)
class PushOptions:
    """sender: "socket" (every DATA from Python's socket), "xdp" (the ACK
    clock, ackclock.ClockPush) or "auto" (the endpoint's choice: the clock where
    the grow check passes, else the socket; choose_sender); the other fields
    apply to the ACK clock alone.

    xdp_recovery: the XDP program recovers the losses of what it sent (RACK
    over its send log, before new chunks) and Python only those of its own
    socket sends and the RTO; False leaves all recovery to Python (the
    recovery A/B, `ltp bench recovery`).

    poll_s: None polls every ackclock.POLL_S while Python has sends of its own
    outstanding (priming, growth, re-sends) and otherwise sleeps half the
    time the slowest unfinished target needs at its ACK rate so far, at most
    ackclock.NAP_MAX; a number polls at that fixed period
    (`ltp bench incast --transports ltp-xdp:poll=250`).

    rto_rtts: the RTO is this many round trips, at least ackclock.RTO_MIN; 0 is
    ackclock.RTO_MIN whatever the round trip (`ltp-xdp:rto=0`)."""

    sender: str = AUTO
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


DEFAULTS = PushOptions()   # what a job runs: the sender chosen, the clock's knobs as documented


@dataclass(frozen=True)
class SenderChoice:
    """The sender an endpoint's pushes use and why. asked: what was asked
    ("auto" unless the caller named one); why: one line for reports."""

    sender: str
    asked: str
    why: str

    @property
    def fell_back(self) -> bool:
        return self.asked == AUTO and self.sender == "socket"

    def to_dict(self) -> dict:
        return {"sender": self.sender, "asked": self.asked, "why": self.why}


def choose_sender(asked: str, grow: Callable[[], object], where: str = "") -> SenderChoice:
    """The sender for `asked`: "socket" and "xdp" as asked; "auto" the ACK
    clock if `grow()` (a growcheck.Verdict: .ok, .detail, .source) passes,
    else the socket sender, logged as a warning naming `where` and the
    check's words once per process (not again for an answer the process
    already had). grow is called only for "auto"."""
    if asked not in SENDERS:
        raise ValueError(f"sender must be one of {', '.join(SENDERS)}, got {asked!r}")
    if asked != AUTO:
        return SenderChoice(asked, asked, f"{asked}: asked for")
    v = grow()
    seen = {"cache": "cached", "process": "this process's"}.get(getattr(v, "source", ""), "")
    check = f"{seen + ' ' if seen else ''}grow check"
    if v.ok:
        return SenderChoice("xdp", AUTO, f"xdp: the default, the {check} passed ({v.detail})")
    choice = SenderChoice("socket", AUTO, f"socket: the fallback, the {check} failed "
                          f"({v.detail}); `ltp doctor` runs it")
    if getattr(v, "source", "") != "process":
        log.warning("%s: sender %s", where or "endpoint", choice.why)
    return choice


@dataclass(frozen=True, eq=False)
class PushSpec:
    """What one push is given besides its round, buffer and targets, decided
    before it is planned (Endpoint.push and prepare_push take one, or its
    fields as keywords over the defaults; `of`).

    critical: bool per chunk that must reach every target before it may
    close the round (None: none); reliable: every chunk critical;
    timeout_s: how long a silent target is tried (DeadPeerError after);
    seed: the chunk order's (default: from the round and the first target);
    group: (address, port) the first pass goes to once for every target;
    over: a callable, True once the round is over everywhere (the push then
    ends as if every target closed it); options: this push's sender and
    clock knobs (default: the endpoint's)."""

    critical: object = None
    reliable: bool = False
    timeout_s: float = PUSH_TIMEOUT_S
    seed: int | None = None
    group: tuple[str, int] | None = None
    over: Callable[[], bool] | None = None
    options: PushOptions | None = None

    def __post_init__(self):
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s!r}")

    @classmethod
    def of(cls, spec: PushSpec | None, **fields) -> PushSpec:
        """spec (default: every default) with `fields` set over it, checked."""
        base = spec if spec is not None else cls()
        return dataclasses.replace(base, **fields) if fields else base
