# SPDX-License-Identifier: Apache-2.0
"""The store's keys deleted once every rank has read them: a long job's store stays the same size.

Every op leaves keys (coord.py: first, desc, ready, post, go, k under the
op's number; open under its rounds' numbers). The server deletes
them a few ops behind (`Reaper.reap`, at each op's wait, while the workers
compute), where every rank is provably done with them:

- When the server waits for op s, op s-1's barrier has lifted: every
  worker expected there had arrived, so it had finished op s-2 and read
  every key of ops <= s-2. Ops below s-2 go (`floor` = s-2).
- A round's open/<r> is read by the workers as they push it, so by op s
  those of ops <= s-2 are read too; rounds of ops below s-3 go (one op
  more than needed, kept from when the server also waited there for a
  late worker's word).

A worker the job went on without (absent) may still be behind: when it
waits for an op below `floor` it learns it was left behind (coord.Excluded)
instead of waiting for a key that is gone, and rejoins. The store has no
"delete where", so the server lists the keys (one call) and deletes the
due ones it finds; a store that cannot list is given the op's own names.
"""
from __future__ import annotations

import logging

log = logging.getLogger("ltpx.torch.coord")

OP_KEYS = ("first", "desc", "ready", "post", "go", "k")   # <name>/<op>[/...]
ROUND_KEYS = ("open",)                             # <name>/<round>[/...]
OPS_KEPT = 2      # ops below s - OPS_KEPT are done with when the server waits for op s
ROUNDS_KEPT = 3   # rounds of ops below s - ROUNDS_KEPT are done with then


def due(name: str, op_floor: int, round_floor: int | None) -> bool:
    """Whether key `name` (below the job's prefix) is one every rank is done with."""
    kind, _, rest = name.partition("/")
    num = rest.partition("/")[0]
    if not num.isdigit():
        return False
    if kind in OP_KEYS:
        return int(num) < op_floor
    return kind in ROUND_KEYS and round_floor is not None and int(num) < round_floor


class Reaper:
    """The server's deletion of the keys under `prefix` that every rank is done with."""

    def __init__(self, store, prefix: str, groups: int):
        self.store, self.prefix, self.groups = store, prefix, groups
        self.ups: dict[int, int] = {}     # op -> its first uplink round
        self.listing = True               # the store can list its keys
        self.deleted = 0

    @staticmethod
    def floor(s: int) -> int:
        """The lowest op whose keys stay while the server waits for op s."""
        return max(0, s - OPS_KEPT)

    def reap(self, s: int, up: int | None) -> int:
        """At the server's wait for op s (its first uplink round `up`): delete
        what is due (publish floor(s) first: a worker left behind learns it
        from there, not from a key that is gone); how many went."""
        if up is not None:
            self.ups[s] = up
        op_floor, before = self.floor(s), self.deleted
        round_floor = self.ups.get(s - ROUNDS_KEPT)
        for old in [k for k in self.ups if k < s - ROUNDS_KEPT]:
            del self.ups[old]
        names = self.names(op_floor)
        for name in names:
            if due(name, op_floor, round_floor):
                self.store.delete_key(self.prefix + name)
                self.deleted += 1
        return self.deleted - before

    def names(self, op_floor: int) -> list[str]:
        """The keys below the prefix: listed, or (a store that cannot list)
        the names of the op that just fell below the floor."""
        if self.listing:
            try:
                keys = self.store.list_keys()
            except (AttributeError, RuntimeError, NotImplementedError) as e:
                log.info("the store cannot list its keys (%s): deleting by name", e)
                self.listing = False
            else:
                n = len(self.prefix)
                return [k[n:] for k in keys if k.startswith(self.prefix)]
        s = op_floor - 1
        if s < 0:
            return []
        return [f"{k}/{s}" for k in ("desc", "post", "go")] + \
            [f"ready/{s}/{g}" for g in range(self.groups)]
