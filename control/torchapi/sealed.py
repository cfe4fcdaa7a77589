# SPDX-License-Identifier: Apache-2.0
"""Values in the rendezvous store: signed by the rank that wrote them, checked when read.

torch's TCPStore has no authentication, and it listens on every interface
whatever address it is given: whoever reaches it can read every value and
write any. So nothing secret goes into it (the job key reaches each server
rank in a file, each worker its own member key file: control/jobkey.py),
and every value the job reads back is sealed. ltpx.torch's values are
signed by their writer (`Seal` with a StoreAuth, control/storeauth.py):
SIGNED, the writer's id and an Ed25519 signature of (scope, key name,
writer, the run's id, SHA-256 of the payload) before the payload. `Seal.read` takes a
value only when the signature is its writer's and the writer may write that
key (`may_write`: the server's own values, each rank's meta, each worker's
ack and k), then parses and checks the payload (types, ranges, worker ids
within the job). So neither an outsider nor a member can write a value in
another rank's name. A value that fails is refused with a `StoreValueError`
naming the key, never a KeyError or IndexError from deep in the server, and
never taken. The key name is under the signature, so a value cannot be moved
to another key; the scope keeps sharded servers' values apart. The built-in
training job's own result values are MAC'd with the job's shared store key
(MAGIC; control/training/context.py). Without a job key (a torchrun job given
no LTP_SECRET_FILE) values go unsealed and are still checked.

Counters (store.add: arrivals, heartbeats, join tickets) cannot carry a
signature: a forged count can delay a barrier or end the job
(operations.md, "Threat model"), not change what it computes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import ipaddress
import json
import math
import struct

from ...errors import CommError
from ..storeauth import SERVER, SIG_BYTES, StoreAuth, writer_name
from ..settings_table import COMPRESS, DOWNLINKS, TABLE
from ..transport.bubble import STRATEGIES
from ..transport.early_close import EarlyCloseConfig
from ..transport.tokens import RUN_MAX
from .ops import KINDS, Go, Op

MAGIC = b"LTS1"            # MAC'd with the job's shared key
SIGNED = b"LTS2"           # signed by its writer (storeauth.py)
MAC_BYTES = 32
MAX_PIECES = 1 << 16        # uplink rounds one op may have
MAX_ELEMS = (1 << 31) - 1   # float32 elements of one piece
MAX_COUNT = 1 << 40         # a k, a counter's value
MAX_OP_ELEMS = 1 << 31      # float32 elements of one op, all its pieces together
MAX_JSON = 8 << 20          # bytes of one JSON value: TCPStore's own limit on a value


class StoreValueError(CommError):
    """A value read from the rendezvous store was refused (bad MAC, or it does
    not parse or hold what the key must hold); the message names the key."""


class Seal:
    """Seal and open the values of one scope of the store (a shard's prefix).

    `key`: a StoreAuth (control/storeauth.py: this rank signs what it
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
    server's own values, a rank's meta/<rank>, worker w's ack/<r>/<w> and
    k/<s>/<w>; a join request or a joiner's state only from a worker (the
    reader checks which: tickets.py, coord.take_sync); the barrier's desc
    and go from any rank."""
    if rel is None:
        return True
    parts = rel.split("/")
    if parts[0] in SERVER_ONLY:
        return writer == SERVER
    if parts[0] == "meta" and len(parts) == 2 and parts[1].isdigit():
        r = int(parts[1])
        return writer == (SERVER if r < servers else r - servers)
    if parts[0] in ("ack", "k") and len(parts) == 3 and parts[2].isdigit():
        return writer == int(parts[2])
    if parts[0] in ("join", "sync"):
        return writer != SERVER
    return True


# --------------------------------------------------------------------------- parsers
# Each takes the payload (bytes) and returns the value, or raises ValueError.

def _json(payload: bytes):
    if len(payload) > MAX_JSON:
        raise ValueError(f"{len(payload)} bytes of JSON, more than {MAX_JSON}")
    try:
        return json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("not JSON") from None
    except RecursionError:      # nested deeper than the parser goes: no value of ours is
        raise ValueError("JSON nested too deeply") from None


def _int(x, lo: int, hi: int, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
        raise ValueError(f"{what} must be an integer in {lo}..{hi}, got {x!r}")
    return x


def count_value(x, what: str, hi: int = MAX_COUNT) -> int:
    """x, an integer in 0..hi (a count, a step, a worker id), or ValueError."""
    return _int(x, 0, hi, what)


def flag(payload: bytes) -> bool:
    """A key whose being there is the message (open/<r>, ack/<r>/<w>)."""
    if payload != b"1":
        raise ValueError(f"expected 1, got {payload[:20]!r}")
    return True


def text_int(lo: int, hi: int, what: str):
    """An integer written as text, in lo..hi."""
    def parse(payload: bytes) -> int:
        try:
            x = int(payload.decode("ascii"), 10)
        except (UnicodeDecodeError, ValueError):
            raise ValueError(f"{what} must be an integer, got {payload[:20]!r}") from None
        return _int(x, lo, hi, what)
    return parse


def worker_id(workers: int):
    return text_int(0, workers - 1, "a worker id")


def donor_value(workers: int):
    """donor/<ticket>: a worker id, or empty (no member to hand the state)."""
    def parse(payload: bytes) -> int | None:
        return None if payload == b"" else worker_id(workers)(payload)
    return parse


def json_dict(payload: bytes) -> dict:
    d = _json(payload)
    if not isinstance(d, dict):
        raise ValueError(f"expected a JSON object, got {type(d).__name__}")
    return d


def any_json(payload: bytes):
    return _json(payload)


def check_op(op: Op, workers: int) -> Op:
    """ValueError unless every field of op is one a worker could have sent."""
    if op.kind not in KINDS:
        raise ValueError(f"unknown op kind {op.kind!r}")
    if not isinstance(op.sizes, tuple) or len(op.sizes) > MAX_PIECES:
        raise ValueError("sizes must be a list of at most 65536 pieces")
    for n in op.sizes:
        _int(n, 1, MAX_ELEMS, "a piece's size")
    if sum(op.sizes) > MAX_OP_ELEMS:
        raise ValueError(f"an op of {sum(op.sizes)} elements in all, more than {MAX_OP_ELEMS}")
    if (op.kind == "shutdown") != (not op.sizes):
        raise ValueError(f"a {op.kind} op with {len(op.sizes)} piece(s)")
    if op.root is not None or op.kind == "broadcast":
        _int(op.root, 0, workers - 1, "a broadcast's root")
    if op.sync not in ("bsp", "wbsp") or op.bubble not in STRATEGIES \
            or op.downlink not in DOWNLINKS or not isinstance(op.average, bool):
        raise ValueError("sync, bubble, downlink or average out of their choices")
    fields = _json(op.early_close.encode()) if isinstance(op.early_close, str) else None
    names = {f.name for f in dataclasses.fields(EarlyCloseConfig)}
    if not isinstance(fields, dict) or not set(fields) <= names or not all(
            isinstance(v, str) or (isinstance(v, (int, float)) and not isinstance(v, bool)
                                   and math.isfinite(v)) for v in fields.values()):
        raise ValueError("early_close must be a JSON object of EarlyCloseConfig fields")
    EarlyCloseConfig(**fields)
    return op


def op_value(workers: int):
    """desc/<s>: an op's description (Op JSON)."""
    def parse(payload: bytes) -> Op:
        d = json_dict(payload)
        d["sizes"] = tuple(d.get("sizes", ()))
        return check_op(Op(**d), workers)
    return parse


def go_value(workers: int):
    """go/<s>: the barrier's value: the op, and the absent (worker ids, no repeats)."""
    def parse(payload: bytes) -> Go:
        d = json_dict(payload)
        absent = d.get("absent", [])
        if not isinstance(absent, list) or len(set(absent)) != len(absent):
            raise ValueError("absent must be a list of distinct worker ids")
        for w in absent:
            _int(w, 0, workers - 1, "an absent worker")
        o = op_value(workers)(json.dumps(d["op"]).encode())
        return Go(o, tuple(absent))
    return parse


def _ip(x, what: str) -> None:
    if x is None:
        return
    if not isinstance(x, str):
        raise ValueError(f"{what} must be an address, got {x!r}")
    try:
        ipaddress.ip_address(x)
    except ValueError:
        raise ValueError(f"{what} is not an address: {x[:40]!r}") from None


def run_value(payload: bytes) -> bytes:
    """run: a run id, 1..RUN_MAX printable ASCII bytes."""
    if not 0 < len(payload) <= RUN_MAX or not payload.isascii() or \
            not payload.decode().isprintable():
        raise ValueError(f"a run id is 1..{RUN_MAX} printable ASCII bytes, "
                         f"got {payload[:20]!r}")
    return payload


def meta_value(rank: int, servers: int):
    """meta/<rank>: a rank's record (its place, address, its link's fields)."""
    def parse(payload: bytes) -> dict:
        d = json_dict(payload)
        _int(d.get("rank"), rank, rank, "rank")
        role = "server" if rank < servers else "worker"
        if d.get("role") != role:
            raise ValueError(f"role must be {role}, got {d.get('role')!r}")
        if role == "server" and not isinstance(d.get("ip"), str):
            raise ValueError("a server's record must hold its address (ip)")
        _ip(d.get("ip"), "ip")
        shard_ips = d.get("shard_ips", [])
        if not isinstance(shard_ips, list) or \
                len(shard_ips) != (servers if role == "worker" and servers > 1 else 0):
            raise ValueError(f"shard_ips must list one address per server ({servers})")
        for ip in shard_ips:
            _ip(ip, "a shard_ips entry")
        for k in ("dev", "host"):
            if d.get(k) is not None and not isinstance(d[k], str):
                raise ValueError(f"{k} must be text")
        _int(d.get("pid", 0), 0, 1 << 31, "pid")
        if "port" in d:
            _int(d["port"], 0, 65535, "port")
        if "store_pubs" in d and (role != "server" or not isinstance(d["store_pubs"], list)):
            raise ValueError("store_pubs: a server's list of the workers' keys")
        if "chunk_bytes" in d:
            _int(d["chunk_bytes"], 1, 65535, "chunk_bytes")
        if d.get("compress", "none") not in COMPRESS:
            raise ValueError(f"compress must be one of {', '.join(COMPRESS)}")
        if d.get("downlink_code", "off") not in TABLE["downlink_code"].choices:
            raise ValueError("downlink_code out of its choices")
        if d.get("answers", "whole") not in ("whole", "tolerant"):
            raise ValueError("answers must be whole or tolerant")
        if not isinstance(d.get("signed", False), bool):
            raise ValueError("signed must be true or false")
        return d
    return parse
