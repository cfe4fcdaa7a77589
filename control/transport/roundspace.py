# SPDX-License-Identifier: Apache-2.0
"""One endpoint's round space shared by S servers: a sharded worker reaches
every server through one device.

An XDP program keys a flow by (worker id, round % banks), and every server
of a sharded job numbers its rounds alike (each sees every op). So a
worker's pushes to two servers, or their two answers, would meet in one
bank of one device. Here server s's round r goes on the wire as r·S + s and
a worker's program has 2S banks (EndpointConfig.banks): bank = s + S·(r mod
2), so every server keeps two banks of its own on every worker's device, as
one server has on a device of its own. Server s's own program has 2 banks
and takes the bank from r (bank_stride S: (r·S + s) // S = r), so its
memory is what an unsharded server's is for its slice. The tokens follow
the wire round (a ShardTokens picks server s's secret for it), so both ends
derive them alike.

`RoundSpace(ep, s, S)` is server s's view of an endpoint: the calls a link
makes, each round mapped. On a worker the S views share one endpoint
(control/torchapi/link_ltp.py, SharedDevice); a server's own endpoint is
seen through its view too, so its rounds are the wire's. S = 1 is the
identity: r on the wire is r.

An error a call raises names its round as the endpoint knows it, on the
wire; the view says which that is ("round 7 (wire round 15, server 1 of
2)"), so a sharded job's messages name the rounds its round log, trace and
`ltp flows` show.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ...dataplane.xdp.mapstructs import MAX_SHARDS
from ...errors import LtpError


def banks_for(servers: int) -> int:
    """Banks a worker's endpoint of a job with `servers` servers has: two per server."""
    if not 1 <= servers <= MAX_SHARDS:
        raise ValueError(f"servers must be in 1..{MAX_SHARDS}, got {servers}")
    return 2 * servers


class RoundSpace:
    """Server s's rounds on endpoint `ep`, out of S (module docstring)."""

    def __init__(self, ep, s: int = 0, S: int = 1):
        if not 0 <= s < S:
            raise ValueError(f"shard {s} is not one of {S}")
        self.ep, self.s, self.S = ep, s, S

    def wire(self, round_: int) -> int:
        """Round round_ as it goes on the wire (and into the endpoint)."""
        return round_ * self.S + self.s

    @contextmanager
    def _naming(self, round_: int) -> Iterator[None]:
        """An LtpError raised inside names round_ beside its wire round."""
        try:
            yield
        except LtpError as e:
            if self.S > 1 and e.args and isinstance(e.args[0], str):
                w = self.wire(round_)
                name = f"round {round_} (wire round {w}, server {self.s} of {self.S})"
                e.args = (re.sub(rf"\bround {w}\b", name, e.args[0]), *e.args[1:])
            raise

    def _at(self, call: Callable, round_: int, *args, **kw):
        """call(wire round, ...), its errors named (_naming)."""
        with self._naming(round_):
            return call(self.wire(round_), *args, **kw)

    # what the links read of the endpoint, as it is
    @property
    def sender(self):
        return self.ep.sender

    @property
    def bubble_strategy(self) -> str:
        return self.ep.bubble_strategy

    @bubble_strategy.setter
    def bubble_strategy(self, value: str) -> None:
        self.ep.bubble_strategy = value

    @property
    def sender_choice(self):
        return self.ep.sender_choice

    def beat(self) -> None:
        self.ep.beat()

    # the calls that name a round
    def open_round(self, round_: int, *args, **kw) -> None:
        self._at(self.ep.open_round, round_, *args, **kw)

    def wait_round(self, round_: int, *args, **kw):
        return self._at(self.ep.wait_round, round_, *args, **kw)

    def arrived_from(self, round_: int, chunk: int) -> bool:
        return self._at(self.ep.arrived_from, round_, chunk)

    def drop_worker(self, round_: int, worker: int) -> None:
        self._at(self.ep.drop_worker, round_, worker)

    def cancel_round(self, round_: int) -> None:
        self._at(self.ep.cancel_round, round_)

    def retire(self, round_: int, source_worker: int) -> None:
        self._at(self.ep.retire, round_, source_worker)

    def push(self, round_: int, *args, **kw):
        return self._at(self.ep.push, round_, *args, **kw)

    def prepare_push(self, round_: int, *args, **kw):
        """The plan, its own `send` (later, e.g. an answer stream's thread)
        naming its errors too."""
        plan = self._at(self.ep.prepare_push, round_, *args, **kw)
        if self.S > 1:
            send = plan.send

            def named_send(*a, **k):
                with self._naming(round_):
                    return send(*a, **k)
            plan.send = named_send
        return plan

    def push_reliable(self, round_: int, *args, **kw):
        return self._at(self.ep.push_reliable, round_, *args, **kw)

    def push_deferred(self, round_: int, *args, memo: dict | None = None, **kw):
        # the memo stays keyed by this view's rounds (its owner prunes it so)
        memo = None if memo is None else _ByRound(memo, self)
        return self._at(self.ep.push_deferred, round_, *args, memo=memo, **kw)

    def expect(self, round_: int, *args, **kw) -> None:
        self._at(self.ep.expect, round_, *args, **kw)

    def expect_deferred(self, round_: int, *args, **kw):
        return self._at(self.ep.expect_deferred, round_, *args, **kw)

    def close(self) -> None:
        """A server's own endpoint goes with its view (a worker's shared one
        is closed by its SharedDevice, not here)."""
        self.ep.close()


class _ByRound:
    """A dict keyed by a view's rounds, read and written by wire round, as
    defer.push does: its round, and the round before it (wire - 1 falls in
    the view's previous round, (r·S + s - 1 - s) // S = r - 1)."""

    def __init__(self, memo: dict, view: RoundSpace):
        self.memo, self.view = memo, view

    def _key(self, wire: int) -> int:
        return (wire - self.view.s) // self.view.S

    def get(self, wire: int, default=None):
        return self.memo.get(self._key(wire), default)

    def __getitem__(self, wire: int):
        return self.memo[self._key(wire)]

    def __setitem__(self, wire: int, value) -> None:
        self.memo[self._key(wire)] = value


__all__ = ["RoundSpace", "banks_for"]
