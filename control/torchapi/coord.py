# SPDX-License-Identifier: Apache-2.0
"""The job's coordination through the rendezvous store: metadata and barriers, never tensors.

Keys (under ltpx/job/<TORCHELASTIC_RESTART_COUNT>/, so a restarted job never
sees a stale barrier):
  meta/<rank>      each rank's role, address, device, host, pid
  hb/<rank>        its heartbeat counter (liveness.py)
  ready/<s>/<g>    op s's arrivals: bit w % 62 of group g = w // 62, added
                   by worker w (one store add gives count and identity)
  desc/<s>         the op's description, set by the first worker to arrive
                   before its arrival bit (each arrival sets it where it is
                   missing: one compare_set)
  post/<s>         a counter: who adds 1 first posts go/<s> (the last worker
                   to arrive, or the server going on without dead ones)
  go/<s>           op s's barrier value (ops.Go JSON: the op, the absent)
  join, join/<n>   a (re)started or excluded worker's request to come back:
                   ticket n from the counter, its worker id under join/<n>
  sync/<n>         the state a member hands the worker holding ticket n (in
                   parts under sync/<n>/part/<i> when large: storeparts.py)
  donor/<n>        who owes it (the lowest present member when ticket n was
                   admitted, as the server saw it); if that worker dies first,
                   the joiner asks again with a new ticket
  open/<r>         the server opened uplink round r (a round it did not open
                   ahead of its op's barrier)
  k/<s>/<w>        wbsp: how many gradients worker w averaged for op s
  fin              the server's summary when the job ends
  user/...         what code above the API keeps here (lt.store_set/store_get)
  floor            the lowest op whose keys are still there (storegc.py)

Every value is signed by the rank that wrote it and checked when read
(trust/sealing.py): the writer must be one the key admits (sealing.may_write: the
server's floor, fin, open and donor; a rank's own meta; worker w's ack and
k; a join or a state only from a worker, the join naming its writer, the
state from the donor named), so neither an outsider nor a member can write
in another rank's name; a forged or garbled value ends the rank with a
StoreValueError naming the key. Counters (ready, post, join, hb)
carry no signature. Keys are deleted once every
rank has read them (storegc.py: the server, a few ops behind; a joiner its
ticket's keys), so the store holds a bounded number of keys however long
the job runs.
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from datetime import timedelta

from ...errors import CommError
from ..trust.storeauth import SERVER, StoreAuth
from ..trust.sealing import Seal, StoreValueError
from .storevalues import MAX_COUNT, any_json, flag, go_value, meta_value, op_value, text_int
from .liveness import SLICE_S, Beat, PeerGone, Watch
from .ops import Go, Members, Op
from .storeparts import delete as delete_value, get as get_value, put as put_value
from .storegc import Reaper
from .tickets import Tickets

log = logging.getLogger("ltpx.torch.coord")

KEY = f"ltpx/job/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
GROUP_BITS = 62    # arrival bits per int64 counter
POLL_S = 0.01      # a long wait's store polls (_store_wait)


class Excluded(CommError):
    """This worker is not in the job any more (the barrier went on without it,
    or the server dropped it): it must rejoin (elastic.py) before its next op."""


def _timed_out(e: RuntimeError) -> bool:
    return "timeout" in str(e).lower() or "timed out" in str(e).lower()


def _bits(masks: list[int]) -> set[int]:
    return {g * GROUP_BITS + b for g, m in enumerate(masks) for b in range(GROUP_BITS)
            if m >> b & 1}


class Coord:
    """Barriers and metadata through the store (a torch.distributed Store).

    `me` is this worker's id (None on a server); `view` the membership it
    keeps (ops.Members); `watch` reads heartbeats once start_liveness ran
    (without it, waits take the store's timeout). `key`: the job's store
    key (jobkey.store_key; None: values unsealed), `scope` what sets this
    coordination apart from others in the same store (a shard's prefix)."""

    prefix = KEY      # every key's (the tickets' too)

    def __init__(self, store, workers: int, timeout_s: float, servers: int = 1,
                 key: bytes | None = None, scope: str = ""):
        self.store, self.workers, self.timeout_s = store, workers, timeout_s
        self.servers = servers
        self.timeout = timedelta(seconds=timeout_s)
        store.set_timeout(self.timeout)
        self.seal = Seal(key, scope, prefix=KEY, servers=servers)
        self.me: int | None = None
        self.view = Members(workers)
        self.watch: Watch | None = None
        self.beat: Beat | None = None
        self.tickets = Tickets(self, workers)   # joins: tickets, donors (tickets.py)
        self.on_server_dead = None   # called once per server (heartbeat thread, with its index) when it stops
        self.hb_server, self.hb_base = 0, servers   # the heartbeats' ranks: server, worker 0
        self.unposted: dict[int, float] = {}  # the server's: op -> since its post was taken, no go
        self.posted: tuple[int, Go] | None = None   # (op, go) this worker posted, not yet read
        self.on_wait: Callable[[], None] | None = None   # called during waits (server: beat)
        self.reaper = Reaper(store, KEY, self.groups)     # the server's (next_op)

    @property
    def groups(self) -> int:
        return -(-self.workers // GROUP_BITS)

    def start_liveness(self, rank: int | None, store_netns: str | None = None, *,
                       beats=None, server: int = 0, servers: int | None = None) -> None:
        """Beat this rank's heartbeat (rank None: none) and watch the others'.
        A sharded job's ranks beat once each, in the root's store (`beats`,
        unprefixed), by their job-wide numbers: a shard's coordination reads
        there its server's counter (rank `server`) and its workers' (rank
        `servers` + w); a worker's beat watches every server's."""
        store = self.store if beats is None else beats
        self.hb_server = server
        self.hb_base = self.servers if servers is None else servers
        if rank is not None:
            watch = [f"{KEY}hb/{i}" for i in range(self.hb_base)] if rank >= self.hb_base else []
            self.beat = Beat(store, f"{KEY}hb/{rank}", store_netns, watch_keys=watch,
                             on_dead=self._server_dead)
        self.watch = Watch(store, KEY)

    def _server_dead(self, i: int) -> None:
        if self.on_server_dead is not None:
            self.on_server_dead(i)

    def stop_liveness(self) -> None:
        if self.beat is not None:
            self.beat.stop()
            self.beat = None

    def worker_alive(self, w: int) -> bool:
        return self.watch is None or self.watch.alive(self.hb_base + w)

    def dead_workers(self, ws) -> set[int]:
        """Which of ws are dead: watched until each counter moves or stays
        still for the watch's dead_s (at most that long, plus a beat)."""
        if self.watch is None:
            return set()
        for w in ws:                     # a first sighting starts each one's clock
            self.worker_alive(w)
        pending, dead = set(ws), set()
        end = time.monotonic() + self.watch.dead_s + 2 * SLICE_S
        while pending and time.monotonic() < end:
            time.sleep(SLICE_S)
            for w in list(pending):
                before = self.watch.seen.get(self.hb_base + w)
                if not self.worker_alive(w):
                    dead.add(w)
                    pending.discard(w)
                elif self.watch.seen.get(self.hb_base + w) != before:
                    pending.discard(w)   # it beat: alive
        return dead | pending

    def started(self) -> bool:
        """Has op 0's barrier lifted (so a worker starting now is a rejoining one)?"""
        return self.store.check([f"{KEY}go/0"]) or self.store.check([f"{KEY}floor"])

    # ------------------------------------------------------------------ values
    def put(self, key: str, payload: bytes | str) -> None:
        """Store a sealed value under KEY + key (in parts if it is large:
        storeparts.py)."""
        put_value(self.store, KEY + key, self.seal.seal(KEY + key, payload))

    def take(self, key: str, parse=any_json):
        """The value under KEY + key (it must be there), verified and parsed
        (StoreValueError naming the key when it is refused)."""
        return self.seal.read(KEY + key, get_value(self.store, KEY + key), parse)

    def take_from(self, key: str, parse=any_json) -> tuple[int | None, object]:
        """(who wrote it: storeauth.SERVER or a worker id, None if unsigned; take()'s value)."""
        return self.seal.read_from(KEY + key, get_value(self.store, KEY + key), parse)

    def drop(self, *keys: str) -> None:
        for k in keys:
            delete_value(self.store, KEY + k)

    # what tickets.Keys asks besides the values: presence, counters, a wait's slice, heartbeats
    def has(self, key: str) -> bool:
        return self.store.check([KEY + key])

    def count(self, key: str, n: int) -> int:
        """Add n to the counter under KEY + key; its new value."""
        return self.store.add(KEY + key, n)

    def wait_slice(self, keys: list[str], seconds: float, first: bool) -> bool:
        """One slice of a longer wait (False when the keys are not there yet)."""
        return self._wait(keys, seconds, quiet=True, first=first)

    def server_alive(self) -> bool:
        return self.watch is None or self.watch.alive(self.hb_server)

    def set_json(self, key: str, obj) -> None:
        self.put(key, json.dumps(obj))

    def get_json(self, key: str, parse=any_json):
        self.wait([key])
        return self.take(key, parse)

    def directory(self) -> dict:
        """What a server's meta record adds: the workers' public store keys
        (storeauth.py), so every worker can check the others' values; {} on
        a worker or without a key."""
        auth = self.seal.key
        if isinstance(auth, StoreAuth) and auth.writer == SERVER:
            return {"store_pubs": auth.directory(self.workers)}
        return {}

    def metas(self, ranks) -> list[dict]:
        """meta/<rank> of each of `ranks`, checked (sealed.meta_value)."""
        keys = [f"meta/{r}" for r in ranks]
        self.wait(keys)
        raws = self.store.multi_get([KEY + k for k in keys])
        out = []
        for r, k, raw in zip(ranks, keys, raws):     # the servers' first: they name the
            m = self.seal.read(KEY + k, raw, meta_value(r, self.servers))   # workers' keys
            if r < self.servers and isinstance(self.seal.key, StoreAuth):
                try:
                    self.seal.key.learn(m.get("store_pubs", []))
                except ValueError as e:
                    raise StoreValueError(f"store key {KEY}{k}: refused: {e}") from None
            out.append(m)
        return out

    def wait(self, keys: list[str], timeout_s: float | None = None,
             server: bool = False, check: Callable[[], None] | None = None) -> None:
        """Wait for keys; with server=True (and a watch) give up as soon as the
        server stops beating, not at the timeout. check(), if given, is
        called between slices (it raises to give up)."""
        total = self.timeout_s if timeout_s is None else timeout_s
        if not server or self.watch is None:
            self._wait(keys, total)
            return
        end = time.monotonic() + total
        first = True
        while True:
            left = end - time.monotonic()
            if self._wait(keys, min(SLICE_S, max(left, 0.001)), quiet=left > SLICE_S,
                          total=total, first=first):
                return
            first = False
            if not self.watch.alive(self.hb_server):
                raise PeerGone(f"the server (rank {self.hb_server}) stopped beating "
                               f"{self.watch.silent_s(self.hb_server):.1f}s ago while this rank waited "
                               f"for {', '.join(keys)}: it died or hangs")
            if check is not None:
                check()

    def _wait(self, keys: list[str], seconds: float, quiet: bool = False,
              total: float | None = None, first: bool = True) -> bool:
        """True when the keys are there; on a timeout False if quiet, else
        CommError. With on_wait set (a server's link beat) the wait is cut
        into slices, on_wait() before each: an open round's XDP program
        keeps ACKing while this process waits here (ltp_cfg's heartbeat).
        Only a wait's first slice blocks in the store (_store_wait)."""
        total = seconds if total is None else total   # what a timeout's message says
        if self.on_wait is None:
            return self._store_wait(keys, seconds, total, quiet, first)
        end = time.monotonic() + seconds
        while True:
            self.on_wait()
            left = end - time.monotonic()
            if left <= SLICE_S:
                return self._store_wait(keys, max(left, 0.001), total, quiet, first)
            if self._store_wait(keys, SLICE_S, seconds, quiet=True, first=first):
                return True
            first = False

    def _store_wait(self, keys: list[str], seconds: float, total: float, quiet: bool,
                    first: bool = True) -> bool:
        """The keys within seconds. A wait's first slice blocks in the store
        (it returns as the keys are set); later slices poll (check) every
        POLL_S: a store wait that times out logs two c10d warnings
        (socket.cpp, "timed out after 249ms"), and a server waiting out a
        trainers' evaluation in 0.25 s slices logged them four times a second."""
        names = [KEY + k for k in keys]
        try:
            if first:
                self.store.wait(names, timedelta(seconds=seconds))
                return True
            end = time.monotonic() + seconds
            while not self.store.check(names):
                left = end - time.monotonic()
                if left <= 0:
                    break
                time.sleep(min(POLL_S, left))
            else:
                return True
        except RuntimeError as e:   # torch's DistStoreError: a timeout or a lost store
            if not _timed_out(e):
                raise CommError(f"the rendezvous store failed: {e}") from None
        if quiet:
            return False
        raise CommError(f"waited {total:g}s for {', '.join(keys)} in the "
                        "rendezvous store: a rank is stuck or gone")

    # ------------------------------------------------------------------ op barrier
    def arrived(self, s: int) -> set[int]:
        return _bits([self.store.add(f"{KEY}ready/{s}/{g}", 0) for g in range(self.groups)])

    def arrive(self, s: int, op: Op) -> bool:
        """This worker is at op s; True if it was the last the barrier waits for
        (it posts go/<s>). Excluded if it is no longer expected."""
        w = self.me
        if w not in self.view.expect():
            raise Excluded(f"worker {w} is not among op {s}'s workers (dropped or left "
                           "behind): it must rejoin")
        g, bit = divmod(w, GROUP_BITS)
        # the op described before the bit shows (one call, set where missing)
        name = f"{KEY}desc/{s}"
        self.store.compare_set(name, "", self.seal.seal(name, op.to_json()))
        mine = self.store.add(f"{KEY}ready/{s}/{g}", 1 << bit)
        here = _bits([mine if k == g else self.store.add(f"{KEY}ready/{s}/{k}", 0)
                      for k in range(self.groups)])
        if self.view.expect() <= here and self.store.add(f"{KEY}post/{s}", 1) == 1:
            go = Go(op, tuple(sorted(self.view.absent)))
            self.put(f"go/{s}", go.to_json())
            self.posted = (s, go)  # the post's first taker posts: no read back
            return True
        return False

    def read_go(self, s: int) -> Go:
        """Op s's barrier value (after it lifted); the view follows it. Excluded
        when the barrier went on without this worker. The go this rank posted
        itself is not read back."""
        mine, self.posted = self.posted or (None, None), None
        go = mine[1] if mine[0] == s else self.take(f"go/{s}", go_value(self.workers))
        self.view.after_go(go)
        if self.me is not None and self.me in go.absent:
            raise Excluded(f"op {s}'s barrier went on without worker {self.me} (it was "
                           "taken for dead): it must rejoin")
        return go

    def wait_go(self, s: int) -> Go:
        if (self.posted or (None,))[0] != s:
            self.wait([f"go/{s}"], server=True, check=lambda: self.check_behind(s))
        return self.read_go(s)

    def gone(self, s: int) -> bool:
        if self.store.check([f"{KEY}go/{s}"]):
            return True
        self.check_behind(s)
        return False

    def floor(self) -> int:
        """The lowest op whose keys are still in the store (storegc.py)."""
        if not self.store.check([f"{KEY}floor"]):
            return 0
        return self.take("floor", text_int(0, MAX_COUNT, "the floor"))

    def check_behind(self, s: int) -> None:
        """Excluded when op s's keys are gone (the job is ops ahead: this
        worker was absent from them); what this worker made of op s goes."""
        if s < self.floor() and not self.store.check([f"{KEY}go/{s}"]):
            self.drop(f"desc/{s}", f"post/{s}",
                      *(f"ready/{s}/{g}" for g in range(self.groups)))
            raise Excluded(f"op {s}'s keys are gone from the store: the job went on without "
                           f"worker {self.me}; it must rejoin")

    def next_op(self, s: int, idle_s: float = 86400.0, up: int | None = None) -> Go:
        """The server's wait for op s: as long as the workers take (they may
        evaluate or save between steps; a launcher ends a job whose rank
        failed), at most idle_s seconds. Once the workers it waits for are
        all either there or dead (no heartbeat for liveness.DEAD_S), it lifts
        the barrier itself, naming the dead as absent; when every one of them
        is dead, it ends (CommError) instead of waiting for nobody. First, the
        keys of ops every rank is done with go (storegc.py; up: op s's first
        uplink round)."""
        if self.reaper.floor(s):
            self.put("floor", str(self.reaper.floor(s)))
        self.reaper.reap(s, up)
        end = time.monotonic() + idle_s
        first = True      # only the first slice blocks in the store (_store_wait)
        while not self._wait([f"go/{s}"], SLICE_S, quiet=True, first=first):
            first = False
            if time.monotonic() > end:
                raise CommError(f"no op {s} from the workers after {idle_s:g}s")
            if self.watch is not None:
                self.release_without_dead(s)
                expect = self.view.expect()
                if expect and not self.arrived(s) and \
                        not any(self.worker_alive(w) for w in expect):
                    raise CommError(f"every worker ({', '.join(map(str, sorted(expect)))}) "
                                    f"stopped beating before op {s}: nobody is left to serve")
        self.unposted.pop(s, None)     # a live poster made it after all
        return self.read_go(s)

    def release_without_dead(self, s: int) -> None:
        """Lift op s's barrier when the workers it waits for are all there or
        dead. Also when all arrived and one of them died before the go was
        posted (killed between its arrival bit and its post): once the post
        has been missing for the watch's dead_s, the server posts it."""
        expect = self.view.expect()
        here = self.arrived(s)
        self.tickets.poll_joins()     # a worker asking to come back will not arrive either
        dead = {w for w in expect - here if w in self.tickets.joins or not self.worker_alive(w)}
        if not (expect - dead) <= here or not (here & expect):
            return
        if not dead:           # all there, yet no go: did the one posting it die?
            dead = {w for w in expect if not self.worker_alive(w)}
            if not dead:
                return
        if self.store.add(f"{KEY}post/{s}", 1) != 1:    # someone took the post
            since = self.unposted.setdefault(s, time.monotonic())
            if time.monotonic() - since < self.watch.dead_s or \
                    self.store.check([f"{KEY}go/{s}"]):
                return                          # a live poster has time to post
            log.warning("op %d: every worker arrived, but worker(s) %s died before the go "
                        "was posted: the server posts it", s, sorted(dead))
        self.unposted.pop(s, None)
        self.wait([f"desc/{s}"])
        op = self.take(f"desc/{s}", op_value(self.workers))
        self.put(f"go/{s}", Go(op, tuple(sorted(self.view.absent | dead))).to_json())

    # ------------------------------------------------------------------ rounds
    def announce_open(self, r: int) -> None:
        self.put(f"open/{r}", "1")

    def wait_open(self, r: int) -> None:
        self.wait([f"open/{r}"], server=True)
        self.take(f"open/{r}", flag)

    # ------------------------------------------------------------------ wbsp
    def set_k(self, s: int, w: int, k: int) -> None:
        self.put(f"k/{s}/{w}", str(k))

    def get_k(self, s: int, ids: list[int]) -> list[int]:
        """The k of each worker in ids; 0 for the absent (the k-weighted mean is
        over the present workers)."""
        present = [w for w in ids if w not in self.view.absent]
        keys = [f"k/{s}/{w}" for w in present]
        self.wait(keys)
        raws = self.store.multi_get([KEY + k for k in keys])
        parse = text_int(0, MAX_COUNT, "k")
        got = {w: self.seal.read(KEY + k, raw, parse) for w, k, raw in zip(present, keys, raws)}
        return [got.get(w, 0) for w in ids]
