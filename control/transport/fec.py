# SPDX-License-Identifier: Apache-2.0
"""An erasure-coded reliable round: parity chunks (Reed-Solomon, zfec) let a
receiver rebuild lost chunks without a round trip.

The round's buffer is padded to whole chunks (D data chunks) and cut into
groups of `k` (the last may be shorter); each group g owns `rmax` parity
slots, chunk indices D + g*rmax .. D + g*rmax + rmax-1. The wire declares all
D + G*rmax chunks, so both ends agree on the round's shape before it opens;
a sender sends only the first `r` parity chunks of each group (r <= rmax,
chosen from the loss it measured: `parity_for`), the rest are never sent and
never needed. A group is whole once any k_g of its k_g + rmax chunks are in
(an MDS code); the receiver closes the round when every group is whole and
rebuilds the data chunks it lacks. The sender counts a target done once its
ACKs show every group whole, and re-sends only chunks of groups that are not.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from ...errors import TransportError

K = 32          # data chunks per group
RMAX = 16       # parity slots per group: up to 50 % more bytes, ~20 % loss
TARGET = 0.01   # the chance a group is beyond repair the parity is chosen for


@dataclass(frozen=True)
class Plan:
    """The shape of one coded round: data chunks, group size, parity slots."""
    data: int                 # D: data chunks (the buffer padded to whole chunks)
    k: int = K
    rmax: int = RMAX

    def __post_init__(self) -> None:
        if self.data < 1 or self.k < 1 or self.k + self.rmax > 256 or self.rmax < 0:
            raise ValueError(f"bad code: {self.data} chunks, k={self.k}, rmax={self.rmax}")

    @property
    def groups(self) -> int:
        return -(-self.data // self.k)

    @property
    def nchunks(self) -> int:
        """Chunks the wire declares: data and every parity slot."""
        return self.data + self.groups * self.rmax

    def group_k(self, g: int) -> int:
        return min(self.k, self.data - g * self.k)

    def members(self, g: int, r: int | None = None) -> np.ndarray:
        """Chunk indices of group g: its data, then its first r parity slots
        (all rmax if r is None)."""
        r = self.rmax if r is None else r
        lo = g * self.k
        par = self.data + g * self.rmax
        return np.concatenate([np.arange(lo, lo + self.group_k(g)), np.arange(par, par + r)])

    @property
    def group_of(self) -> np.ndarray:
        """Per chunk index, its group."""
        d = np.arange(self.data) // self.k
        p = np.repeat(np.arange(self.groups), self.rmax)
        return np.concatenate([d, p])

    def need(self) -> np.ndarray:
        """Per group, how many of its chunks make it whole (k_g)."""
        return np.array([self.group_k(g) for g in range(self.groups)])

    def whole(self, mask: np.ndarray) -> np.ndarray:
        """Per group, whether the chunks in `mask` (bool [nchunks]) make it whole."""
        have = np.bincount(self.group_of[mask[:self.nchunks]], minlength=self.groups)
        return have >= self.need()

    @property
    def least(self) -> int:
        """Chunks that must be in before `complete` can be true."""
        return self.data

    def complete(self, mask: np.ndarray, chunks: np.ndarray) -> bool:
        """Every group can be rebuilt from the chunks in `mask` (the
        receiver's test; `chunks`, the round's bytes, unused)."""
        return bool(self.whole(mask).all())

    def rebuild(self, chunks: np.ndarray, mask: np.ndarray) -> int:
        return rebuild(self, chunks, mask)

    def covered(self, mask: np.ndarray) -> np.ndarray:
        """`mask` with every chunk of a whole group set (nothing left to send there)."""
        ok = self.whole(mask)
        return mask[:self.nchunks] | ok[self.group_of]


def plan_for(nelems: int, chunk_elems: int) -> Plan:
    """The code of a round of nelems float32 elements in chunks of chunk_elems."""
    return Plan(-(-nelems // chunk_elems))


def coded_elems(nelems: int, chunk_elems: int) -> int:
    """Elements a coded round of nelems occupies (data padded, every parity slot)."""
    return plan_for(nelems, chunk_elems).nchunks * chunk_elems


def parity_for(loss: float, k: int = K, rmax: int = RMAX, target: float = TARGET) -> int:
    """The fewest parity chunks per group of k for which a group is beyond
    repair (more than r of its k + r chunks lost, each with probability
    `loss`) with chance at most `target`; 0 when no loss was measured."""
    if loss <= 0:
        return 0
    loss = min(loss, 0.9)
    for r in range(1, rmax + 1):
        n = k + r
        tail = 1.0 - sum(math.comb(n, i) * loss ** i * (1 - loss) ** (n - i)
                         for i in range(r + 1))
        if tail <= target:
            return r
    return rmax


def sent_mask(plan: Plan, r: int) -> np.ndarray:
    """The chunks a push with r parity per group sends: data and those parity."""
    sent = np.zeros(plan.nchunks, dtype=bool)
    sent[:plan.data] = True
    for g in range(plan.groups):
        sent[plan.data + g * plan.rmax:plan.data + g * plan.rmax + r] = True
    return sent


def owed_bits(plan: Plan, words: list[np.ndarray], unsent: np.ndarray) -> list[int]:
    """Per target's ACK bitmap words, the bits of the chunks it owes nothing
    for: those acked, every chunk of a group already whole, and the parity
    not sent (as ints, bit c for chunk c)."""
    out = []
    for w in words:
        bits = np.unpackbits(w.view(np.uint8), bitorder="little")[:plan.nchunks].astype(bool)
        owed = plan.covered(bits) | unsent
        out.append(int.from_bytes(np.packbits(owed, bitorder="little").tobytes(), "little"))
    return out


@cache
def _encoder(k: int, n: int):
    import zfec  # noqa: PLC0415 (the C library only coded rounds need: uncoded jobs run without it)
    return zfec.Encoder(k, n)


@cache
def _decoder(k: int, n: int):
    import zfec  # noqa: PLC0415 (as _encoder)
    return zfec.Decoder(k, n)


def encode(plan: Plan, chunks: np.ndarray, r: int) -> None:
    """Fill the first r parity slots of every group. chunks: uint8
    [plan.nchunks, chunk_bytes], the data chunks written (padding zero)."""
    if r <= 0:
        return
    want = tuple(range(r))
    for g in range(plan.groups):
        kg = plan.group_k(g)
        lo, par = g * plan.k, plan.data + g * plan.rmax
        blocks = tuple(memoryview(chunks[lo + i]) for i in range(kg))
        out = _encoder(kg, kg + plan.rmax).encode(blocks, tuple(kg + j for j in want))
        for j, b in enumerate(out):
            chunks[par + j] = np.frombuffer(b, dtype=np.uint8)


def rebuild(plan: Plan, chunks: np.ndarray, mask: np.ndarray) -> int:
    """Rebuild in place the data chunks `mask` lacks from any k_g of their
    group's chunks that arrived; returns how many were rebuilt. Raises
    TransportError where a group is not whole."""
    rebuilt = 0
    for g in range(plan.groups):
        kg = plan.group_k(g)
        lo = g * plan.k
        if mask[lo:lo + kg].all():
            continue
        idx = plan.members(g)
        have = idx[mask[idx]][:kg]
        if len(have) < kg:
            raise TransportError(f"coded group {g}: {len(have)} of the {kg} chunks it needs")
        nums = tuple(int(c - lo) if c < plan.data else int(kg + c - plan.data - g * plan.rmax)
                     for c in have)
        out = _decoder(kg, kg + plan.rmax).decode(
            tuple(memoryview(chunks[c]) for c in have), nums)
        for i in range(kg):
            if not mask[lo + i]:
                chunks[lo + i] = np.frombuffer(out[i], dtype=np.uint8)
                rebuilt += 1
    return rebuilt
