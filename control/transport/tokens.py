# SPDX-License-Identifier: Apache-2.0
"""Round tokens: what stops a host off the path from forging a job's packets.

A job has one secret (SECRET_BYTES random bytes: `new_secret`; ltpx.torch's
ranks each derive theirs from the job key in their LTP_SECRET_FILE,
control/jobkey.py: it never crosses the network or the rendezvous store).
Every member derives each round's token from it, a keyed BLAKE2b of (job,
round) cut to 64 bits, so no round needs an exchange of its own, and the
token of one round, seen on the path, says nothing of another's. A receiver
writes the token into the round's bank as it opens it, a sender into its tx
state as it starts the round; the XDP program compares the header's token
with them (a constant-size compare, no crypto in BPF) and drops the rest as
`bad_token`. A blind spoofer must guess 64 bits per packet.

Without a secret every token is 0, on the wire and in the maps: the job
cookie is then the only check (wire version 1's protection, none against a
spoofer who reads the cookie off one packet), and the first such endpoint of
a process warns (`UnprotectedWarning`).
"""
from __future__ import annotations

import hashlib
import secrets
import struct
import warnings

SECRET_BYTES = 16          # 128 bits: the least a secret may have
SECRET_MAX = 64            # BLAKE2b's longest key
_PERSON = b"ltpx-round-tok"  # keeps these digests apart from any other use of the key


class UnprotectedWarning(UserWarning):
    """An endpoint runs without a job secret: blind spoofers are not stopped."""


def new_secret() -> bytes:
    """A fresh job secret (SECRET_BYTES from the system's CSPRNG)."""
    return secrets.token_bytes(SECRET_BYTES)


def check_secret(secret) -> bytes | None:
    """`secret` as bytes (None stays None); TypeError/ValueError if it is
    not SECRET_BYTES..SECRET_MAX bytes."""
    if secret is None:
        return None
    if not isinstance(secret, (bytes, bytearray, memoryview)):
        raise TypeError(f"secret must be bytes (e.g. tokens.new_secret()), got "
                        f"{type(secret).__name__}")
    secret = bytes(secret)
    if not SECRET_BYTES <= len(secret) <= SECRET_MAX:
        raise ValueError(f"secret must be {SECRET_BYTES}..{SECRET_MAX} bytes, got "
                         f"{len(secret)}: make one with tokens.new_secret()")
    return secret


def derive(secret: bytes | None, job: int, round_: int) -> int:
    """The token of `round_` of `job`: 0 without a secret, else a nonzero
    64-bit value (0 is kept for "no secret", so no derived token equals it)."""
    if secret is None:
        return 0
    msg = struct.pack("!II", job % 2**32, round_ % 2**32)
    digest = hashlib.blake2b(msg, digest_size=8, key=secret, person=_PERSON).digest()
    return int.from_bytes(digest, "big") or 1


class RoundTokens:
    """One endpoint's tokens: `tokens(round_)` is that round's token."""

    _warned = False  # once per process: one line, not one per endpoint

    def __init__(self, secret, job: int, where: str = "endpoint"):
        self.secret, self.job = check_secret(secret), job
        if self.secret is None and not RoundTokens._warned:
            RoundTokens._warned = True
            warnings.warn(f"{where} has no secret: its rounds carry token 0 and only the job "
                          "cookie is checked, so a host that can send to it can forge its "
                          "DATA and ACKs; pass secret=tokens.new_secret(), shared by every "
                          "member of the job", UnprotectedWarning, stacklevel=3)

    @property
    def protected(self) -> bool:
        return self.secret is not None

    def __call__(self, round_: int) -> int:
        return derive(self.secret, self.job, round_)
