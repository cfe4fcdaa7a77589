# SPDX-License-Identifier: Apache-2.0
"""The job key: one secret per job, handed to each rank in a file, never through the store.

Whoever starts every rank (`ltp launch`, `ltp train`, the benches) makes a
key (`new_key`), writes it to a file only its owner may read (`KeyFile`:
mode 0600 in a fresh 0700 folder) and names the file to each rank in
LTP_SECRET_FILE; on real hosts an operator does the same with a mounted
secret (docs/deploy.md). `read_key_file` refuses a file that group or others
may read. The key itself is used for nothing: every use takes a key of its
own derived from it (`derive`, HMAC-SHA256 with the use's name), so the
round tokens' secret (`token_secret`, per server shard), the store's
value MACs (`store_key`) and the TCP transport's hellos (`hello_key`)
say nothing of each other or of the job key.

The file holds the key as hex text (at least 32 digits: 16 bytes), as
`openssl rand -hex 32` writes it.

Only server ranks get the job key. Each worker gets a member key file
(`member_keys`, `member_text`; `RankKeys` writes them for a launcher, `ltp
key member` for an operator): a small JSON object, versioned
({"ltpx_member_key": 1, ...}), holding what worker w needs and nothing
from which the job key or another worker's keys follow: its id, its own
flow tokens' key per server shard (tokens.member_key), the group key per
shard where the job's downlink is `group` (tokens.group_key), each shard's
public answer key (tokens.answer_pub: it checks the server's signature on
each answer, trust/signing.py), its own store signing seed and the
server's public store key (control/trust/storeauth.py: each rank signs the store
values it writes), the job's shared MAC key of the training job's own
values (`store_key`, control/training/context.py) and its own TCP hello key
(accept.worker_key). `read_key_file`
reads either kind (a `MemberKeys` for a member file); `token_secret`,
`store_auth`, `store_key` and `hello_key` take either. The shared store key
seals only the built-in training job's result values: ltpx.torch's
coordination values are signed by their writer (docs/operations.md,
"Threat model").

One key file serves many runs (a job restarted, trained again), so what is
derived from it is bound to one run: the run's id goes into every round
token, answer signature, store value signature and TCP hello, and what was
recorded in one run is refused in another. The id (`given_run`):
LTP_RUN_ID where a launcher (`ltp launch`, `ltp train`: one per job) or an
operator sets it, else torchrun's run id (--rdzv-id) unless it is
torchrun's default "none"; else the job's rank 0 draws one (`new_run`) and
every rank takes it from the store (torchapi/job.py, agree_run).
Importing this module needs neither torch nor numpy (the launcher uses it).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import shutil
import stat
import tempfile
from typing import NamedTuple

from ...errors import UsageError
from .. import settings_table
from . import storeauth, tokens
from .hello import HelloKey, worker_key

ENV = settings_table.TABLE["secret_file"].env      # LTP_SECRET_FILE
RUN_ENV = settings_table.TABLE["run_id"].env        # LTP_RUN_ID: this run's id (run_from_env)
TORCHRUN_RUN = "TORCHELASTIC_RUN_ID"   # torchrun's --rdzv-id; "none" unless one is given
KEY_BYTES = 32          # what new_key makes
MIN_BYTES = 16          # the least a key file may hold
MAX_BYTES = 512
MEMBER_FORMAT = "ltpx_member_key"   # a member file's JSON names its version under this
MEMBER_VERSION = 1
MEMBER_MAX = 65536      # the most a member file may hold (bytes)


class MemberKeys(NamedTuple):
    """What a worker's member key file holds (see the module's doc)."""

    worker: int
    tokens: tuple[bytes, ...]          # its member key under each server shard's secret
    group: tuple[bytes, ...] | None    # the group key of each shard (the group downlink)
    store: bytes                       # the store values' MAC key (shared by the job)
    hello: bytes                       # its own TCP hello key (accept.worker_key)
    sign: tuple[bytes, ...] = ()       # each shard's public answer key (trust/signing.py)
    store_sign: bytes = b""            # its own store signing seed (control/trust/storeauth.py)
    store_pub: bytes = b""             # the server's store signing key (public)

    def __repr__(self) -> str:      # no key material in a log line or a traceback
        return (f"MemberKeys(worker={self.worker}, shards={len(self.tokens)}, "
                f"group={self.group is not None})")


def new_key() -> bytes:
    """A fresh job key from the system's CSPRNG."""
    return secrets.token_bytes(KEY_BYTES)


def check_run(text: str, where: str = RUN_ENV) -> bytes:
    """A run id given as text, as bytes; UsageError naming `where` unless it
    is 1..tokens.RUN_MAX bytes of printable ASCII."""
    raw = text.encode("utf-8", "replace")
    if not 0 < len(raw) <= tokens.RUN_MAX or not text.isascii() or not text.isprintable():
        raise UsageError(f"{where}={text[:40]!r}: a run id is 1..{tokens.RUN_MAX} printable "
                         "ASCII characters (e.g. `openssl rand -hex 8`)")
    return raw


def given_run(run_id: str | None, environ=None) -> bytes | None:
    """This run's id where one is given (the module's doc): `run_id` (the
    run_id setting, LTP_RUN_ID), else torchrun's run id unless it is
    "none"; None: rank 0 draws one."""
    env = os.environ if environ is None else environ
    if run_id:
        return check_run(run_id, f"run_id ({RUN_ENV})")
    if env.get(TORCHRUN_RUN, "none") not in ("", "none"):
        return check_run(env[TORCHRUN_RUN], TORCHRUN_RUN)
    return None


def new_run() -> str:
    """A fresh run id (16 hex digits from the system's CSPRNG)."""
    return secrets.token_hex(8)


def derive(key: bytes, use: str) -> bytes:
    """The 32-byte key of one use of the job key (HMAC-SHA256 of the use's name)."""
    return hmac.new(key, b"ltpx-key/" + use.encode(), hashlib.sha256).digest()


def token_secret(key, shard: int = 0, run: bytes = b""):
    """The round tokens' secret of server shard `shard` (tokens.RoundTokens'
    key) in run `run` (tokens.bind); None without a job key (tokens off);
    from MemberKeys, that worker's tokens.MemberSecret of the shard."""
    if isinstance(key, MemberKeys):
        if not 0 <= shard < len(key.tokens):
            raise UsageError(f"worker {key.worker}'s member key file holds keys for "
                             f"{len(key.tokens)} server(s), not for server {shard}: make it "
                             f"for the job's servers (`ltp key member --servers S`)")
        return tokens.bind(tokens.MemberSecret(key.worker, key.tokens[shard],
                                               key.group[shard] if key.group else None,
                                               key.sign[shard]), run)
    return None if key is None else tokens.bind(derive(key, f"tokens/{shard}"), run)


def store_key(key) -> bytes | None:
    """The key of the store values' MACs (trust/sealing.py)."""
    if isinstance(key, MemberKeys):
        return key.store
    return None if key is None else derive(key, "store")


def store_auth(key, worker: int | None = None,
               run: bytes = b"") -> storeauth.StoreAuth | None:
    """This rank's store identity (control/trust/storeauth.py) in run `run`:
    worker w's from its member file; from the job key, the server's (worker
    None) or worker `worker`'s, either able to check every writer; None
    without a key."""
    if isinstance(key, MemberKeys):
        return storeauth.StoreAuth.member(key.worker, key.store_sign, key.store_pub, run)
    return None if key is None else storeauth.StoreAuth.from_job_key(key, worker, run)


def hello_key(key, run: bytes = b"") -> HelloKey | None:
    """The key of the TCP transport's hello MACs in run `run`
    (control/accept.py); from MemberKeys, that worker's own hello key."""
    if isinstance(key, MemberKeys):
        return HelloKey(key.hello, key.worker, run)
    return None if key is None else HelloKey(derive(key, "tcp-hello"), None, run)


def member_keys(key: bytes, worker: int, servers: int = 1, group: bool = True) -> MemberKeys:
    """Worker `worker`'s MemberKeys under job key `key`, for a job of
    `servers` server shards; group: it holds the group keys (the group downlink)."""
    if not 0 <= worker < storeauth.SERVER:
        raise UsageError(f"a worker id is 0..{storeauth.SERVER - 1}, got {worker}")
    secrets_ = [token_secret(key, i) for i in range(servers)]
    return MemberKeys(worker, tuple(tokens.member_key(s, worker) for s in secrets_),
                      tuple(tokens.group_key(s) for s in secrets_) if group else None,
                      store_key(key), worker_key(hello_key(key).key, worker),
                      tuple(tokens.answer_pub(s) for s in secrets_),
                      storeauth.seed(key, worker),
                      storeauth.public(storeauth.seed(key, storeauth.SERVER)))


def member_text(m: MemberKeys) -> str:
    """A member key file's text (JSON, one line)."""
    doc = {MEMBER_FORMAT: MEMBER_VERSION, "worker": m.worker,
           "tokens": [k.hex() for k in m.tokens], "store": m.store.hex(), "hello": m.hello.hex(),
           "sign": [k.hex() for k in m.sign], "store_sign": m.store_sign.hex(),
           "store_pub": m.store_pub.hex()}
    if m.group is not None:
        doc["group"] = [k.hex() for k in m.group]
    return json.dumps(doc) + "\n"


def parse_member(text: str, where: str) -> MemberKeys:
    """MemberKeys from a member file's text; UsageError (naming `where`) for anything else."""
    fix = "make it again with `ltp key member --worker W JOBKEYFILE`"
    try:
        doc = json.loads(text)
    except ValueError:
        raise UsageError(f"{where}: not a member key file (bad JSON): {fix}") from None
    if not isinstance(doc, dict) or doc.get(MEMBER_FORMAT) != MEMBER_VERSION:
        raise UsageError(f"{where}: a member key file must say "
                         f'"{MEMBER_FORMAT}": {MEMBER_VERSION}, got '
                         f"{doc.get(MEMBER_FORMAT) if isinstance(doc, dict) else doc!r}: {fix}")

    def keys(name: str, many: bool):
        v = doc.get(name)
        vs = v if many else [v]
        try:    # (no token keys: a job without LTP servers, e.g. gloo's)
            out = [bytes.fromhex(x) for x in vs]
        except (TypeError, ValueError):
            out = None
        if out is None or any(len(k) != 32 for k in out) or not many and not out or \
                many and not isinstance(v, list):
            raise UsageError(f"{where}: the member key file's {name!r} must be "
                             f"{'a list of ' if many else ''}32-byte hex keys: {fix}")
        return tuple(out) if many else out[0]
    w = doc.get("worker")
    if not isinstance(w, int) or isinstance(w, bool) or not 0 <= w < storeauth.SERVER:
        raise UsageError(f"{where}: the member key file's 'worker' must be 0..65534, "
                         f"got {w!r}: {fix}")
    toks = keys("tokens", True)
    group = keys("group", True) if "group" in doc else None
    if group is not None and len(group) != len(toks):
        raise UsageError(f"{where}: the member key file has {len(toks)} token keys and "
                         f"{len(group)} group keys: {fix}")
    sign = keys("sign", True)
    if len(sign) != len(toks):
        raise UsageError(f"{where}: the member key file has {len(toks)} token keys and "
                         f"{len(sign)} server answer keys ('sign'): {fix}")
    return MemberKeys(w, toks, group, keys("store", False), keys("hello", False), sign,
                      keys("store_sign", False), keys("store_pub", False))


def check_member(key, server: bool, worker: int | None, servers: int) -> None:
    """UsageError unless a rank (a server, or worker `worker` of a job of
    `servers` shards) may use `key` (a job key, a member file's, or None)."""
    if not isinstance(key, MemberKeys):
        return
    if server:
        raise UsageError(f"{ENV} names worker {key.worker}'s member key file, but this rank "
                         "is a server: a server rank needs the job key file (hex)")
    if key.worker != worker:
        raise UsageError(f"{ENV} names worker {key.worker}'s member key file, but this rank "
                         f"is worker {worker}: give each worker its own file "
                         f"(`ltp key member --worker {worker} JOBKEYFILE`)")
    if servers and len(key.tokens) < servers:
        token_secret(key, servers - 1)      # raises, naming the fix


def read_key_file(path: str, where: str = ENV) -> bytes | MemberKeys:
    """The key in file `path` (MemberKeys for a member key file); UsageError
    naming the file and the fix when it is missing, readable by group or
    others, or neither hex of MIN_BYTES..MAX_BYTES nor a member file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise UsageError(f"{where}={path}: cannot open the job key file: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UsageError(f"{where}={path}: the job key file is mode "
                             f"{stat.S_IMODE(st.st_mode):04o}: group or others may read it; "
                             f"`chmod 600 {path}` (a Kubernetes secret volume: "
                             "defaultMode: 0400)")
        raw = os.read(fd, MEMBER_MAX + 1)
    finally:
        os.close(fd)
    if raw.lstrip().startswith(b"{"):
        if len(raw) > MEMBER_MAX:
            raise UsageError(f"{where}={path}: a member key file is at most {MEMBER_MAX} bytes")
        return parse_member(raw.decode("utf-8", "replace"), f"{where}={path}")
    try:
        key = bytes.fromhex(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise UsageError(f"{where}={path}: the job key file must hold the key as hex "
                         "(`openssl rand -hex 32 > FILE`), or be a worker's member key file "
                         "(`ltp key member`)") from None
    if not MIN_BYTES <= len(key) <= MAX_BYTES:
        raise UsageError(f"{where}={path}: the job key is {len(key)} bytes; it must be "
                         f"{MIN_BYTES}..{MAX_BYTES} (`openssl rand -hex 32 > FILE`)")
    return key


def key_from_env(environ=None) -> bytes | MemberKeys | None:
    """The key LTP_SECRET_FILE names, or None when it is unset."""
    path = settings_table.env("secret_file", environ)
    return read_key_file(path) if path else None


def write_private(path: str, text: str) -> None:
    """A new file at `path` holding `text`, mode 0600 from its creation."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


class KeyFile:
    """A job key in a file of its own: mode 0600 in a fresh 0700 folder,
    removed (folder and all) by close(). `path` names it to the ranks
    (servers); `member_path(w)` writes worker w's member file beside it."""

    def __init__(self, key: bytes | None = None, write: bool = True):
        self.key = new_key() if key is None else key
        self.folder = tempfile.mkdtemp(prefix="ltp-key-")    # 0700
        self.path = os.path.join(self.folder, "job.key")
        if write:
            write_private(self.path, self.key.hex() + "\n")

    def member_path(self, worker: int, servers: int = 1, group: bool = True) -> str:
        """Worker `worker`'s member key file (written at the first call)."""
        path = os.path.join(self.folder, f"worker{worker}.key")
        if not os.path.exists(path):
            write_private(path, member_text(member_keys(self.key, worker, servers, group)))
        return path

    def close(self) -> None:
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = ""

    def __enter__(self) -> KeyFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def for_launch(environ=None) -> tuple[str, KeyFile | None]:
    """The key file a launcher hands its ranks: the one LTP_SECRET_FILE names
    (checked here, so a bad one fails before any rank starts), else a new
    KeyFile the caller closes when the job ends."""
    path = settings_table.env("secret_file", environ)
    if path:
        if isinstance(read_key_file(path), MemberKeys):
            raise UsageError(f"{ENV}={path} is a worker's member key file: a launcher needs "
                             "the job key file (`openssl rand -hex 32`)")
        return path, None
    kf = KeyFile()
    return kf.path, kf


class RankKeys:
    """The key files a launcher hands its ranks: servers the job key's
    (for_launch: LTP_SECRET_FILE's or a new one), each worker a member file
    of its own, made for `servers` shards, with the group keys if `group`.
    close() removes what it made."""

    def __init__(self, servers: int = 1, group: bool = True, environ=None):
        self.servers, self.group = servers, group
        self.job_path, self.made = for_launch(environ)
        key = self.made.key if self.made else read_key_file(self.job_path)
        self.members = self.made or KeyFile(key, write=False)

    def path(self, role: str, worker: int) -> str:
        """The file rank (role, worker index) is told in LTP_SECRET_FILE."""
        if role == "server":
            return self.job_path
        return self.members.member_path(worker, self.servers, self.group)

    def close(self) -> None:
        self.members.close()
