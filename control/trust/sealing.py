# SPDX-License-Identifier: Apache-2.0
"""Values in the rendezvous store: signed by the rank that wrote them, checked when read.

torch's TCPStore has no authentication, and it listens on every interface
whatever address it is given: whoever reaches it can read every value and
write any. So nothing secret goes into it (the job key reaches each server
rank in a file, each worker its own member key file: jobkey.py), and every
value the job reads back is sealed. ltpx.torch's values are signed by their
writer (`Seal` with a StoreAuth, storeauth.py): SIGNED, the writer's id and
an Ed25519 signature of (scope, key name, writer, the run's id, SHA-256 of
the payload) before the payload. `Seal.read` takes a value only when the
signature is its writer's and the writer may write that key (`may_write`:
the server's own values, each rank's meta, each worker's ack and k), then
parses and checks the payload with the parser its reader gives
(torchapi/storevalues.py: types, ranges, worker ids within the job). So
neither an outsider nor a member can write a value in another rank's name.
A value that fails is refused with a `StoreValueError` naming the key,
never a KeyError or IndexError from deep in the server, and never taken.
The key name is under the signature, so a value cannot be moved to another
key; the scope keeps sharded servers' values apart. The built-in training
job's own result values are MAC'd with the job's shared store key (MAGIC;
control/training/context.py). Without a job key (a torchrun job given no
LTP_SECRET_FILE) values go unsealed and are still checked.

Counters (store.add: arrivals, heartbeats, join tickets) cannot carry a
signature: a forged count can delay a barrier or end the job
(operations.md, "Threat model"), not change what it computes.
"""
from __future__ import annotations

import hashlib
import hmac
import struct

from ...errors import CommError
from .storeauth import SERVER, SIG_BYTES, StoreAuth, writer_name

MAGIC = b"LTS1"            # MAC'd with the job's shared key
SIGNED = b"LTS2"           # signed by its writer (storeauth.py)
MAC_BYTES = 32


class StoreValueError(CommError):
    """A value read from the rendezvous store was refused (bad MAC, or it does
    not parse or hold what the key must hold); the message names the key."""


class Seal:
    """Seal and open the values of one scope of the store (a shard's prefix).

    `key`: a StoreAuth (control/trust/storeauth.py: this rank signs what it
    writes, and a value is taken only with its writer's signature and from
    a writer its key admits, `may_write`), the job's MAC key (bytes: the
    built-in training job's own values), or None (unsealed). `prefix`: the
    job's key prefix, which `may_write` reads names under; `servers`: the
    server ranks (meta/<rank> below it is the server's)."""

    def __init__(self, key: bytes | StoreAuth | None, scope: str = "", prefix: str = "",
                 servers: int = 1):
        self.key, self.scope, self.prefix, self.servers = key, scope, prefix, servers

    def _mac(self, name: str, payload: bytes) -> bytes:
        msg = b"%s\0%s\0%s" % (self.scope.encode(), name.encode(), payload)
        return hmac.new(self.key, msg, hashlib.sha256).digest()

    def _msg(self, name: str, writer: int, payload: bytes) -> bytes:
        run = self.key.run
        return b"ltpx-store\0%s\0%s\0%s%s%s" % (self.scope.encode(), name.encode(),
                                                 struct.pack("!HB", writer, len(run)), run,
                                                 hashlib.sha256(payload).digest())

    def seal(self, name: str, payload: bytes | str) -> bytes:
        """What to store under `name` for `payload`."""
        payload = payload.encode() if isinstance(payload, str) else bytes(payload)
        if self.key is None:
            return payload
        if isinstance(self.key, StoreAuth):
            w = self.key.writer
            return SIGNED + struct.pack("!H", w) + self.key.sign(self._msg(name, w, payload)) \
                + payload
        return MAGIC + self._mac(name, payload) + payload

    def open(self, name: str, raw: bytes) -> bytes:
        """The payload of a stored value; StoreValueError when its MAC or
        signature is not this job's (forged, garbled, another job's, moved
        from another key, or written by a rank the key does not admit)."""
        return self.open_from(name, raw)[1]

    def open_from(self, name: str, raw: bytes) -> tuple[int | None, bytes]:
        """(its writer: storeauth.SERVER or a worker id, None when unsigned; the payload)."""
        raw = bytes(raw)
        head = raw[:len(MAGIC)]
        sealed = head in (MAGIC, SIGNED) and len(raw) >= len(MAGIC) + MAC_BYTES
        if self.key is None:
            if sealed:
                raise StoreValueError(f"store key {name}: the value is sealed with a job key "
                                      "this rank does not have: give every rank a key file "
                                      "of this job (LTP_SECRET_FILE)")
            return None, raw
        if isinstance(self.key, StoreAuth):
            return self._open_signed(name, raw)
        if not sealed or head != MAGIC:
            raise StoreValueError(f"store key {name}: the value carries no MAC: forged, or "
                                  "written by a rank without this job's key (LTP_SECRET_FILE)")
        mac, payload = raw[len(MAGIC):len(MAGIC) + MAC_BYTES], raw[len(MAGIC) + MAC_BYTES:]
        if not hmac.compare_digest(mac, self._mac(name, payload)):
            raise StoreValueError(f"store key {name}: the value's MAC does not verify: forged, "
                                  "garbled, or another job's (every rank needs a key "
                                  "file of this job in LTP_SECRET_FILE)")
        return None, payload

    def _open_signed(self, name: str, raw: bytes) -> tuple[int, bytes]:
        head = len(SIGNED) + 2 + SIG_BYTES
        if raw[:len(SIGNED)] != SIGNED or len(raw) < head:
            raise StoreValueError(f"store key {name}: the value carries no signature: forged, "
                                  "or written by a rank without this job's key "
                                  "(LTP_SECRET_FILE)")
        (w,) = struct.unpack_from("!H", raw, len(SIGNED))
        sig, payload = raw[len(SIGNED) + 2:head], raw[head:]
        if not may_write(self.relative(name), w, self.servers):
            raise StoreValueError(f"store key {name}: written by {writer_name(w)}, who may not "
                                  "write it: forged by a member")
        ok = self.key.verify(w, sig, self._msg(name, w, payload))
        if ok is None:
            raise StoreValueError(f"store key {name}: signed by {writer_name(w)}, whose key "
                                  "this rank has not learnt (a server's meta record lists "
                                  "the workers' keys)")
        if not ok:
            raise StoreValueError(f"store key {name}: the value's signature is not "
                                  f"{writer_name(w)}'s in this run: forged, garbled, "
                                  "another job's, or replayed from an earlier run (every rank "
                                  "needs a key file of this job in LTP_SECRET_FILE, and the "
                                  "same LTP_RUN_ID)")
        return w, payload

    def relative(self, name: str) -> str | None:
        """`name` under the job's prefix; None for a name outside it."""
        return name[len(self.prefix):] if self.prefix and name.startswith(self.prefix) else None

    def read(self, name: str, raw: bytes, parse):
        """open(), then parse(payload); StoreValueError naming the key when the
        payload does not hold what parse wants."""
        return self.read_from(name, raw, parse)[1]

    def read_from(self, name: str, raw: bytes, parse):
        """(the writer, as open_from says; read()'s value)."""
        writer, payload = self.open_from(name, raw)
        try:
            return writer, parse(payload)
        except StoreValueError:
            raise
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
            raise StoreValueError(f"store key {name}: refused: {e}") from None


RUN_KEY = "run"     # the run's id where rank 0 drew it (job.agree_run)
SERVER_ONLY = ("floor", "fin", "open", "donor", RUN_KEY)   # values only a server writes


def may_write(rel: str | None, writer: int, servers: int) -> bool:
    """Whether `writer` (storeauth.SERVER or a worker id) may write the key
    `rel` (a name under the job's prefix; None: outside it, anyone's): the
    server's own values, a rank's meta/<rank>, worker w's k/<s>/<w>; a join
    request or a joiner's state only from a worker (the reader checks which:
    tickets.py, Tickets.take_sync); the barrier's desc and go from any rank."""
    if rel is None:
        return True
    parts = rel.split("/")
    if parts[0] in SERVER_ONLY:
        return writer == SERVER
    if parts[0] == "meta" and len(parts) == 2 and parts[1].isdigit():
        r = int(parts[1])
        return writer == (SERVER if r < servers else r - servers)
    if parts[0] == "k" and len(parts) == 3 and parts[2].isdigit():
        return writer == int(parts[2])
    if parts[0] in ("join", "sync"):
        return writer != SERVER
    return True
