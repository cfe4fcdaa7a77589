# SPDX-License-Identifier: Apache-2.0
"""Values larger than the store takes in one piece, stored in parts.

torch's TCPStore server (its libuv backend, the default) resets the
connection of a client that sends a value over 8 MiB: the rank then dies
with `DistNetworkError: Connection reset by peer`. The one large value LTP
stores is a rejoining worker's state (sync/<ticket>: the model, its
optimizer's state and the script's extra), 15 MB for the 1.86M-parameter
MLP of `ltp train --hidden 1024,1024`; a 3 s pause of one worker (dropped,
then admitted back) ended that job.

A value over PART bytes goes as parts, `<key>/part/<i>` (PART bytes each,
the last shorter), written first; then the key itself holds a head: MAGIC,
the part count and the total length. A reader waits for the key as for any
value, sees the head and joins the parts. The value is sealed (or not) as a
whole before it is cut (coord.Coord.put), so a part changed in the store
fails the whole value's check; a value of any other shape (a head whose
parts are not all there, or of the wrong total) is a StoreValueError.
"""
from __future__ import annotations

import struct

from ..trust.sealing import StoreValueError

PART = 4 << 20          # bytes a part: half the store's limit
MAGIC = b"\x00ltp-parts\x00v1\x00"
HEAD = struct.Struct("<QQ")      # parts, total bytes
HEAD_BYTES = len(MAGIC) + HEAD.size
MAX_TOTAL = 1 << 36     # bytes: a head saying more is refused before any part is read
MAX_PARTS = MAX_TOTAL // PART


def part_key(key: str, i: int) -> str:
    return f"{key}/part/{i}"


def _head(key: str, raw: bytes) -> tuple[int, int] | None:
    """(parts, total bytes) if raw is a head, else None; a head no value
    of LTP's has is a StoreValueError."""
    if len(raw) != HEAD_BYTES or not raw.startswith(MAGIC):
        return None
    n, total = HEAD.unpack_from(raw, len(MAGIC))
    if not PART < total <= MAX_TOTAL or n != -(-total // PART):
        raise StoreValueError(f"store key {key}: a head of {n} parts and {total} bytes, "
                              "which no value of LTP's has")
    return n, total


def put(store, key: str, raw: bytes) -> None:
    """raw under `key`: at once if it is at most PART bytes, else in parts."""
    if len(raw) <= PART:
        store.set(key, raw)
        return
    n = -(-len(raw) // PART)
    view = memoryview(raw)
    for i in range(n):             # the parts first: a reader waits for the key
        store.set(part_key(key, i), bytes(view[i * PART:(i + 1) * PART]))
    store.set(key, MAGIC + HEAD.pack(n, len(raw)))


def get(store, key: str) -> bytes:
    """The value under `key` (it must be there), joined from its parts if it
    has them."""
    raw = store.get(key)
    head = _head(key, raw)
    if head is None:
        return raw
    n, total = head
    keys = [part_key(key, i) for i in range(n)]
    if not store.check(keys):
        raise StoreValueError(f"store key {key}: a value in {n} parts whose parts are not "
                              "all there")
    whole = b"".join(store.get(k) for k in keys)
    if len(whole) != total:
        raise StoreValueError(f"store key {key}: its {n} parts hold {len(whole)} bytes, "
                              f"not {total}")
    return whole


def delete(store, key: str) -> None:
    """`key` and its parts, found by their names, not by the head: a put
    that did not finish (its writer died) leaves parts and no head, and
    the key may go under another rank's hands meanwhile (a read of it
    would then wait for the store's timeout)."""
    i = 0
    while i < MAX_PARTS and store.check([part_key(key, i)]):
        store.delete_key(part_key(key, i))
        i += 1
    store.delete_key(key)
