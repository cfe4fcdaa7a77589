# SPDX-License-Identifier: Apache-2.0
"""Who wrote a rendezvous store value: each rank signs what it writes.

A job-wide MAC key proves only that a value came from some rank of the job,
and every worker must hold it: a hostile member could then write any value
(another worker's k, its ack, a join under another's id, the server's
floor, the state a joiner takes). So every rank has a signing key of its own,
derived from the job key (`server` for server ranks, one per worker id),
and signs each value it writes (Ed25519; trust/sealing.py says what is
signed and which writer each key admits). A server rank derives every key.
A worker's member key file holds its own signing seed and the server's
public key; the workers' public keys it learns from the server's signed
record (`directory`, in the server's meta/<rank>), so a member file needs no
worker count. A StoreAuth is bound to one run of the job (`run`): its
signatures cover the run's id, so a value recorded in an earlier run under
the same key is refused in a later one (jobkey.py says where the id comes
from). Importing this module needs neither torch nor numpy.
"""
from __future__ import annotations

import functools
import hashlib
import hmac

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (Ed25519PrivateKey,
                                                               Ed25519PublicKey)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

SERVER = 0xFFFF          # the writer id of a server rank (worker ids are 0..65534)
SIG_BYTES = 64
PUB_BYTES = 32


def seed(key: bytes, writer: int) -> bytes:
    """Writer `writer`'s signing seed under the job key `key`."""
    use = "server" if writer == SERVER else f"worker/{writer}"
    return hmac.new(key, b"ltpx-key/store-sign/" + use.encode(), hashlib.sha256).digest()


@functools.lru_cache(maxsize=4096)
def private(seed_: bytes) -> Ed25519PrivateKey:
    """The Ed25519 key of a 32-byte signing seed (the store's writers' here,
    the answers' in trust/tokens.py)."""
    return Ed25519PrivateKey.from_private_bytes(seed_)


def public(seed_: bytes) -> bytes:
    """The public key (PUB_BYTES) of a signing seed."""
    return private(seed_).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def writer_name(writer: int) -> str:
    return "the server" if writer == SERVER else f"worker {writer}"


class StoreAuth:
    """One rank's store identity: it signs as `writer` and checks the others.

    From the job key (`from_job_key`): a server, able to check every
    writer. From a member file (`member`): worker w, checking the server
    from the start and the other workers once it `learn`s the directory."""

    def __init__(self, writer: int, seed_: bytes, server_pub: bytes,
                 job_key: bytes | None = None, run: bytes = b""):
        self.writer, self.job_key, self.run = writer, job_key, run
        self._sign = private(seed_)
        self.pubs: dict[int, Ed25519PublicKey] = {
            SERVER: Ed25519PublicKey.from_public_bytes(server_pub)}

    @classmethod
    def from_job_key(cls, key: bytes, worker: int | None = None, run: bytes = b"") -> StoreAuth:
        """A rank holding the job key: it signs as the server (worker None)
        or as `worker` (a job that hands every rank the job key), and
        checks every writer; in run `run`."""
        w = SERVER if worker is None else worker
        if not 0 <= w <= SERVER:
            raise ValueError(f"a worker id is 0..{SERVER - 1}, got {worker}")
        return cls(w, seed(key, w), public(seed(key, SERVER)), job_key=key, run=run)

    @classmethod
    def member(cls, worker: int, seed_: bytes, server_pub: bytes, run: bytes = b"") -> StoreAuth:
        return cls(worker, seed_, server_pub, run=run)

    def __repr__(self) -> str:         # no key material in a log line
        return f"StoreAuth({writer_name(self.writer)}, knows {len(self.pubs)} writer(s))"

    def sign(self, msg: bytes) -> bytes:
        return self._sign.sign(msg)

    def key_of(self, writer: int) -> Ed25519PublicKey | None:
        """The public key of `writer`: derived by a server, learnt by a worker."""
        k = self.pubs.get(writer)
        if k is None and self.job_key is not None and 0 <= writer < SERVER:
            k = self.pubs[writer] = Ed25519PublicKey.from_public_bytes(
                public(seed(self.job_key, writer)))
        return k

    def verify(self, writer: int, sig: bytes, msg: bytes) -> bool | None:
        """True if `writer` signed msg; False if not; None if this rank does
        not know the writer's key (yet)."""
        k = self.key_of(writer)
        if k is None:
            return None
        try:
            k.verify(sig, msg)
            return True
        except InvalidSignature:
            return False

    def directory(self, workers: int) -> list[str]:
        """Every worker's public key (hex), for the server's meta record."""
        if self.job_key is None:
            raise ValueError("only a server rank (the job key) can make the directory")
        return [public(seed(self.job_key, w)).hex() for w in range(workers)]

    def learn(self, directory) -> None:
        """Take the workers' public keys from a server's record (its
        signature already checked): ValueError if the list is malformed."""
        if not isinstance(directory, list) or len(directory) >= SERVER:
            raise ValueError("store_pubs must be a list of worker keys")
        keys = {}
        for w, h in enumerate(directory):
            try:
                raw = bytes.fromhex(h) if isinstance(h, str) else b""
            except ValueError:
                raw = b""
            if len(raw) != PUB_BYTES:
                raise ValueError(f"store_pubs[{w}] is not a {PUB_BYTES}-byte hex key")
            keys[w] = Ed25519PublicKey.from_public_bytes(raw)
        if self.writer != SERVER and self.writer in keys and \
                keys[self.writer].public_bytes(Encoding.Raw, PublicFormat.Raw) != \
                self._sign.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw):
            raise ValueError(f"store_pubs[{self.writer}] is not this worker's key: the "
                             "member key file is another job's")
        self.pubs.update(keys)
