# SPDX-License-Identifier: Apache-2.0
"""The TCP transport's hello: a worker's id and a MAC of the run's id under
its own hello key, so a stray connection, a forger or a hello recorded in
an earlier run is not taken for a worker (control/accept.py takes the
connections; torchapi/link_tcp.py says and checks the hellos).

A worker's own hello key derives from the job's (`worker_key`), so its
member key file (jobkey.py) holds its key and no other's. Torch-free.
"""
from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Callable
from typing import NamedTuple

MAC_HELLO = struct.Struct(">I32s")    # worker id, HMAC-SHA256 of the run under its hello key


class HelloKey(NamedTuple):
    """What a TCP hello is made and checked with, in run `run`: the job's
    hello key (worker None: it says and checks any worker's hello), or one
    worker's own (`worker_key`, as its member key file holds it,
    trust/jobkey.py: that worker's hello and no other's)."""

    key: bytes
    worker: int | None = None
    run: bytes = b""

    def __repr__(self) -> str:      # no key material in a log line
        return f"HelloKey(worker={self.worker}, run={self.run!r})"


def worker_key(key: bytes, wid: int) -> bytes:
    """Worker wid's own hello key under the job's hello key."""
    return hmac.new(key, b"ltpx-tcp-hello/%d" % wid, hashlib.sha256).digest()


def mac_hello(wid: int, key: HelloKey | None) -> bytes:
    """A worker's hello: its id and a MAC of the run's id under its own hello
    key (zeros without a key; with a worker's own key, ValueError for
    another id)."""
    if key is None:
        return MAC_HELLO.pack(wid, bytes(32))
    if key.worker is None:
        own = worker_key(key.key, wid)
    elif wid != key.worker:
        raise ValueError(f"worker {key.worker}'s hello key cannot say worker {wid}'s hello")
    else:
        own = key.key
    mac = hmac.new(own, b"ltpx-tcp-hello-run\0" + key.run, hashlib.sha256).digest()
    return MAC_HELLO.pack(wid, mac)


def mac_parser(ids, key: HelloKey | None) -> Callable[[bytes], int | None]:
    """parse() for accept_workers: the id of a hello whose MAC verifies."""
    ids = set(ids)

    def parse(raw: bytes) -> int | None:
        wid, mac = MAC_HELLO.unpack(raw)
        if wid not in ids or not hmac.compare_digest(mac, mac_hello(wid, key)[4:]):
            return None
        return wid
    return parse
