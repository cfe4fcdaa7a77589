# SPDX-License-Identifier: Apache-2.0
"""Who is alive: every rank beats a counter in the rendezvous store; the others watch it.

A rank's `Beat` is a daemon thread with its own store connection (a
`store.clone()`, made in the store's namespace, so a main thread blocked in
a store wait never holds it up) that adds 1 to `hb/<rank>` every BEAT_S.
Compute does not stop it (torch releases the GIL), a killed process does.

A `Watch` reads those counters when asked and remembers, per rank, the
value it last saw and when that value first appeared; a rank whose counter
has not moved for `dead_s` (LTP_DEAD_S, default DEAD_S) is dead. A rank
seen for the first time gets the benefit of the doubt (its clock starts
then), as does one that never beat (still starting: a launcher's timeout
judges those), and a dead rank whose counter moves again is alive again (a
restarted worker beats the same key). Wall clocks of other hosts are never
compared: only this process's monotonic clock.

Who uses it: the server's op barrier (coord.py) releases the workers that
arrived once the missing ones are dead; a worker's waits for the server give
up as soon as the server is (instead of at the store's timeout), and its
heartbeat thread also watches its servers' counters, for the one wait that
is not on the store: the answer's round (exchange.py). A sharded job's ranks
beat once each, in the root's store, by their job-wide numbers (coord.py).
"""
from __future__ import annotations

import atexit
import logging
import threading
import time
from datetime import timedelta

from ...dataplane import netns
from ...errors import CommError
from .. import settings_table
from ..transport.rate import quiet_gc

log = logging.getLogger("ltpx.torch.liveness")

SLICE_S = 0.25     # a wait that watches liveness looks this often (coord.py)
BEAT_S = 0.2
DEAD_S = settings_table.TABLE["dead_s"].default    # 2 s


def dead_after_s() -> float:
    """Seconds of silence that make a rank dead (LTP_DEAD_S overrides DEAD_S;
    one that is not a number > 0 is ignored)."""
    try:
        return settings_table.env("dead_s")
    except ValueError:
        return DEAD_S


class PeerGone(CommError):
    """A rank this one waits for stopped beating."""


class Beat:
    """This rank's heartbeat thread."""

    def __init__(self, store, key: str, store_netns: str | None = None,
                 watch_keys: tuple[str, ...] = (), on_dead=None):
        # Collect and freeze first (gc.freeze): a full collection holds the
        # GIL, and so this thread, while it walks every object of a process
        # that imported torch. Eight co-located servers doing their first one
        # at once on two busy cores each stopped beating for 2-3 s, and were
        # taken for dead. Frozen, later collections never walk those again.
        quiet_gc()
        with netns.inside(store_netns):   # a connection of its own
            self.store = store.clone()
        # bounds the store's own waits (get/wait) to 1 s; it does not bound a
        # call on a connection whose server stopped answering (an add was seen
        # blocked over 60 s against a stopped store): stop() joins for 2 s at most
        self.store.set_timeout(timedelta(seconds=1))
        self.key = key
        # other ranks' counters this thread watches (a worker: its servers'),
        # and what it calls once per counter (with its index in watch_keys)
        # when that counter stops for dead_after_s()
        self.watch_keys, self.on_dead = tuple(watch_keys), on_dead
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.loop, name="ltpx-heartbeat", daemon=True)
        self.thread.start()
        atexit.register(self.stop)

    def loop(self) -> None:
        store, dead_s = self.store, dead_after_s()
        now = time.monotonic()
        seen = [(0, now) for _ in self.watch_keys]     # per counter: (value, since)
        told: set[int] = set()
        keys = list(self.watch_keys)
        made = False
        while not self.stopped.is_set():
            try:
                store.add(self.key, 1)
                if not made:    # each counter exists (0 until its rank beats) ...
                    for k in keys:
                        store.add(k, 0)
                    made = True
                # ... so one round trip reads them all: a store call a counter
                # was S + 1 GIL hand-offs a beat, over 1 s on two busy cores
                values = [int(v) for v in store.multi_get(keys)] if keys else []
            except Exception as e:   # the store is gone: the job is over, nobody watches
                if not self.stopped.is_set():
                    log.info("heartbeat of %s ends: the store is gone (%s)", self.key, e)
                return
            now = time.monotonic()
            for i, v in enumerate(values):
                if v != seen[i][0]:
                    seen[i] = (v, now)
                elif v and now - seen[i][1] > dead_s and i not in told \
                        and self.on_dead is not None:
                    told.add(i)
                    self.on_dead(i)
            self.stopped.wait(BEAT_S)

    def stop(self) -> None:
        """End the thread and wait for it (a thread left inside a store call
        while the interpreter exits can abort the process)."""
        self.stopped.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=2.0)
        self.store = None    # its connection closes now, not during the interpreter's teardown


class Watch:
    """The other ranks' heartbeats as this rank sees them."""

    def __init__(self, store, prefix: str, dead_s: float | None = None):
        self.store, self.prefix = store, prefix
        self.dead_s = dead_after_s() if dead_s is None else dead_s
        self.seen: dict[int, tuple[int, float]] = {}   # rank -> (value, since)

    def alive(self, rank: int) -> bool:
        """Has rank's counter moved within dead_s (one store read)?"""
        v = self.store.add(f"{self.prefix}hb/{rank}", 0)
        if v == 0:       # it has not beaten yet: still starting, not dead
            return True
        now = time.monotonic()
        last = self.seen.get(rank)
        if last is None or last[0] != v:
            self.seen[rank] = (v, now)
            return True
        return now - last[1] < self.dead_s

    def silent_s(self, rank: int) -> float:
        """Seconds since rank's counter last moved, as far as this watch knows."""
        last = self.seen.get(rank)
        return 0.0 if last is None else time.monotonic() - last[1]
