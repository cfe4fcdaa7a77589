# SPDX-License-Identifier: Apache-2.0
"""A tolerant answer: what a worker lost is deferred a step, not re-sent.

A reliable answer to N workers re-sends every chunk any of them lost; at
10 % loss per port that is about half the answer again, and on a CPU-bound
host every packet costs the same (docs/benchmarks.md, issue 29). A
tolerant answer goes out once. Its critical chunks (the step's report) are
re-sent until every worker has them; of the rest, the server learns from
the ACKs which chunks every worker holds, and sends that verdict, reliably,
in the round's last chunks (`extra_chunks`): a bitmap of the deferred data
chunks (those some worker may lack) and, in a signed job, the signature of
the answer as the workers will use it. Every worker uses the chunks not
deferred and zeros the deferred ones (`Plan.rebuild`), so the replicas stay
alike; the server adds the deferred values into its next answer of the same
shape (torchapi/server.py), so a lost chunk's gradient is applied one step
late, never lost. What the ACKs say is conservative: a chunk is held only
once its worker's XDP program acknowledged writing it, so every worker
holds every chunk not deferred (a lost ACK only defers a chunk that came).

An answer after one that deferred nothing promises as much: its verdict
(nothing deferred) goes in its first pass, and every chunk is re-sent until
every worker has it, as a reliable answer's; a loss then makes the next
answer tolerant. On a lossless path the verdict costs one chunk.

The verdict: a header (magic, data chunks, deferred count, signature
bytes), the bitmap (bit c of byte c // 8, little-endian bit order), the
signature. Its chunks are the round's last; both ends size the round alike
from the answer's length (`extra_chunks`).
"""
from __future__ import annotations

import dataclasses
import functools
import struct
from dataclasses import dataclass, field

import numpy as np

from ...dataplane.xdp import wire as W
from ...errors import TransportError
from .layout import ChunkLayout
from .results import PushReport
from .push import RETX_BYTE

MAGIC = 0x4C545056   # "LTPV"
HEAD = struct.Struct("!IIII")   # magic, data chunks, deferred chunks, signature bytes
# The verdict goes this many times in its first pass: a lost verdict (a
# single chunk, so no later ACK shows it lost) costs a tail wait and a pass,
# 3-9 ms on the rig at 10 % loss, where one worker in three loses a copy
VERDICT_COPIES = 3
# The most of an answer's data chunks a verdict defers: while more are lacked
# by some worker, a pass re-sends them. Training (`ltp train`, SGD with
# momentum) kept its accuracy with 34 % deferred a step (10 % loss per port,
# four workers) and lost 10-30 points with 59 % (20 %): a chunk deferred in
# step after step is applied ever later (docs/benchmarks.md)
MAX_DEFERRED = 0.4


def extra_chunks(data: int, chunk_bytes: int, sig_bytes: int = 0) -> int:
    """Chunks the verdict of an answer of `data` chunks takes."""
    return -(-(HEAD.size + -(-data // 8) + sig_bytes) // chunk_bytes)


def encode(deferred: np.ndarray, sig: bytes, chunk_bytes: int) -> np.ndarray:
    """The verdict's chunks as bytes [extra, chunk_bytes]."""
    data = len(deferred)
    n = extra_chunks(data, chunk_bytes, len(sig))
    out = np.zeros(n * chunk_bytes, dtype=np.uint8)
    bits = np.packbits(deferred, bitorder="little").tobytes()
    raw = HEAD.pack(MAGIC, data, int(deferred.sum()), len(sig)) + bits + sig
    out[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    return out.reshape(n, chunk_bytes)


def decode(raw: np.ndarray, data: int) -> tuple[np.ndarray, bytes]:
    """(deferred mask [data], signature) from the verdict's bytes; a
    TransportError if they are not a verdict of an answer of `data` chunks."""
    raw = np.ascontiguousarray(raw).reshape(-1)
    if raw.size < HEAD.size:
        raise TransportError("a deferred answer's verdict is too short")
    magic, n, count, nsig = HEAD.unpack(raw[:HEAD.size].tobytes())
    nbits = -(-data // 8)
    if magic != MAGIC or n != data or HEAD.size + nbits + nsig > raw.size:
        raise TransportError(f"a deferred answer's verdict does not describe its {data} "
                             f"chunks (magic {magic:#x}, {n} chunks)")
    bits = raw[HEAD.size:HEAD.size + nbits]
    deferred = np.unpackbits(bits, bitorder="little")[:data].astype(bool)
    if int(deferred.sum()) != count:
        raise TransportError("a deferred answer's verdict is garbled (its count disagrees)")
    return deferred, raw[HEAD.size + nbits:HEAD.size + nbits + nsig].tobytes()


@dataclass
class Plan:
    """A receiver's view of a tolerant answer (OpenRound.code): `data`
    chunks, then `extra` verdict chunks. Complete once the verdict is in and
    every chunk it does not defer; `rebuild` zeros the deferred ones."""

    data: int
    extra: int
    deferred: np.ndarray | None = field(default=None, repr=False)   # once the verdict is in
    sig: bytes = b""

    @property
    def nchunks(self) -> int:
        return self.data + self.extra

    @property
    def least(self) -> int:
        """Chunks that must be in before `complete` can be true."""
        return self.extra

    def complete(self, mask: np.ndarray, chunks: np.ndarray) -> bool:
        """mask: chunks in; chunks: the round's bytes [nchunks, chunk_bytes]."""
        if not mask[self.data:self.nchunks].all():
            return False
        if self.deferred is None:
            self.deferred, self.sig = decode(chunks[self.data:self.nchunks], self.data)
        return bool((mask[:self.data] | self.deferred).all())

    def rebuild(self, chunks: np.ndarray, mask: np.ndarray) -> int:
        """Zero the deferred chunks (those that came too: every worker
        leaves the same ones out); returns 0, the chunks rebuilt."""
        chunks[:self.data][self.deferred] = 0
        return 0


def zeroed(buf: np.ndarray, deferred: np.ndarray, chunk_elems: int) -> np.ndarray:
    """buf with the deferred chunks' elements zero: the answer as used."""
    out = buf.copy()
    out[np.repeat(deferred, chunk_elems)[:buf.size]] = 0
    return out


def held_by_all(p, data: int) -> int:
    """The data chunks of push p every target acknowledged (bit c: chunk c)."""
    held = (1 << data) - 1
    for a in p._raw_acked():
        held &= a
    return held


def settle_when_few(p, data: int) -> None:
    """After a pass of tolerant push p: while more than MAX_DEFERRED of the
    data chunks are lacked by some target, the next pass re-sends them (to
    the group once); then only the critical chunks are waited for."""
    if data - held_by_all(p, data).bit_count() <= MAX_DEFERRED * data:
        p.order = [c for c in p.order if p.crit[c]]
        p.full = sum(1 << c for c in p.order)
        p.after_pass = None


def push(ep, round_: int, buf: np.ndarray, to, *, critical_from: int, group, timeout_s: float,
         sign=None, sig_bytes: int = 0, memo: dict) -> tuple[PushReport, tuple]:
    """Send answer buf tolerantly (see the module), from the socket: the
    elements from `critical_from` on are critical. `sign(answer as used)`
    returns its `sig_bytes`-byte signature. memo[round_], the verdict
    (deferred mask, signature, whether the answer met no loss) once made: a
    retry sends it again (it must not defer other chunks than those workers
    may already have used); memo[round_ - 1]'s says whether to promise the
    answer whole. Returns the report and the verdict."""
    cb = ep.sender.chunk_bytes
    ce = cb // 4
    data = ChunkLayout(buf.size, cb).nchunks
    extra = extra_chunks(data, cb, sig_bytes)
    wire = np.zeros((data + extra) * ce, dtype=np.float32)
    wire[:buf.size] = buf
    crit = np.zeros(data + extra, dtype=bool)
    crit[critical_from // ce:data] = True
    p = ep.prepare_push(round_, wire, to, critical=crit, timeout_s=timeout_s, group=group,
                        options=dataclasses.replace(ep.sender.options, sender="socket"))
    rep, verdict, prev = None, memo.get(round_), memo.get(round_ - 1)
    if verdict is None and prev is not None and prev[2]:
        # the last answer deferred nothing: promise as much (what a lossless
        # path costs is then a reliable answer's and one chunk); a loss in it
        # is repaired, and makes the next answer tolerant
        verdict = memo[round_] = (np.zeros(data, dtype=bool),
                                  sign(buf) if sign is not None else b"", True)
    if verdict is not None and not verdict[0].any():   # whole: every chunk until in
        wire.view(np.uint8)[data * cb:] = encode(verdict[0], verdict[1], cb).reshape(-1)
        p.crit[:] = True
        p.restrict(range(data + extra))
        rep = p.send()
        if rep.resent:      # it met loss: the next answer is tolerant
            verdict = memo[round_] = (*verdict[:2], False)
        return rep, verdict
    if verdict is None:
        p.restrict(range(data), tolerant=True)
        p.after_pass = functools.partial(settle_when_few, data=data)
        rep = p.send()
        bits = np.frombuffer(held_by_all(p, data).to_bytes(-(-data // 8), "little"),
                             dtype=np.uint8)
        deferred = ~np.unpackbits(bits, bitorder="little")[:data].astype(bool) & ~crit[:data]
        verdict = memo[round_] = (deferred, sign(zeroed(buf, deferred, ce))
                                  if sign is not None else b"", not deferred.any())
    # the same push again, for the verdict's chunks: critical, first sends
    wire.view(np.uint8)[data * cb:] = encode(verdict[0], verdict[1], cb).reshape(-1)
    p.crit[data:] = True
    p.after_pass = None
    for h in p.hdrs:
        np.frombuffer(h, dtype=np.uint8).reshape(data + extra, -1)[data:, RETX_BYTE] &= \
            ~W.F_RETX & 0xFF
    p.order = list(range(data, data + extra))    # restrict keeps what is in the order
    p.restrict(p.order, copies=VERDICT_COPIES)
    rep2 = p.send()
    if rep is not None:
        rep2.sent += rep.sent
        rep2.resent += rep.resent
        rep2.passes += rep.passes
        rep2.duration_s += rep.duration_s
    return rep2, verdict
