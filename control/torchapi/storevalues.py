# SPDX-License-Identifier: Apache-2.0
"""What each value in the rendezvous store must hold: the parsers a reader
hands trust/sealing.py's `Seal.read` (types, ranges, worker ids within the
job, an op's sizes, a rank's address). A value that does not parse is
refused with a StoreValueError naming its key. Who may write which key,
and the signatures, are trust/sealing.py's.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import math

from ..settings_table import DOWNLINKS, TABLE
from ..transport.bubble import STRATEGIES
from ..transport.early_close import EarlyCloseConfig
from ..trust.tokens import RUN_MAX
from .ops import KINDS, WIRES, Go, Op

MAX_PIECES = 1 << 16        # uplink rounds one op may have
MAX_ELEMS = (1 << 31) - 1   # float32 elements of one piece
MAX_COUNT = 1 << 40         # a k, a counter's value
MAX_OP_ELEMS = 1 << 31      # float32 elements of one op, all its pieces together
MAX_JSON = 8 << 20          # bytes of one JSON value: TCPStore's own limit on a value


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
    """A key whose being there is the message (open/<r>)."""
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
            or op.downlink not in DOWNLINKS or not isinstance(op.average, bool) \
            or op.wire not in WIRES or (op.wire != "none" and op.kind != "step") \
            or not isinstance(op.carry, bool) or (op.carry and op.wire not in ("bf16", "fp16")):
        raise ValueError("sync, bubble, downlink, average, wire or carry out of their choices")
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
        if "ltp_port" in d:
            _int(d["ltp_port"], 1, 65535, "ltp_port")
        if not isinstance(d.get("shared", False), bool):
            raise ValueError("shared must be true or false")
        unix = d.get("unix")
        if unix is not None and (role != "server" or not isinstance(unix, str) or
                                 not unix.startswith("/") or len(unix.encode()) > 107):
            raise ValueError("unix: a server's socket path (absolute, at most 107 bytes)")
        if "netns_id" in d:
            _int(d["netns_id"], 0, 1 << 63, "netns_id")
        if "store_pubs" in d and (role != "server" or not isinstance(d["store_pubs"], list)):
            raise ValueError("store_pubs: a server's list of the workers' keys")
        if "chunk_bytes" in d:
            _int(d["chunk_bytes"], 1, 65535, "chunk_bytes")
        if d.get("compress", "auto") not in TABLE["compress"].choices:
            raise ValueError(f"compress must be one of {', '.join(TABLE['compress'].choices)}")
        if d.get("downlink_code", "off") not in TABLE["downlink_code"].choices:
            raise ValueError("downlink_code out of its choices")
        if d.get("answers", "whole") not in ("whole", "tolerant"):
            raise ValueError("answers must be whole or tolerant")
        if not isinstance(d.get("signed", False), bool):
            raise ValueError("signed must be true or false")
        return d
    return parse
