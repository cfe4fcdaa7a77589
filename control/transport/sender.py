# SPDX-License-Identifier: Apache-2.0
"""Sender: what an endpoint's pushes share (its socket, maps and peers) and
what it learnt of each target from past pushes (advertised rate, the ACK
clock's credit and ACK gap, the loss reliable pushes met, the share of the
packets toward it that delivered nothing); `prepare` checks a push's
arguments and plans it with the kind of push its options name (push.Push,
ackclock.ClockPush; "auto": the clock, but the socket toward a target whose
path loses more than HEAVY_LOSS of its packets, until it loses less than
LIGHT_LOSS)."""
from __future__ import annotations

import collections
import dataclasses
import socket
import struct
from collections.abc import Callable

import numpy as np

from ...dataplane.xdp import wire as W
from .. import settings_table
from .layout import ChunkLayout, as_f32
from .options import AUTO, DEFAULTS, PushOptions, PushSpec, SenderChoice
from .results import Peer, PushReport
from .push import UDP_SEGMENT, Push
from ..trust.tokens import RoundTokens

LOSS_EWMA = 0.3
# auto: the ACK clock slows under heavy loss (a lost DATA or ACK takes a tick
# of the flow's clock, which Python's growth or the RTO must put back) and
# the paced socket does not (docs/benchmarks.md, "The default sender under
# loss"), so toward a target whose packets deliver nothing this often auto
# sends by the socket, and by the clock again below LIGHT_LOSS (a gap, so a
# path near the line does not flip each push)
HEAVY_LOSS = 0.06
LIGHT_LOSS = 0.03
PATH_DECAY = 0.7    # the weight of the pushes before the latest in a path's loss
PATH_MIN = 64       # packets (decayed) a path's loss is judged from, at least


def _key(t: Peer) -> tuple[int, str]:
    """What a sender learns of a target by: its flow's worker id and its
    address (a sharded worker's flows to S servers all carry its own id)."""
    return t.worker, t.ip


class Sender:
    """What an endpoint's pushes share: its socket, maps and peers, and the
    rate each target last advertised (a push to it starts there)."""

    def __init__(self, sock: socket.socket, maps, peers: dict[int, int], *, job: int,
                 chunk_bytes: int, max_elems: int, initial_rate_bps: float,
                 tokens: RoundTokens | None = None, options: PushOptions = DEFAULTS,
                 kinds: dict[str, type[Push]] | None = None, why: str = "",
                 asked_auto: bool = False, auto: Callable[[], SenderChoice] | None = None):
        self.sock, self.maps, self.peers, self.job = sock, maps, peers, job
        self.tokens = tokens or RoundTokens.off()  # each flow's per round
        self.chunk_bytes, self.max_elems = chunk_bytes, max_elems
        self.initial_rate_bps = initial_rate_bps
        # a group push's re-send of a chunk one target alone lacks: to it (push.py)
        self.group_alone = settings_table.env("group_alone")
        self.rate_hint: dict[int, float] = {}
        # the ACK clock's: the credits (with every flow active) of a target's last pushes
        self.window_hint: dict[int, collections.deque] = {}
        # ... and the mean time between the ACKs of its last push
        self.gap_hint: dict[int, float] = {}
        self.options = options  # a push's by default (sender, the ACK clock's knobs)
        self.why = why or f"{options.sender}: the endpoint's"  # why options.sender (reports)
        # auto: the endpoint asked for it (its pushes without a sender of
        # their own choose per push), and what it picks where the loss is
        # light (options.choose_sender; called once, for a push asking auto)
        self.asked_auto = asked_auto
        self._auto = auto or (lambda: SenderChoice("socket", AUTO, "socket: no grow check here"))
        self._auto_choice: SenderChoice | None = None
        # per target worker: (lost, sent) packets of its pushes, decayed
        # (PATH_DECAY a push), and the targets auto sends to by the socket
        self.path: dict[int, tuple[float, float]] = {}
        self.heavy: set[int] = set()
        # sender name -> what plans its pushes: Push, or the ACK clock's ackclock.ClockPush
        self.kinds = kinds or {"socket": Push}
        self.gso = [(socket.SOL_UDP, UDP_SEGMENT, struct.pack("=H", W.HDR_LEN + chunk_bytes))]
        # the loss the first passes of its reliable pushes met (the worst
        # target's, EWMA): what a coded push's parity is chosen for
        self.loss_hat = 0.0

    def learn_loss(self, loss: float) -> None:
        self.loss_hat = (1 - LOSS_EWMA) * self.loss_hat + LOSS_EWMA * min(1.0, max(0.0, loss))

    def prepare(self, round_: int, buf, to: Peer | list[Peer], spec: PushSpec) -> Push:
        """Check a push's arguments and plan it (see Endpoint.prepare_push)."""
        options = spec.options
        auto = options.sender == AUTO if options else self.asked_auto
        options, why = options or self.options, self.why
        if options.sender == AUTO:  # a push's own knobs, auto's sender
            if self._auto_choice is None:
                self._auto_choice = self._auto()
            options = dataclasses.replace(options, sender=self._auto_choice.sender)
            why = self._auto_choice.why
        elif options.sender != self.options.sender:
            why = f"{options.sender}: asked for by this push"
        if options.sender not in self.kinds:
            raise ValueError(f"sender {options.sender!r} is not one of this endpoint's "
                             f"({', '.join(self.kinds)})")
        targets = [to] if isinstance(to, Peer) else list(to)
        if not targets:
            raise ValueError("push needs at least one target peer")
        heavy = [t for t in targets if _key(t) in self.heavy]
        if auto and heavy and options.sender == "xdp":
            options = dataclasses.replace(options, sender="socket")
            why = self.heavy_why(heavy[0])
        for t in targets:
            if t.worker not in self.peers:
                raise ValueError(f"peer worker id {t.worker} is not configured on this endpoint")
        arr = as_f32(buf)
        if arr.size > self.max_elems:
            raise ValueError(f"buffer of {arr.size} elements exceeds max_elems={self.max_elems}")
        layout = ChunkLayout(arr.size, self.chunk_bytes)
        nch = layout.nchunks
        crit = np.ones(nch, dtype=bool) if spec.reliable else (
            np.zeros(nch, dtype=bool) if spec.critical is None
            else np.asarray(spec.critical, dtype=bool))
        if crit.shape != (nch,):
            raise ValueError(f"critical mask needs {nch} entries, got {crit.shape}")
        return self.kinds[options.sender](self, round_, arr, layout, targets, crit,
                                          dataclasses.replace(spec, options=options), why)

    def heavy_why(self, target: Peer) -> str:
        """Why auto sends toward a heavy `worker` by the socket. Its loss may
        be past judging again (small pushes since, e.g. the backend's
        collectives of a few packets, decay what was counted below PATH_MIN):
        it stays heavy until enough packets say otherwise."""
        loss = self.path_loss(target)
        share = f"{loss:.0%} of the packets" if loss is not None else \
            f"more than {HEAVY_LOSS:.0%} of the packets (when last judged)"
        return (f"socket: auto, {share} toward {target.ip} (worker {target.worker}'s flow) "
                f"lost (the ACK clock again below {LIGHT_LOSS:.0%})")

    def path_loss(self, target: Peer) -> float | None:
        """The share of the packets of recent pushes toward `target` that
        delivered nothing (PATH_DECAY a push; None: fewer than PATH_MIN)."""
        lost, sent = self.path.get(_key(target), (0.0, 0.0))
        return lost / sent if sent >= PATH_MIN else None

    def learned(self, push: Push, rep: PushReport) -> PushReport:
        """After `push`: its packets that delivered no chunk (sent - acked:
        the DATA or its ACK lost, or a duplicate), a multi-target push's
        shared among its targets alike, into each target's path loss, and
        whether auto sends to it by the socket (HEAVY_LOSS, LIGHT_LOSS). A
        group push's first pass reaches every target with one packet: not
        counted. Returns rep."""
        if push.group or not rep.sent:
            return rep
        n = len(push.targets)
        lost, sent = max(0, rep.sent - rep.acked) / n, rep.sent / n
        for t in push.targets:
            l0, s0 = self.path.get(_key(t), (0.0, 0.0))
            self.path[_key(t)] = (PATH_DECAY * l0 + lost, PATH_DECAY * s0 + sent)
            loss = self.path_loss(t)
            if loss is not None and loss > HEAVY_LOSS:
                self.heavy.add(_key(t))
            elif loss is not None and loss < LIGHT_LOSS:
                self.heavy.discard(_key(t))
        return rep

    def start_rate(self, targets: list[Peer], group: bool) -> float:
        hints = [self.rate_hint.get(_key(t), self.initial_rate_bps) for t in targets]
        return min(hints) if group else sum(hints)  # a group packet reaches them all

    def learn_rates(self, targets: list[Peer], low_kbps: list[int]) -> None:
        for t, r in zip(targets, low_kbps):
            if r:
                self.rate_hint[_key(t)] = r * 1000

    def learn_windows(self, targets: list[Peer], low: list[int]) -> None:
        """The ACK clock: the smallest credit each target gave (its share
        with every flow active) is what its next push is primed with."""
        for t, w in zip(targets, low):
            if w and w != 0xffff:
                self.window_hint.setdefault(_key(t), collections.deque(maxlen=4)).append(w)

    def prime_window(self, target: Peer, default: int) -> int:
        """Packets to prime a clocked push to `target` with: the smallest
        credit of its last four pushes (one whose flow started late saw a
        larger share), `default` before it gave one."""
        hint = self.window_hint.get(_key(target))
        return min(hint) if hint else default

    def learn_gaps(self, targets: list[Peer], gaps: list[float]) -> None:
        """The ACK clock: the mean time between the ACKs of each target's
        push (as TCP keeps a route's RTT) sizes its next push's RTO until
        that push measures its own."""
        for t, g in zip(targets, gaps):
            if g > 0:
                self.gap_hint[_key(t)] = g

    def ack_gap(self, target: Peer) -> float:
        return self.gap_hint.get(_key(target), 0.0)

    def forget(self) -> None:
        """Drop what the clock learned of every target (credits, ACK gaps)."""
        self.window_hint.clear()
        self.gap_hint.clear()
