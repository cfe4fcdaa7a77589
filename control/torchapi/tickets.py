# SPDX-License-Identifier: Apache-2.0
"""Join tickets: how a (re)started or excluded worker asks the server to take it back.

The membership protocol's joins (keys join, join/<n>, donor/<n>, sync/<n>
under the coordination's prefix): the worker takes a ticket and names itself
under it (`request_join`), the server reads the requests at each op's wait
(`poll_joins`) and admits them in the next step, naming the member that
owes the joiner the state (`take_joins`); that member hands it over
(`put_sync`) and the joiner takes it (`take_sync`), asking again when its
donor dies first. `Tickets` is an object its coord.Coord owns
(`coord.tickets`), with its state (the server's counted tickets and the
joins not yet admitted) and its own interface to the store, `Keys`: sealed
values, counters, slices of a wait and the heartbeats, which the Coord
provides.
"""
from __future__ import annotations

import logging
import time

from typing import Protocol

from ...errors import CommError
from .liveness import SLICE_S, PeerGone
from ..trust.sealing import StoreValueError
from .storevalues import donor_value, worker_id

log = logging.getLogger("ltpx.torch.coord")

TICKET_WAIT_S = 10.0   # a join ticket whose worker id never shows is given up after this
# the most the join ticket count may grow between two polls: each worker asking
# again a few times (its donor died, its ticket went stale), and some slack
TICKETS_PER_WORKER, TICKETS_SLACK = 16, 64


class Keys(Protocol):
    """What the tickets ask of the store (coord.Coord provides it): keys are
    named without the coordination's prefix, values sealed and checked."""

    prefix: str     # the coordination's (what a message names a key with)
    timeout_s: float

    def put(self, key: str, payload: bytes | str) -> None: ...
    def take(self, key: str, parse=...): ...
    def take_from(self, key: str, parse=...) -> tuple[int | None, object]: ...
    def drop(self, *keys: str) -> None: ...
    def has(self, key: str) -> bool: ...
    def count(self, key: str, n: int) -> int: ...
    def wait_slice(self, keys: list[str], seconds: float, first: bool) -> bool: ...
    def worker_alive(self, w: int) -> bool: ...
    def server_alive(self) -> bool: ...


class Tickets:
    """The join tickets of one coordination (see the module docstring)."""

    def __init__(self, keys: Keys, workers: int):
        self.keys, self.workers = keys, workers
        self.tickets_seen = 0
        self.unseen: dict[int, float] = {}   # tickets counted, worker id not there yet: since
        self.joins: dict[int, int] = {}      # the server's: worker -> ticket, not yet admitted

    def request_join(self, w: int) -> int:
        """Ask to be admitted back; the ticket (sync/<ticket> will hold the state)."""
        n = self.keys.count("join", 1)
        self.keys.put(f"join/{n}", str(w))
        return n

    def poll_joins(self) -> None:
        """The server's look at join requests since its last (one store read).
        A ticket whose worker id is not there yet is looked for again at the
        next poll (TICKET_WAIT_S at most: a count with no request is a forgery)."""
        n = self.keys.count("join", 0)
        if n - self.tickets_seen > TICKETS_PER_WORKER * self.workers + TICKETS_SLACK:
            raise StoreValueError(
                f"store key {self.keys.prefix}join: the join ticket count jumped from {self.tickets_seen} "
                f"to {n}, more than {self.workers} workers could ask for: forged")
        now = time.monotonic()
        for t in range(self.tickets_seen + 1, n + 1):
            self.unseen[t] = now
        self.tickets_seen = max(n, self.tickets_seen)
        for t, since in sorted(self.unseen.items()):
            if self.keys.has(f"join/{t}"):
                writer, w = self.keys.take_from(f"join/{t}", worker_id(self.workers))
                if writer is None or writer == w:
                    self.joins[w] = t
                else:          # a member in another's name: nothing to admit, the job goes on
                    log.warning("join ticket %d: worker %d asked to join as worker %d "
                                "(forged by a member): ignored", t, writer, w)
                self.keys.drop(f"join/{t}")
                del self.unseen[t]
            elif now - since > TICKET_WAIT_S:
                log.warning("join ticket %d: no worker id under %sjoin/%d after %gs: ignored",
                            t, self.keys.prefix, t, TICKET_WAIT_S)
                del self.unseen[t]

    def take_joins(self, donor: int | None = None) -> dict[int, int]:
        """Worker -> ticket of every request not admitted yet; they are now,
        and `donor` (the member that will hand over the state) is named for
        each under donor/<ticket>."""
        self.poll_joins()
        out, self.joins = self.joins, {}
        for ticket in out.values():
            self.keys.put(f"donor/{ticket}", "" if donor is None else str(donor))
        return out

    def put_sync(self, ticket: int, blob: bytes) -> None:
        self.keys.put(f"sync/{ticket}", blob)

    def take_sync(self, ticket: int, timeout_s: float | None = None,
                  w: int | None = None) -> bytes | None:
        """The state for `ticket`; None if the job ended first (its summary is in).
        In a keyed job the state is taken only from the donor the server
        names under donor/<ticket> (written before any state is due): a
        state there before the donor is named waits for it, and one written
        by any other worker is a StoreValueError. Worker w (this joiner), if
        given, asks again with a new ticket when the member that owes it
        the state dies before handing it over: the server takes a worker
        asking to join as gone from the barrier, and the next step admits it
        with a living donor. The ticket's keys go once the state is taken."""
        end = time.monotonic() + (timeout_s or self.keys.timeout_s)
        donor: int | None = None     # -1: the server named none (no member to hand it)
        first = True      # only the first slice blocks in the store (coord._store_wait)
        while True:
            if self.keys.wait_slice([f"sync/{ticket}"], SLICE_S, first):
                writer, blob = self.keys.take_from(f"sync/{ticket}", bytes)   # a forgery raises
                if donor is None and self.keys.has(f"donor/{ticket}"):
                    donor = self._donor(ticket)
                if writer is None:           # an unsealed job: no writer to check
                    break
                if donor is not None:
                    if writer != donor:
                        raise StoreValueError(
                            f"store key {self.keys.prefix}sync/{ticket}: the state was written by "
                            f"worker {writer}, not by "
                            f"{'its donor' if donor < 0 else f'worker {donor}, its donor'}"
                            ": forged by a member")
                    break
                time.sleep(SLICE_S)          # there, but whose it must be is not named yet
            first = False
            if self.keys.has("fin"):
                return None
            if not self.keys.server_alive():
                raise PeerGone("the server (rank 0) stopped beating while this worker "
                               "waited to be admitted back")
            if donor is None and self.keys.has(f"donor/{ticket}"):
                donor = self._donor(ticket)
            if w is not None and donor is not None and donor >= 0 \
                    and not self.keys.worker_alive(donor):
                if self.keys.has(f"sync/{ticket}"):
                    continue             # it handed the state over just before
                new = self.request_join(w)
                log.warning("worker %d: worker %d, which owed it the state (ticket %d), "
                            "stopped beating; asking again (ticket %d)", w, donor, ticket, new)
                self.keys.drop(f"donor/{ticket}", f"sync/{ticket}")   # parts it left too
                ticket, donor = new, None
            if time.monotonic() > end:
                raise CommError(f"not admitted back after {timeout_s or self.keys.timeout_s:g}s "
                                f"(ticket {ticket})")
        self.keys.drop(f"sync/{ticket}", f"donor/{ticket}")
        return blob

    def _donor(self, ticket: int) -> int:
        """donor/<ticket>: the worker that owes the state, -1 for none."""
        donor = self.keys.take(f"donor/{ticket}", donor_value(self.workers))
        return -1 if donor is None else donor
