# SPDX-License-Identifier: Apache-2.0
"""Flow tokens: what stops a host off the path, or a member holding only its
own key, from forging a job's packets.

A job has one secret (SECRET_BYTES random bytes: `new_secret`; ltpx.torch's
ranks each derive theirs from the job key in their LTP_SECRET_FILE,
control/trust/jobkey.py: it never crosses the network or the rendezvous store).
From it each worker w has a key of its own (`member_key`, a keyed BLAKE2b of
w), and each round of each flow a token: a keyed BLAKE2b of (job, round,
kind) under the worker's key, cut to 64 bits, so no round needs an exchange.
The kind is the frame's direction and role: UP (worker w's DATA to the
server), UP_ACK (the server's ACK of it), DOWN (the server's DATA to w: a
downlink answer), DOWN_ACK (w's ACK of that). So a token seen on the wire
serves neither another round, nor another worker, nor the other direction,
and a member given only its own key (`member`, MemberSecret) cannot write
another worker's chunks, close another's push, or answer another worker.
DATA flagged GROUP (one frame to every worker) carries the round's GROUP
token, made under the job's group key (`group_key`, derived from the job
secret): only endpoints holding it accept group frames. A member is handed
it (`member(secret, w, group=True)`) when the job's downlink is `group`;
then any member can also send GROUP frames (one shared token cannot prove
the server), so the server signs each answer and a worker uses none whose
signature does not verify (signing.py; the public key is `answer_pub`, in
every member's MemberSecret). A forging member can then deny a worker its
answer, not change it; a job that must bind every frame to its sender runs
`--downlink unicast` and hands no group key. A member's endpoint without it
refuses GROUP frames, and the server's repair re-sends to it alone then
reach it.

A receiver writes each slot's (DATA, ACK) tokens into the round's bank as it
opens it (ltp_slottok) and the XDP program writes the ACK's into each ACK it
builds; a sender writes the ACK token it expects, and its DATA token for the
ACK clock, into its tx state. The program compares 8 bytes (no crypto in
BPF) and drops the rest as `bad_token`. A blind spoofer must guess 64 bits
per packet.

A secret may be bound to one run of the job (`bind`: a RunSecret, or a
MemberSecret with its `run`): the run's id then goes into every token and
answer signature it makes, so a frame or an answer recorded in an earlier
run under the same secret (the documented setup reuses one key file) is not
taken in a later one: a replayed frame is a `bad_token`. control/trust/jobkey.py
says where a run's id comes from.

Without a secret every token is 0, on the wire and in the maps: the job
cookie is then the only check (wire version 1's protection, none against a
spoofer who reads the cookie off one packet), and the first such endpoint of
a process warns (`UnprotectedWarning`).
"""
from __future__ import annotations

import functools
import hashlib
import secrets
import struct
import warnings
from typing import NamedTuple

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .storeauth import private, public

SECRET_BYTES = 16          # 128 bits: the least a secret may have
SECRET_MAX = 64            # BLAKE2b's longest key
_PERSON = b"ltpx-round-tok"  # keeps these digests apart from any other use of the key


class UnprotectedWarning(UserWarning):
    """An endpoint runs without a job secret: blind spoofers are not stopped."""


def new_secret() -> bytes:
    """A fresh job secret (SECRET_BYTES from the system's CSPRNG)."""
    return secrets.token_bytes(SECRET_BYTES)


RUN_MAX = 128              # the longest run id (bytes)


def check_run(run) -> bytes:
    """A run id as bytes: TypeError/ValueError unless it is at most RUN_MAX bytes."""
    if not isinstance(run, (bytes, bytearray)):
        raise TypeError(f"a run id is bytes, got {type(run).__name__}")
    if len(run) > RUN_MAX:
        raise ValueError(f"a run id is at most {RUN_MAX} bytes, got {len(run)}")
    return bytes(run)


def check_secret(secret):
    """`secret` as bytes (None stays None, a MemberSecret or RunSecret stays
    one); TypeError/ValueError if it is not SECRET_BYTES..SECRET_MAX bytes."""
    if secret is None:
        return None
    if isinstance(secret, RunSecret):
        return RunSecret(check_secret(secret.secret), check_run(secret.run))
    if isinstance(secret, MemberSecret):
        check_run(secret.run)
        for k in (secret.key, secret.group or bytes(32), secret.server_pub or bytes(32)):
            if not (isinstance(k, bytes) and len(k) == 32):
                raise ValueError("a member secret's keys must be 32 bytes: make it with "
                                 "tokens.member(secret, worker)")
        return secret
    if not isinstance(secret, (bytes, bytearray, memoryview)):
        raise TypeError(f"secret must be bytes (e.g. tokens.new_secret()), got "
                        f"{type(secret).__name__}")
    secret = bytes(secret)
    if not SECRET_BYTES <= len(secret) <= SECRET_MAX:
        raise ValueError(f"secret must be {SECRET_BYTES}..{SECRET_MAX} bytes, got "
                         f"{len(secret)}: make one with tokens.new_secret()")
    return secret


UP, UP_ACK, DOWN, DOWN_ACK, GROUP = 1, 2, 3, 4, 5   # token kinds (see the module's doc)
KINDS = (UP, UP_ACK, DOWN, DOWN_ACK, GROUP)
_MEMBER = b"ltpx-member-key"   # keeps member keys apart from tokens


_GROUP = b"ltpx-group-key"     # keeps the group key apart from member keys
_SIGN = b"ltpx-answer-sign"    # keeps the answers' signing seed apart from both


class MemberSecret(NamedTuple):
    """What a member given only its own key holds: worker `worker`'s key,
    and the job's group key where its downlink is `group` (else None). With
    it an endpoint makes and checks its own flows' tokens and no one else's,
    and takes GROUP frames only if it holds the group key. `server_pub`
    checks the server's signature on each answer (signing.py)."""

    worker: int
    key: bytes
    group: bytes | None = None
    server_pub: bytes | None = None   # the server's answer-signing key (public: signing.py)
    run: bytes = b""                  # the run its tokens hold for (`bind`)


class RunSecret(NamedTuple):
    """A job secret bound to run `run` (`bind`): its tokens and answer
    signatures hold for that run only."""

    secret: bytes
    run: bytes

    def __repr__(self) -> str:      # no key material in a log line
        return f"RunSecret(run={self.run!r})"


def bind(secret, run: bytes):
    """`secret` (a job secret, a RunSecret or a MemberSecret; None stays
    None) bound to run `run`: every token and answer signature it makes
    then holds for that run only. b"": as it is."""
    run = check_run(run)
    if secret is None or not run:
        return secret
    if isinstance(secret, MemberSecret):
        return secret._replace(run=run)
    return RunSecret(check_secret(_unbound(secret)), run)


def run_of(secret) -> bytes:
    """The run a secret is bound to (b"": none)."""
    return secret.run if isinstance(secret, (RunSecret, MemberSecret)) else b""


def _unbound(secret):
    """A job secret's bytes without its run (any other secret as it is)."""
    return secret.secret if isinstance(secret, RunSecret) else secret


@functools.lru_cache(maxsize=4096)
def member_key(secret: bytes, worker: int) -> bytes:
    """Worker `worker`'s own key (32 bytes) under the job `secret`."""
    if not 0 <= worker < 2**16:
        raise ValueError(f"worker id must be in 0..65535, got {worker}")
    return hashlib.blake2b(struct.pack("!H", worker), digest_size=32, key=secret,
                           person=_MEMBER).digest()


@functools.lru_cache(maxsize=64)
def group_key(secret: bytes) -> bytes:
    """The job's group key (32 bytes): the GROUP tokens' key under the job `secret`."""
    return hashlib.blake2b(b"group", digest_size=32, key=secret, person=_GROUP).digest()


def _answer_seed(secret: bytes) -> bytes:
    return hashlib.blake2b(b"answers", digest_size=32, key=secret, person=_SIGN).digest()


def answer_key(secret) -> Ed25519PrivateKey:
    """The key the server of token secret `secret` signs its answers with
    (signing.py); only a holder of the secret can make it."""
    return private(_answer_seed(_unbound(secret)))


def answer_pub(secret) -> bytes | None:
    """The public half of answer_key(secret) (PUB_BYTES); a MemberSecret's
    server_pub; None without a secret."""
    if secret is None or isinstance(secret, MemberSecret):
        return None if secret is None else secret.server_pub
    return public(_answer_seed(bytes(_unbound(secret))))


def member(secret, worker: int, group: bool = False) -> MemberSecret:
    """The MemberSecret a launcher hands worker `worker` in place of the job
    secret; with group=True it holds the group key too (the group downlink).
    It holds the server's public answer key either way."""
    run, secret = run_of(secret), _unbound(check_secret(secret))
    return MemberSecret(worker, member_key(secret, worker), group_key(secret) if group else None,
                        answer_pub(secret), run)


def _token(key: bytes, job: int, round_: int, kind: int, run: bytes) -> int:
    msg = struct.pack("!IIB", job % 2**32, round_ % 2**32, kind) + run
    digest = hashlib.blake2b(msg, digest_size=8, key=key, person=_PERSON).digest()
    return int.from_bytes(digest, "big") or 1


def derive(secret, job: int, round_: int, worker: int = 0, kind: int = UP) -> int | None:
    """The token of `kind` (UP, UP_ACK, DOWN, DOWN_ACK; GROUP: worker is not
    used) for worker `worker`'s flow in `round_` of `job`: 0 without a
    secret, else a nonzero 64-bit value (0 is kept for "no secret", so no
    derived token equals it). With a MemberSecret: that worker's flows
    only (ValueError for another's), and for GROUP None unless it holds
    the group key."""
    if secret is None:
        return 0
    if kind not in KINDS:
        raise ValueError(f"token kind must be one of {KINDS}, got {kind!r}")
    run = run_of(secret)
    if isinstance(secret, MemberSecret):
        if kind == GROUP:
            return None if secret.group is None else \
                _token(secret.group, job, round_, GROUP, run)
        if worker != secret.worker:
            raise ValueError(f"a member key of worker {secret.worker} makes no tokens of "
                             f"worker {worker}'s flows")
        return _token(secret.key, job, round_, kind, run)
    secret = _unbound(secret)
    if kind == GROUP:
        return _token(group_key(secret), job, round_, GROUP, run)
    return _token(member_key(secret, worker), job, round_, kind, run)


class RoundTokens:
    """One endpoint's tokens. The endpoint is worker `self_id` (None: a
    server): a flow of its own worker id is its uplink (it sends DATA UP,
    receives ACKs UP_ACK) and its downlink (it receives DATA DOWN, sends
    ACKs DOWN_ACK); any other worker's flow it holds is the server's side."""

    _warned = False  # once per process: one line, not one per endpoint

    def __init__(self, secret, job: int, where: str = "endpoint", self_id: int | None = None):
        self.secret, self.job, self.self_id = check_secret(secret), job, self_id
        if isinstance(self.secret, MemberSecret) and self_id != self.secret.worker:
            raise ValueError(f"{where}: a member key of worker {self.secret.worker} needs "
                             f"self_id={self.secret.worker}, got self_id={self_id}")
        if self.secret is None and not RoundTokens._warned:
            RoundTokens._warned = True
            warnings.warn(f"{where} has no secret: its rounds carry token 0 and only the job "
                          "cookie is checked, so a host that can send to it can forge its "
                          "DATA and ACKs; a training job's ranks: give them a job key file "
                          "(LTP_SECRET_FILE, `ltp key member`; `ltp launch` does); your own "
                          "Endpoint: secret=tokens.new_secret(), shared by every member",
                          UnprotectedWarning, stacklevel=3)

    @classmethod
    def off(cls) -> RoundTokens:
        """Tokens 0 everywhere, without the warning (a part made on its own, in tests)."""
        t = cls.__new__(cls)
        t.secret, t.job, t.self_id = None, 0, None
        return t

    @property
    def protected(self) -> bool:
        return self.secret is not None

    def _flow(self, round_: int, worker: int, down: bool) -> tuple[int, int]:
        kinds = (DOWN, DOWN_ACK) if down else (UP, UP_ACK)
        return tuple(derive(self.secret, self.job, round_, worker, k) for k in kinds)

    def receive(self, round_: int, worker: int) -> tuple[int, int]:
        """(the DATA token, the ACK token) of `worker`'s flow this endpoint receives."""
        return self._flow(round_, worker, down=worker == self.self_id)

    def send(self, round_: int, worker: int) -> tuple[int, int]:
        """(the DATA token, the ACK token) of this endpoint's flow to `worker`."""
        return self._flow(round_, worker, down=worker != self.self_id)

    def bank(self, round_: int, peers: dict[int, int]) -> dict[int, tuple[int, int]]:
        """{slot: (DATA token, ACK token)} of every peer this endpoint may
        receive round_ from (a member key: its own flow only)."""
        if isinstance(self.secret, MemberSecret):
            peers = {w: s for w, s in peers.items() if w == self.secret.worker}
        return {slot: self.receive(round_, w) for w, slot in peers.items()}

    def group(self, round_: int) -> int | None:
        """The token of round_'s GROUP frames; None if this endpoint holds none."""
        return derive(self.secret, self.job, round_, kind=GROUP)


class ShardTokens(RoundTokens):
    """The tokens of an endpoint whose rounds S servers share (one device
    for a sharded worker, control/transport/roundspace.py): round r is
    server r % S's, its tokens made from that server's secret (jobkey gives
    each server shard a secret of its own)."""

    def __init__(self, secrets_: list, job: int, where: str = "endpoint",
                 self_id: int | None = None):
        if len({s is None for s in secrets_}) > 1:
            raise ValueError(f"{where}: the servers' secrets must all be given or all be None")
        self.parts = [RoundTokens(s, job, where, self_id) for s in secrets_]
        self.secret, self.job, self.self_id = self.parts[0].secret, job, self_id

    def _of(self, round_: int) -> RoundTokens:
        return self.parts[round_ % len(self.parts)]

    def receive(self, round_: int, worker: int) -> tuple[int, int]:
        return self._of(round_).receive(round_, worker)

    def send(self, round_: int, worker: int) -> tuple[int, int]:
        return self._of(round_).send(round_, worker)

    def bank(self, round_: int, peers: dict[int, int]) -> dict[int, tuple[int, int]]:
        return self._of(round_).bank(round_, peers)

    def group(self, round_: int) -> int | None:
        return self._of(round_).group(round_)


def for_rounds(secret, job: int, where: str = "endpoint",
               self_id: int | None = None) -> RoundTokens:
    """An endpoint's tokens: from one secret (RoundTokens), or from a list
    of one secret per server shard (ShardTokens)."""
    if isinstance(secret, list):
        return ShardTokens(secret, job, where, self_id)
    return RoundTokens(secret, job, where, self_id)
