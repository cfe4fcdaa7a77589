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
`openssl rand -hex 32` writes it. Importing this module needs neither
torch nor numpy (the launcher uses it).
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import shutil
import stat
import tempfile

from ..errors import UsageError

ENV = "LTP_SECRET_FILE"
KEY_BYTES = 32          # what new_key makes
MIN_BYTES = 16          # the least a key file may hold
MAX_BYTES = 512


def new_key() -> bytes:
    """A fresh job key from the system's CSPRNG."""
    return secrets.token_bytes(KEY_BYTES)


def derive(key: bytes, use: str) -> bytes:
    """The 32-byte key of one use of the job key (HMAC-SHA256 of the use's name)."""
    return hmac.new(key, b"ltpx-key/" + use.encode(), hashlib.sha256).digest()


def token_secret(key: bytes | None, shard: int = 0) -> bytes | None:
    """The round tokens' secret of server shard `shard` (tokens.RoundTokens'
    key); None without a job key (tokens off)."""
    return None if key is None else derive(key, f"tokens/{shard}")


def store_key(key: bytes | None) -> bytes | None:
    """The key of the store values' MACs (torchapi/sealed.py)."""
    return None if key is None else derive(key, "store")


def hello_key(key: bytes | None) -> bytes | None:
    """The key of the TCP transport's hello MACs (control/accept.py)."""
    return None if key is None else derive(key, "tcp-hello")


def read_key_file(path: str, where: str = ENV) -> bytes:
    """The key in file `path`; UsageError naming the file and the fix when it
    is missing, readable by group or others, or not hex of MIN_BYTES..MAX_BYTES."""
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
        raw = os.read(fd, 4 * MAX_BYTES)
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise UsageError(f"{where}={path}: the job key file must hold the key as hex "
                         "(`openssl rand -hex 32 > FILE`)") from None
    if not MIN_BYTES <= len(key) <= MAX_BYTES:
        raise UsageError(f"{where}={path}: the job key is {len(key)} bytes; it must be "
                         f"{MIN_BYTES}..{MAX_BYTES} (`openssl rand -hex 32 > FILE`)")
    return key


def key_from_env(environ=None) -> bytes | None:
    """The key LTP_SECRET_FILE names, or None when it is unset."""
    path = (os.environ if environ is None else environ).get(ENV)
    return read_key_file(path) if path else None


class KeyFile:
    """A job key in a file of its own: mode 0600 in a fresh 0700 folder,
    removed (folder and all) by close(). `path` names it to the ranks."""

    def __init__(self, key: bytes | None = None):
        self.key = new_key() if key is None else key
        self.folder = tempfile.mkdtemp(prefix="ltp-key-")    # 0700
        self.path = os.path.join(self.folder, "job.key")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.key.hex() + "\n")

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
    path = (os.environ if environ is None else environ).get(ENV)
    if path:
        read_key_file(path)
        return path, None
    kf = KeyFile()
    return kf.path, kf
