# SPDX-License-Identifier: Apache-2.0
"""The compile cache: each BPF program compiled once per machine, reused by every process.

A key is the sha256 of everything the compiled bytes depend on: the source
and every header it includes from the -I folders (read now, recursively),
the cflags in order, the kernel release and its headers' folder, bcc's
version and the libbcc file (which carries clang), and this cache's format.
An entry (`<key>.bpfo`) is an `bpfobj.Artefact`: maps to create and
instructions to load, no compiler needed.

The cache lives in a root-owned folder (LTP_CACHE_DIR, else
/var/cache/ltpx) that no one else may write: what is in it gets loaded into
the kernel. Entries are written to a temporary file and renamed, so a reader
sees a whole entry or none; a per-key lock (flock, released by the kernel if
its holder dies) makes concurrent first compiles of one key one compile and
N-1 hits. An entry that is corrupt or does not load is removed and compiled
again; a folder that cannot be used (missing and not creatable, read-only,
writable by others) means compiling without a cache, with a note on the
`ltpx.bpfcache` logger. Hits, misses and recompiles are counted in
stats.json for `ltp doctor`.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from . import bpfobj

# the settings table's `cache_dir` (control/settings_table.py), spelled here:
# the dataplane sits below control and imports nothing of it
# (tests/test_settings_table.py checks the two agree)
ENV = "LTP_CACHE_DIR"
DEFAULT_DIR = "/var/cache/ltpx"
FORMAT = 1
SUFFIX = ".bpfo"
MAX_ENTRIES = 64          # the least recently used go beyond this
LOCK_WAIT_S = 300.0       # a compile that holds a key's lock longer is not waited for
STALE_TMP_S = 3600.0

log = logging.getLogger("ltpx.bpfcache")
#: what this process saw: hits, misses, recompiled (corrupt or unloadable
#: entries), uncached (compiled without the cache), and the notes
SESSION: dict[str, Any] = {"hits": 0, "misses": 0, "recompiled": 0, "uncached": 0,
                           "notes": []}
_INCLUDE = re.compile(rb'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


class Unusable(Exception):
    """The cache folder cannot be used; the message says why."""


def note(msg: str) -> None:
    SESSION["notes"].append(msg)
    log.warning(msg)


def safe_owner(st: os.stat_result) -> bool:
    """Whether a cached file (its stat) may be loaded: its owner is this
    user or root, and neither group nor others may write it."""
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022


def cache_dir() -> Path:
    return Path(os.environ.get(ENV) or DEFAULT_DIR)


# --- the key -----------------------------------------------------------------

def include_dirs(cflags: list[str]) -> list[Path]:
    out, it = [], iter(cflags)
    for f in it:
        if f == "-I":
            out.append(Path(next(it, "")))
        elif f.startswith("-I"):
            out.append(Path(f[2:]))
    return out


def _local(includer: Path, kind: bytes, name: bytes, dirs: list[Path]) -> Path | None:
    """The file an include names if it is the program's own: found next to
    its includer ("x") or in an -I folder; None for the kernel's and bcc's
    headers, which the toolchain part of the key covers."""
    where = ([includer.parent] if kind == b'"' else []) + dirs
    return next((d / name.decode() for d in where if (d / name.decode()).is_file()), None)


def sources(path: Path, cflags: list[str]) -> list[Path]:
    """`path` and every file of the program's own it includes (transitively)."""
    dirs, seen, todo = include_dirs(cflags), [], [Path(path)]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.append(p)
        for kind, name in _INCLUDE.findall(p.read_bytes()):
            found = _local(p, kind, name, dirs)
            if found is not None:
                todo.append(found.resolve())
    return seen


def program_text(path: Path, cflags: list[str]) -> bytes:
    """The text of `path` with the program's own headers written in where
    they are first included (a second include of one is left out, as its
    include guard would leave it empty), `#line` markers keeping the
    compiler's messages on the right file and line. bcc rewrites the map
    calls (`map.lookup(&k)`) of the text it is given, never those of a
    header it reads from disk: map calls in the program's headers work
    only when the headers come as part of that text."""
    dirs, done = include_dirs(cflags), set()

    def expand(p: Path) -> list[bytes]:
        done.add(p)
        out = [b'#line 1 "%s"\n' % str(p).encode()]
        for n, line in enumerate(p.read_bytes().splitlines(keepends=True), 1):
            line = line if line.endswith(b"\n") else line + b"\n"
            m = _INCLUDE.match(line)
            found = m and _local(p, m.group(1), m.group(2), dirs)
            if not found:
                out.append(line)
                continue
            found = found.resolve()
            if found not in done:
                out += expand(found)
            out.append(b'#line %d "%s"\n' % (n + 1, str(p).encode()))
        return out

    return b"".join(expand(Path(path).resolve()))


def _libbcc_file() -> str:
    """The libbcc this process mapped (bcc imported): path, size and mtime."""
    with contextlib.suppress(OSError), open("/proc/self/maps") as f:
        for line in f:
            if "libbcc.so" in line:
                p = line.split()[-1]
                st = os.stat(p)
                return f"{p}:{st.st_size}:{st.st_mtime_ns}"
    return "libbcc?"


def toolchain() -> dict[str, str]:
    import bcc  # noqa: PLC0415 - Debian's python3-bpfcc, there only where BPF is compiled
    release = os.uname().release
    return {"kernel": release, "headers": os.path.realpath(f"/lib/modules/{release}/build"),
            "bcc": str(getattr(bcc, "__version__", "?")), "libbcc": _libbcc_file(),
            "format": str(FORMAT)}


def cache_key(path: Path, cflags: list[str]) -> str:
    files = sources(Path(path), cflags)
    parts = {"toolchain": toolchain(), "cflags": list(cflags), "main": Path(path).name,
             "sources": [[str(p), hashlib.sha256(p.read_bytes()).hexdigest()] for p in files]}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


# --- the folder ----------------------------------------------------------------

class Cache:
    """A usable cache folder (Unusable if it is not)."""

    def __init__(self, directory: Path | str):
        self.dir = Path(directory)
        try:
            self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
            st = os.stat(self.dir)
        except OSError as e:
            raise Unusable(f"{self.dir}: {e.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise Unusable(f"{self.dir} is not a folder")
        if st.st_uid not in (0, os.geteuid()):
            raise Unusable(f"{self.dir} is owned by uid {st.st_uid}, not root")
        if st.st_mode & 0o022:
            raise Unusable(f"{self.dir} is writable by group or others "
                           f"(mode {st.st_mode & 0o777:o}): chmod go-w it")
        if not os.access(self.dir, os.W_OK | os.X_OK):
            raise Unusable(f"{self.dir} is not writable")

    def entry(self, key: str) -> Path:
        return self.dir / f"{key}{SUFFIX}"

    def get(self, key: str) -> bpfobj.Artefact | None:
        """The entry of `key`; None if there is none, or it was corrupt (then removed)."""
        p = self.entry(key)
        try:
            with open(p, "rb") as f:
                st = os.fstat(f.fileno())
                raw = f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            note(f"BPF cache entry {p.name} unreadable ({e.strerror}): compiling")
            return None
        try:
            if not safe_owner(st):
                raise bpfobj.CorruptEntry("not root's, or writable by others")
            art, meta = bpfobj.Artefact.from_bytes(raw)
            if meta.get("key") != key:
                raise bpfobj.CorruptEntry("made for another key")
        except bpfobj.CorruptEntry as e:
            self.discard(key, f"corrupt: {e}")
            return None
        with contextlib.suppress(OSError):
            os.utime(p)                  # recently used: pruned last
        return art

    def put(self, key: str, art: bpfobj.Artefact, meta: dict[str, Any]) -> None:
        raw = art.to_bytes({**meta, "key": key})
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".tmp-{key[:16]}-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(raw)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.entry(key))
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            note(f"BPF cache: writing {self.entry(key).name} failed ({e.strerror}); not cached")
            return
        self.prune()

    def discard(self, key: str, why: str) -> None:
        note(f"BPF cache entry {key[:16]}… {why}: compiling it again")
        SESSION["recompiled"] += 1
        self.record("recompiled")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.entry(key))

    def entries(self) -> list[Path]:
        return sorted(self.dir.glob(f"*{SUFFIX}"), key=lambda p: _mtime(p))

    def prune(self) -> None:
        """Beyond MAX_ENTRIES the least recently used go; so do stale temporary files
        and the locks of keys that have no entry."""
        now = time.time()
        entries = self.entries()
        for p in entries[:max(0, len(entries) - MAX_ENTRIES)]:
            with contextlib.suppress(OSError):
                p.unlink()
        for p in [*self.dir.glob(".tmp-*"), *self.dir.glob("*.lock")]:
            if now - _mtime(p) > STALE_TMP_S and not p.with_suffix(SUFFIX).exists():
                with contextlib.suppress(OSError):
                    p.unlink()

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[bool]:
        """Hold `key`'s compile lock (yields False if it could not be had in
        LOCK_WAIT_S: compile anyway)."""
        fd = os.open(self.dir / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline, held = time.monotonic() + LOCK_WAIT_S, False
            while not held:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held = True
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        note(f"BPF cache: waited {LOCK_WAIT_S:g} s for another compile of "
                             f"{key[:16]}…; compiling here too")
                        break
                    time.sleep(0.05)
            yield held
        finally:
            os.close(fd)

    def record(self, event: str) -> None:
        """Count `event` (hits, misses, recompiled) in stats.json, under its flock."""
        with contextlib.suppress(OSError):
            fd = os.open(self.dir / "stats.json", os.O_RDWR | os.O_CREAT, 0o644)
            with os.fdopen(fd, "r+") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                try:
                    stats = json.loads(f.read() or "{}")
                    assert isinstance(stats, dict)
                except (ValueError, AssertionError):
                    stats = {}
                stats.setdefault("since", time.strftime("%Y-%m-%dT%H:%M:%S"))
                stats[event] = int(stats.get(event, 0)) + 1
                f.seek(0)
                f.truncate()
                f.write(json.dumps(stats))

    def stats(self) -> dict[str, Any]:
        try:
            d = json.loads((self.dir / "stats.json").read_text() or "{}")
            return d if isinstance(d, dict) else {}
        except (OSError, ValueError):
            return {}


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def summary() -> dict[str, Any]:
    """For `ltp doctor`: the folder, whether it is usable, its entries and
    counts. Makes no folder: one not there yet is left to the first compile."""
    d = cache_dir()
    if not os.path.lexists(d):
        up = next(a for a in d.parents if os.path.lexists(a))
        return {"dir": str(d), "usable": up.is_dir(), "entries": 0, "bytes": 0, "stats": {},
                "reason": "" if up.is_dir() else f"{up} is not a folder",
                "session": dict(SESSION), "missing": True}
    try:
        c = Cache(d)
    except Unusable as e:
        return {"dir": str(d), "usable": False, "reason": str(e), "entries": 0, "bytes": 0,
                "stats": {}, "session": dict(SESSION)}
    entries = c.entries()
    return {"dir": str(d), "usable": True, "reason": "", "entries": len(entries),
            "bytes": sum(p.stat().st_size for p in entries if p.exists()),
            "stats": c.stats(), "session": dict(SESSION)}


# --- compile or load -----------------------------------------------------------

def obtain(path: Path, cflags: list[str], func: str, prog_type: int,
           compile_fn: Callable[[], Any]) -> tuple[Any, Any]:
    """(bpf, fn): `func` of bpf/<path> loaded as `prog_type`, from the cache
    when it holds the key, else compiled by `compile_fn` (a bcc.BPF) and
    stored. `bpf` is a bpfobj.LoadedBpf, or bcc's own object for a module
    the cache cannot replay or when the cache is unusable."""
    key = cache_key(path, cflags)
    try:
        cache = Cache(cache_dir())
    except Unusable as e:
        note(f"BPF compile cache unusable ({e}): compiling {Path(path).name}")
        SESSION["uncached"] += 1
        b = compile_fn()
        return b, b.load_func(func.encode(), prog_type)
    got = _hit(cache, key, func, prog_type)
    if got is None:
        with cache.lock(key):
            got = _hit(cache, key, func, prog_type)  # compiled meanwhile by the lock's holder
            if got is None:
                meta = {"source": Path(path).name, "cflags": list(cflags), **toolchain(),
                        "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
                got = _compile(cache, key, meta, func, prog_type, compile_fn)
    return got


def _hit(cache: Cache, key: str, func: str, prog_type: int):
    """(obj, fn) from the entry of `key`; None if there is none or it does
    not load (then it is removed). Out of memory or privilege is raised."""
    art = cache.get(key)
    if art is None:
        return None
    obj = None
    try:
        obj = bpfobj.LoadedBpf(art, origin="hit")
        fn = obj.load_func(func, prog_type)
    except OSError as e:
        if obj is not None:
            obj.cleanup()
        if e.errno in (errno.ENOMEM, errno.EPERM):
            raise
        cache.discard(key, f"did not load ({e.strerror})")
        return None
    except BaseException:
        if obj is not None:
            obj.cleanup()
        raise
    SESSION["hits"] += 1
    cache.record("hits")
    return obj, fn


def _compile(cache: Cache, key: str, meta: dict, func: str, prog_type: int,
             compile_fn: Callable[[], Any]):
    b = compile_fn()
    try:
        art = bpfobj.extract(b)
    except bpfobj.Unsupported as e:
        note(f"{meta['source']} is not cacheable ({e}): loaded through bcc")
        SESSION["uncached"] += 1
        return b, b.load_func(func.encode(), prog_type)
    b.cleanup()                      # its maps go before ours are made (ltp_mem can be large)
    obj = bpfobj.LoadedBpf(art, origin="miss")
    try:
        fn = obj.load_func(func, prog_type)
    except OSError as e:             # the kernel wants what bcc gives and we do not
        obj.cleanup()
        note(f"{meta['source']} loads only through bcc ({e}); not cached")
        SESSION["uncached"] += 1
        b = compile_fn()
        return b, b.load_func(func.encode(), prog_type)
    cache.put(key, art, meta)
    SESSION["misses"] += 1
    cache.record("misses")
    return obj, fn
