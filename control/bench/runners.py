# SPDX-License-Identifier: Apache-2.0
"""The transports of `ltp bench incast`, one runner each (`make_runners`).

A runner runs a block of counted rounds (after its warm-up rounds) and
returns them as `Rounds`. TCP's agents start anew for each block. Every LTP
variant of a run shares one `LtpCluster` (the PS endpoint and one process per
worker stay up across blocks, round numbers go on): only one XDP program can
hold a device, so two senders A/B'd in one rig take turns on the same
endpoints. A variant names

- its sender: "socket" (the paced socket) or "xdp" (the ACK clock): each
  worker plans that block's pushes with it (worker_proc's `prepare`);
- its Early Close rule (`EarlyCloseConfig.rule`, a label's @RULE): the PS
  keeps one Early Close state per variant and swaps it in for the
  variant's blocks, so each learns from its own rounds only;
- its knobs (a label's :KNOB=N, KNOBS): `credit=N` caps the PS's credit
  at N frames (0: no cap) in the variant's blocks; `poll=N` has the
  workers' ACK clocks poll every N us (0: adaptive, the default); `rto=N`
  makes the clock's RTO N round trips (0: a fixed 2 ms, kept for A/B runs).

The switch port toward the PS carries an XDP_PASS program for the whole run
(the PS's XDP_TX ACKs must be delivered); the workers' ports carry one only
during an ACK-clock block (their XDP_TX DATA), since XDP on a veth takes GSO
from its peer, and TCP's blocks keep the hosts' TSO as a real NIC would.
"""
from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from ...dataplane.xdp.loader import attach_pass, detach
from ..transport.early_close import EarlyClose
from ..transport.options import RTO_RTTS
from ..transport.rate import credit_window
from .cluster import LtpCluster
from .tcp import run_tcp_incast

LTP_SENDERS = {"ltp-socket": "socket", "ltp-xdp": "xdp", "ltp-auto": "auto"}
#: warm-up rounds added to the first block of each LTP sender on a rig (a run
#: of a sweep builds one rig per configuration): a rig's first clocked
#: rounds ran 1.3-1.7x the limit (first touch of the
#: rig's page pools and the programs' maps), whichever variant came first,
#: and made that variant's p99 (docs/benchmarks.md)
FIRST_WARMUP = 8


@dataclass
class Rounds:
    """Counted rounds of one transport: times, delivered fractions, the
    machine's busy CPU seconds over each round, and (LTP) the DATA the
    workers sent and how much of it the ACK clock made."""

    times: list[float] = field(default_factory=list)
    delivered: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    sent: int = 0
    clock_tx: int = 0
    credit_frames: int = 0  # the PS's credit (all flows together) in these rounds
    path_drops: int = 0     # packets the rig's path dropped during these rounds' blocks
    missing_chunks: int = 0  # LTP: chunks missing when their rounds closed
    cut_worst: list[int] = field(default_factory=list)  # LTP: per round closed with
    # chunks missing, the most one flow missed
    pushes: collections.Counter = field(default_factory=collections.Counter)  # LTP: the
    # workers' pushes by the sender that made them (PushReport.sender)
    whys: collections.Counter = field(default_factory=collections.Counter)  # LTP: and why
    # (PushReport.sender_why: auto names the loss that sent a push by the socket)


    def extend(self, other: Rounds) -> None:
        self.times += other.times
        self.delivered += other.delivered
        self.cpu_s += other.cpu_s
        self.reasons += other.reasons
        self.sent += other.sent
        self.clock_tx += other.clock_tx
        self.credit_frames = other.credit_frames or self.credit_frames
        self.path_drops += other.path_drops
        self.missing_chunks += other.missing_chunks
        self.cut_worst += other.cut_worst
        self.pushes.update(other.pushes)
        self.whys.update(other.whys)


KNOBS = {"credit": "the PS's credit cap in frames (rate.credit_window's ring_frames; 0: none)",
         "poll": "the ACK clock's fixed poll period in us, at most 10000 (PushOptions.poll_s; "
                 "0: adaptive)",
         "rto": "the ACK clock's RTO in round trips, at most 16 (PushOptions.rto_rtts; "
                "0: a fixed 2 ms; default 2)"}
KNOB_MAX = {"poll": 10_000, "rto": 16}


def parse_label(label: str) -> tuple[str, str | None, dict[str, int]]:
    """(name, Early Close rule or None, knobs) of a transport label
    NAME[:KNOB=N...][@RULE], e.g. ltp-xdp:credit=0@progress. ValueError
    naming what is wrong with a knob (KNOBS: LTP's only, integers >= 0)."""
    head, at, rule = label.partition("@")
    name, *kvs = head.split(":")
    knobs: dict[str, int] = {}
    for kv in kvs:
        key, eq, val = kv.partition("=")
        if key not in KNOBS or not eq or not (val.isascii() and val.isdigit()):
            raise ValueError(f"{label}: {kv!r} is not a knob; LTP transports take "
                             + ", ".join(f"{k}=N ({v})" for k, v in KNOBS.items()))
        if key in knobs:
            raise ValueError(f"{label}: {key} is given twice")
        if int(val) > KNOB_MAX.get(key, int(val)):
            raise ValueError(f"{label}: {key} is at most {KNOB_MAX[key]}")
        knobs[key] = int(val)
    return name, (rule if at else None), knobs


def is_ltp(t: str) -> bool:
    """Is transport label `t` one of LTP's (ltp, ltp-socket, ltp-xdp, with
    knobs or an @RULE or not)?"""
    name = t.partition("@")[0].partition(":")[0]
    return name == "ltp" or name in LTP_SENDERS


def variant(label: str, sender: str, rule: str) -> tuple[str, str]:
    """(sender, Early Close rule) of an LTP label: plain ltp takes `sender`,
    ltp-socket and ltp-xdp name theirs; an @RULE suffix names the rule,
    else it is `rule`."""
    name, own, _ = parse_label(label)
    return LTP_SENDERS.get(name, sender), own or rule


class _Shared:
    """What every LTP variant of a run shares: the cluster, the PS port's
    XDP_PASS, and which worker ports carry one now."""

    def __init__(self, rig, size: int, sender: str):
        self.rig, self.cluster, self.clock_ports = rig, None, False
        self.warmed: set[str] = set()  # senders whose first block ran (FIRST_WARMUP)
        attach_pass(rig.ps.port, rig.switch_ns, "native")
        try:
            self.clock_on(sender != "socket")
            self.cluster = LtpCluster(rig, size // 4, mode="native", sender=sender)
            self.window = self.cluster.ps.receiver.window  # the default credit
        except BaseException:
            self.close()
            raise

    def clock_on(self, on: bool) -> None:
        """XDP_PASS on the workers' switch ports (the ACK clock's DATA is
        XDP_TX'd by the workers' programs), or none."""
        if on == self.clock_ports:
            return
        self.clock_ports = on
        for w in self.rig.workers:
            if on:
                attach_pass(w.port, self.rig.switch_ns, "native")
            else:
                detach(w.port, self.rig.switch_ns, "native")

    def close(self) -> None:
        try:
            if self.cluster is not None:
                self.cluster.close()
        finally:
            self.cluster = None
            self.clock_on(False)
            detach(self.rig.ps.port, self.rig.switch_ns, "native")


class LtpRunner:
    """One LTP variant (sender, Early Close rule) on the run's shared cluster."""

    def __init__(self, shared: _Shared, size: int, warmup: int, sender: str, rule: str,
                 knobs: dict[str, int] | None = None):
        self.shared, self.size, self.warmup, self.sender = shared, size, warmup, sender
        ps = shared.cluster.ps
        self.early = EarlyClose(ps.capacity_bps, dataclasses.replace(ps.early.cfg, rule=rule))
        knobs = knobs or {}
        self.poll_us = knobs.get("poll", 0)
        self.rto_rtts = knobs.get("rto", RTO_RTTS)
        self.window = shared.window  # the PS's credit in this variant's blocks
        if "credit" in knobs:
            cl = shared.cluster
            self.window = credit_window(ps.capacity_bps, cl.chunk_bytes, cl.credit_bytes,
                                        ring_frames=knobs["credit"])

    def block(self, n: int, tick: Callable[[int], None]) -> Rounds:
        sh = self.shared
        sh.clock_on(self.sender != "socket")
        cl = sh.cluster
        cl.ps.early = self.early  # this variant's Early Close state, learning from its rounds
        cl.ps.receiver.window = self.window
        out = Rounds(credit_frames=self.window)
        warmup = self.warmup + (0 if self.sender in sh.warmed else FIRST_WARMUP)
        sh.warmed.add(self.sender)
        for i in range(warmup + n):
            cl.round_no += 1
            r = cl.round_no
            res, reports = cl.run_round(r, self.size // 4, seed=r, sender=self.sender,
                                        poll_us=self.poll_us, rto_rtts=self.rto_rtts,
                                        forget_windows=i == 0)
            if i >= warmup:
                out.times.append(res.duration_s)
                out.delivered.append(res.delivered_fraction)
                out.cpu_s.append(cl.last_cpu_s)
                out.reasons.append(res.reason)
                missing = (~res.masks).sum(axis=1)
                out.missing_chunks += int(missing.sum())
                if missing.any():
                    out.cut_worst.append(int(missing.max()))
                out.sent += sum(p.sent for p in reports.values() if p)
                out.clock_tx += sum(p.clock_tx for p in reports.values() if p)
                out.pushes.update(p.sender for p in reports.values() if p)
                out.whys.update(p.sender_why for p in reports.values() if p)
                tick(len(out.times))
        return out

    def close(self) -> None:
        pass  # the shared cluster is closed once, by make_runners' closer


class TcpRunner:
    """A TCP congestion control's side: agents started anew for each block.
    `shared` (make_runners sets it when the run has LTP variants too) is
    told to take the workers' XDP_PASS off first, so TCP keeps TSO."""

    def __init__(self, rig, size: int, warmup: int, cc: str):
        self.rig, self.size, self.warmup, self.cc = rig, size, warmup, cc
        self.shared: _Shared | None = None

    def block(self, n: int, tick: Callable[[int], None]) -> Rounds:
        if self.shared is not None:
            self.shared.clock_on(False)
        out = run_tcp_incast(self.rig, size=self.size, rounds=n, cc=self.cc, warmup=self.warmup,
                             progress=lambda k, _n, _t: tick(k))
        return Rounds(list(out["round_s"]), [1.0] * n, list(out["cpu_s"]), ["complete"] * n)

    def close(self) -> None:
        pass


def make_runners(labels: list[str], rig, size: int, warmup: int, sender: str = "socket",
                 rule: str = "progress") -> tuple[dict, Callable[[], None]]:
    """A runner per transport label, and the function that closes them all
    (see `variant` for `sender` and `rule`)."""
    runners: dict = {}
    shared: _Shared | None = None
    try:
        for t in labels:
            if is_ltp(t):
                s, r = variant(t, sender, rule)
                if shared is None:
                    shared = _Shared(rig, size, s)
                runners[t] = LtpRunner(shared, size, warmup, s, r, parse_label(t)[2])
            else:
                runners[t] = TcpRunner(rig, size, warmup, cc=t[len("tcp-"):])
    except BaseException:
        if shared is not None:
            shared.close()
        raise
    for r in runners.values():
        if isinstance(r, TcpRunner):
            r.shared = shared
    return runners, (shared.close if shared is not None else lambda: None)
