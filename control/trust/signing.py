# SPDX-License-Identifier: Apache-2.0
"""Signed answers: what proves that an answer came from the server.

A GROUP frame's token is made under the job's group key, and every member of
a group-downlink job holds that key (tokens.py): it keeps outsiders out, but
one shared token cannot tell the server from a member, so any member could
send every worker an answer of its own. The server therefore signs each
answer: an Ed25519 signature, under a key derived from its shard's token
secret (which only server ranks hold), of a digest of (job, the run the
secret is bound to, round, the answer's bytes: an answer recorded in an
earlier run under the same key does not verify in a later one). It
travels as the answer's last SIG_ELEMS float32 elements, inside the
reliable round, so no frame format changes and the XDP program does not
know it is there. A worker checks it once the answer is
complete and before it uses any of it (`Verifier.check`); one that does not
verify is refused with ForgedAnswerError and never reaches the model. The
public half is in each worker's member key file (control/trust/jobkey.py), so a
member can check the server's answers but make none.

What a forger can still do is deny: its chunks, written first, make the real
answer's chunks duplicates, and the worker stops with the error (a job with
restarts rejoins it with a fresh copy of the model). Cost: one SHA-256 pass
over the answer (in pieces, on a few threads) at the server per answer and
at each worker, and one signature or verification (~0.1 ms).
"""
from __future__ import annotations

import functools
import hashlib
import os
import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ...errors import CommError
from .storeauth import PUB_BYTES, SIG_BYTES
from .tokens import answer_key, check_run, run_of

SIG_ELEMS = SIG_BYTES // 4        # float32 elements the signature takes at an answer's end
_DIGEST = b"ltpx-answer-digest\0"
PIECE_BYTES = 4 << 20             # what one thread hashes at a time
HASH_THREADS = min(8, os.cpu_count() or 1)


class ForgedAnswerError(CommError):
    """An answer's signature did not verify: it was not the server's (a
    member holding the group key sent it, or it was garbled); nothing of it
    was used."""


@functools.cache
def _pool() -> ThreadPoolExecutor:
    """The hashing threads, made at the first large answer and kept (not one
    pool per answer: an answer goes every step)."""
    return ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="ltpx-sign")


def _sha(piece) -> bytes:
    return hashlib.sha256(piece).digest()


def digest(job: int, d: int, payload: np.ndarray, run: bytes = b"") -> bytes:
    """What is signed: SHA-256 of (a tag, job, round d, the payload's
    length, the run, and the SHA-256 of each PIECE_BYTES of the payload). The pieces are hashed on up to
    HASH_THREADS threads (hashlib lets go of the GIL), so a large answer
    costs a fraction of one pass."""
    raw = memoryview(np.ascontiguousarray(payload)).cast("B")
    return _signed_digest(job, d, len(raw), run, _piece_sums(raw, 0))


def _piece_sums(raw: memoryview, start: int) -> list[bytes]:
    """The SHA-256 of each PIECE_BYTES of raw from `start` (a multiple of
    PIECE_BYTES) on, the last piece short; an empty payload is one empty piece."""
    pieces = [raw[i:i + PIECE_BYTES] for i in range(start, len(raw), PIECE_BYTES)]
    if not pieces:
        return [_sha(raw[:0])] if start == 0 else []
    return list(_pool().map(_sha, pieces)) if len(pieces) > 1 else [_sha(pieces[0])]


def _signed_digest(job: int, d: int, nbytes: int, run: bytes, sums: list[bytes]) -> bytes:
    head = struct.pack("!IQQB", job % 2**32, d, nbytes, len(run)) + run
    return _sha(_DIGEST + head + b"".join(sums))


class Signer:
    """The server's side: `sign(d, buf)` is buf with its signature appended."""

    def __init__(self, secret, job: int):
        """secret: the shard's token secret (bytes, or a tokens.RunSecret:
        the signatures then hold for its run only)."""
        self.key, self.job, self.run = answer_key(secret), job, run_of(secret)
        self.last: tuple[int, np.ndarray, np.ndarray] | None = None

    def sign(self, d: int, buf: np.ndarray) -> np.ndarray:
        """buf (float32) and SIG_ELEMS more holding the signature of answer d.
        A retry of the same answer (the same d and buf) gets the same array:
        the pushes' buffers must not change while a push of it may run."""
        if self.last is not None and self.last[0] == d and self.last[1] is buf:
            return self.last[2]
        if buf.dtype != np.float32:
            raise TypeError(f"an answer is float32, got {buf.dtype}")
        out = np.empty(len(buf) + SIG_ELEMS, dtype=np.float32)
        out[:len(buf)] = buf
        out[len(buf):] = np.frombuffer(self.key.sign(digest(self.job, d, buf, self.run)),
                                       np.float32)
        self.last = (d, buf, out)
        return out


class StreamSigner:
    """Answer d's signature taken as the answer fills (stream.py): the
    SHA-256 of each whole PIECE_BYTES of its first `n` elements as soon as
    they are final (`feed`), the rest and the signature at the end
    (`sign_into`): the same bytes `Signer.sign` appends."""

    def __init__(self, signer: Signer, d: int, n: int):
        self.signer, self.d, self.n = signer, d, n
        self.sums: list[bytes] = []
        self.hashed = 0          # bytes of the answer hashed so far (whole pieces)

    def feed(self, buf: np.ndarray, final: int) -> None:
        """buf[:final] (elements) will not change: hash its whole pieces."""
        raw = memoryview(buf[:self.n]).cast("B")
        end = min(final, self.n) * 4 // PIECE_BYTES * PIECE_BYTES
        if end > self.hashed:
            self.sums += _piece_sums(raw[:end], self.hashed)
            self.hashed = end

    def sign_into(self, buf: np.ndarray) -> None:
        """buf[n:n + SIG_ELEMS] = the signature of buf[:n], now final."""
        if buf.dtype != np.float32 or len(buf) < self.n + SIG_ELEMS:
            raise ValueError(f"a streamed answer is float32 with {SIG_ELEMS} elements of "
                             "room for its signature")
        raw = memoryview(buf[:self.n]).cast("B")
        sums = self.sums + _piece_sums(raw, self.hashed)
        s = self.signer
        sig = s.key.sign(_signed_digest(s.job, self.d, len(raw), s.run, sums))
        buf[self.n:self.n + SIG_ELEMS] = np.frombuffer(sig, np.float32)


class Verifier:
    """A worker's side: `check(d, values)` is the answer without its
    signature, or ForgedAnswerError."""

    def __init__(self, public: bytes, job: int, run: bytes = b""):
        if not isinstance(public, bytes) or len(public) != PUB_BYTES:
            raise ValueError(f"a server's public key is {PUB_BYTES} bytes")
        self.key, self.job = Ed25519PublicKey.from_public_bytes(public), job
        self.run = check_run(run)

    def check(self, d: int, values: np.ndarray) -> np.ndarray:
        """values[:-SIG_ELEMS] once the signature at its end verifies."""
        if len(values) < SIG_ELEMS:
            raise ForgedAnswerError(f"answer {d} is {len(values)} elements: too short to "
                                    "carry the server's signature")
        body = values[:-SIG_ELEMS]
        sig = np.ascontiguousarray(values[-SIG_ELEMS:]).tobytes()
        try:
            self.key.verify(sig, digest(self.job, d, body, self.run))
        except InvalidSignature:
            raise ForgedAnswerError(
                f"answer {d}'s signature is not the server's in this run: a member holding "
                "the group key, a garbled frame, or a replay of an earlier run wrote it; "
                "refused, nothing of it used (a job that must not trust its members runs "
                "--downlink unicast)") from None
        return body
