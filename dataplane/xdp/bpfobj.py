# SPDX-License-Identifier: Apache-2.0
"""A compiled bcc module kept as bytes, and loaded again without a compiler.

bcc compiles C in four steps: it rewrites bcc's syntax (`map.lookup(&k)`
becomes a helper call on a placeholder fd), compiles with clang/LLVM,
creates the maps and writes each map's fd into the instructions that load it
(`ld_imm64` with src_reg BPF_PSEUDO_MAP_FD), then loads a function when asked.
The first two steps are the ~2 s of CPU a compile costs; the last two are
milliseconds. `extract` keeps what they need from a compiled module: every
table's kernel parameters (from the kernel, as bcc created them) and its key
and leaf descriptions (the JSON bcc makes its ctypes from), every function's
instructions with the map references listed instead of fds, the license.
`LoadedBpf` replays the last two steps: it creates the maps, writes their fds
into the instructions and loads functions through libbpf. It answers the
part of `bcc.BPF` LTP uses: `obj[b"name"]` (a table with `get_fd()`, `Key`,
`Leaf` and, per-CPU, `sLeaf`), `load_func(name, type).fd`, `tables`,
`cleanup()`.

What it does not replay, so `extract` refuses a module that needs it: BTF
(maps and programs load without it: no spin locks or kptrs), map types whose
user-space side bcc manages (perf buffers, program and map-in-map arrays),
and pseudo loads other than map fds and map values.
"""
from __future__ import annotations

import base64
import ctypes
import hashlib
import json
import os
import struct
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import clib
from .lookup import map_info

MAGIC = b"LTPXBPF1"
LD_IMM64 = 0x18                      # BPF_LD | BPF_DW | BPF_IMM
PSEUDO_MAP_FD, PSEUDO_MAP_VALUE = 1, 2
#: map types LoadedBpf can make like bcc: hash, array, program array (tail
#: calls: ltp_mux.c), per-CPU hash/array, LRU hash (and per-CPU), LPM trie,
#: queue, stack, ring buffer
MAP_TYPES = {1, 2, 3, 5, 6, 9, 10, 11, 22, 23, 27}
PERCPU_TYPES = {5, 6, 10}
PROG_NAME_LEN = 15                   # BPF_OBJ_NAME_LEN - 1: the kernel keeps this much


class Unsupported(Exception):
    """The module needs something LoadedBpf does not replay (bcc loads it as usual)."""


class CorruptEntry(Exception):
    """Bytes that are not a whole, well-formed artefact."""


@dataclass
class TableSpec:
    name: str            # bcc's name (obj[b"name"])
    kname: str           # the kernel's name (first 15 characters)
    type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    key_desc: str
    leaf_desc: str


@dataclass
class FuncSpec:
    insns: bytes                                  # map fds zeroed
    maps: list[tuple[int, int]] = field(default_factory=list)   # (insn index, table index)


@dataclass
class Artefact:
    license: str
    kern_version: int
    tables: list[TableSpec]
    functions: dict[str, FuncSpec]

    def to_bytes(self, meta: dict[str, Any]) -> bytes:
        """MAGIC, the sha256 of the JSON body, the body (with `meta` for people)."""
        body = json.dumps({
            "meta": meta, "license": self.license, "kern_version": self.kern_version,
            "tables": [asdict(t) for t in self.tables],
            "functions": {n: {"insns": base64.b64encode(f.insns).decode(),
                              "maps": [list(m) for m in f.maps]}
                          for n, f in self.functions.items()}}, sort_keys=True).encode()
        return MAGIC + b"\n" + hashlib.sha256(body).hexdigest().encode() + b"\n" + body

    @classmethod
    def from_bytes(cls, raw: bytes) -> tuple[Artefact, dict[str, Any]]:
        """(artefact, meta); CorruptEntry names what is wrong."""
        head, _, rest = raw.partition(b"\n")
        digest, _, body = rest.partition(b"\n")
        if head != MAGIC:
            raise CorruptEntry("not an artefact (bad magic)")
        if hashlib.sha256(body).hexdigest().encode() != digest:
            raise CorruptEntry("checksum mismatch (truncated or changed)")
        try:
            d = json.loads(body)
            tables = [TableSpec(**t) for t in d["tables"]]
            funcs = {n: FuncSpec(base64.b64decode(f["insns"], validate=True),
                                 [(int(i), int(t)) for i, t in f["maps"]])
                     for n, f in d["functions"].items()}
            art = cls(str(d["license"]), int(d["kern_version"]), tables, funcs)
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptEntry(f"malformed body: {e}") from None
        art.check()
        return art, d.get("meta", {})

    def check(self) -> None:
        """Every reference in range, every function whole instructions."""
        for name, f in self.functions.items():
            n = len(f.insns) // 8
            if not f.insns or len(f.insns) % 8:
                raise CorruptEntry(f"{name}: {len(f.insns)} bytes is not whole instructions")
            for i, t in f.maps:
                if not (0 <= i < n and 0 <= t < len(self.tables)) or f.insns[i * 8] != LD_IMM64:
                    raise CorruptEntry(f"{name}: map reference ({i}, {t}) out of place")


def extract(bpf) -> Artefact:
    """What LoadedBpf needs of a compiled bcc.BPF (its maps exist now)."""
    module = bpf.module
    tables, by_fd = [], {}
    for i, t in enumerate(clib.bcc_tables(module)):
        if t["fd"] < 0:
            raise Unsupported(f"table {t['name']} has no map of its own (extern or shared)")
        info = map_info(t["fd"])
        if info["type"] not in MAP_TYPES:
            raise Unsupported(f"table {t['name']} is of map type {info['type']}")
        tables.append(TableSpec(t["name"], info["name"], info["type"], info["key_size"],
                                info["value_size"], info["max_entries"], info["flags"],
                                t["key_desc"], t["leaf_desc"]))
        by_fd[t["fd"]] = i
    license, kern_version = clib.bcc_license(module)
    funcs = {name: _unlink(name, insns, by_fd)
             for name, insns in clib.bcc_functions(module).items()}
    return Artefact(license, kern_version, tables, funcs)


def _unlink(name: str, insns: bytes, by_fd: dict[int, int]) -> FuncSpec:
    """The instructions with every map fd replaced by 0 and listed by table."""
    buf, refs, i = bytearray(insns), [], 0
    while i < len(buf) // 8:
        code, regs, _, imm = struct.unpack_from("<BBhi", buf, i * 8)
        if code == LD_IMM64:
            src = regs >> 4
            if src in (PSEUDO_MAP_FD, PSEUDO_MAP_VALUE):
                if imm not in by_fd:
                    raise Unsupported(f"{name}: instruction {i} loads fd {imm}, no table's")
                refs.append((i, by_fd[imm]))
                struct.pack_into("<i", buf, i * 8 + 4, 0)
            elif src:
                raise Unsupported(f"{name}: instruction {i} is a pseudo load of kind {src}")
            i += 1                   # ld_imm64 takes two slots
        i += 1
    return FuncSpec(bytes(buf), refs)


class Table:
    """One map of a LoadedBpf, with bcc's ctypes for its key and value."""

    def __init__(self, spec: TableSpec, fd: int):
        # bcc's own decoder, so the ctypes equal a compile's; bcc is Debian's
        # python3-bpfcc, imported only where BPF objects are loaded
        from bcc import BPF  # noqa: PLC0415
        self.name, self.map_fd, self.ttype = spec.name, fd, spec.type
        self.max_entries, self.flags = spec.max_entries, spec.flags
        self.Key = BPF._decode_table_type(json.loads(spec.key_desc)) if spec.key_desc else None
        leaf = BPF._decode_table_type(json.loads(spec.leaf_desc)) if spec.leaf_desc else None
        self.Leaf = leaf
        if spec.type in PERCPU_TYPES and leaf is not None:
            self.sLeaf, self.Leaf = leaf, _percpu(leaf)

    def get_fd(self) -> int:
        return self.map_fd


def _percpu(leaf):
    """bcc's per-CPU value type: one slot per possible CPU, each 8-byte aligned."""
    ncpu = clib.num_possible_cpus()
    if ctypes.sizeof(leaf) % 8 == 0:
        return leaf * ncpu
    wide = {ctypes.c_uint: ctypes.c_uint64, ctypes.c_int: ctypes.c_int64}
    if leaf in wide:
        return wide[leaf] * ncpu
    raise Unsupported(f"per-CPU value of {ctypes.sizeof(leaf)} bytes (bcc has no type for it)")


class Function:
    def __init__(self, name: bytes, fd: int):
        self.name, self.fd = name, fd


class LoadedBpf:
    """An Artefact made live: its maps created now, functions loaded on request."""

    XDP, SCHED_CLS = 6, 3        # enum bpf_prog_type, as bcc.BPF names them

    def __init__(self, art: Artefact, origin: str = "cache"):
        self.art, self.origin = art, origin
        self.tables: dict[bytes, Table] = {}
        self.funcs: dict[bytes, Function] = {}
        self.map_fds: list[int] = []
        try:
            for t in art.tables:
                self.map_fds.append(clib.map_create(t.type, t.kname, t.key_size, t.value_size,
                                                    t.max_entries, t.flags))
        except BaseException:
            self.cleanup()
            raise

    def _index(self, name: str) -> int:
        for i, t in enumerate(self.art.tables):
            if t.name == name:
                return i
        raise KeyError(name)

    def __getitem__(self, key) -> Table:
        key = key.encode() if isinstance(key, str) else key
        if key not in self.tables:
            i = self._index(key.decode())
            self.tables[key] = Table(self.art.tables[i], self.map_fds[i])
        return self.tables[key]

    def load_func(self, name, prog_type: int) -> Function:
        name = name.encode() if isinstance(name, str) else name
        if name in self.funcs:
            return self.funcs[name]
        spec = self.art.functions.get(name.decode())
        if spec is None:
            raise KeyError(f"no function {name.decode()} in this program")
        buf = bytearray(spec.insns)
        for i, t in spec.maps:
            struct.pack_into("<i", buf, i * 8 + 4, self.map_fds[t])
        fd = clib.prog_load(prog_type, name.decode()[:PROG_NAME_LEN], self.art.license,
                            bytes(buf), self.art.kern_version)
        self.funcs[name] = Function(name, fd)
        return self.funcs[name]

    def cleanup(self) -> None:
        """Close every fd this object holds (what a link or pin holds stays)."""
        for fn in self.funcs.values():
            os.close(fn.fd)
        for fd in self.map_fds:
            os.close(fd)
        self.funcs, self.map_fds, self.tables = {}, [], {}
