# SPDX-License-Identifier: Apache-2.0
"""The LTP server link (links.py says what each call does), and what it
shares with the worker's (link_ltp_worker.py): an XDP endpoint per rank.

The server's endpoint has a slot per worker; its uplink rounds close by Early
Close and are Bubble-Filled (a step's bubble mode; "stale" is done per bucket
by server.py, so the endpoint fills zeros then). Answers go with the reliable
class, once to the group address when there is one. A worker's endpoint has
one slot, its own id, for the answers (group-sent ones included). Server s
of S numbers its rounds on the wire r·S + s (transport/roundspace.py), so a
worker's one device carries its flows to every server.

Endpoints are made at the first op, sized for it plus room for a step's
report, and made again (a new compile) only when a later op is larger. A
worker's new endpoint retires the last answers its old one took
(Endpoint.retire): the server may still be re-sending their tails, whose
ACKs were lost, and those get a CLOSED ACK instead of silence.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time

import numpy as np

from ...dataplane.xdp import wire as W
from ...dataplane.xdp.wire import chunk_bytes_for
from ...errors import CommError
from .. import settings_table
from ..transport.early_close import EarlyClose, EarlyCloseConfig
from ..transport.endpoint import CHECKSUMS, Endpoint, EndpointConfig, Peer
from ..transport.rate import CREDIT_RTT_S
from ..transport.roundspace import RoundSpace
from ..transport import defer, fec
from ..trust.signing import SIG_ELEMS, Signer, StreamSigner
from ..transport.stream import AnswerStream
from .codec import ServerCodec, answer_feedback
from .host import rank_host
from .link_ltp_near import NearRows, check_tolerant
from .links import Gathered, ServerLink
from .losspolicy import Choice, LossPolicy
from .settings import Settings

HEADROOM = 4096        # extra elements an endpoint is made with (a step's report, small ops)
ROUND_LIMIT_S = 60.0   # one round's hard limit; a rank's waits may be longer (Settings.timeout)


def credit_bytes(s: Settings) -> float | None:
    """What a receiver's clocked flows may keep in flight together: the
    bottleneck's buffer (setting `buffer`) plus one BDP; None: the
    transport's default (rate.credit_window)."""
    return s.buffer + s.capacity * CREDIT_RTT_S / 8 if s.buffer else None


def endpoint_config(s: Settings, secret, banks: int = 2, stride: int = 1) -> EndpointConfig:
    """What a rank's endpoints share, from its settings (each link adds its
    own); banks and stride as transport/roundspace.py gives them, `secret` a
    list of the servers' where their rounds share the endpoint."""
    return EndpointConfig(ns=s.netns, mode=s.xdp_mode, job=s.job, capacity_bps=s.capacity,
                          chunk_bytes=chunk_bytes_for(s.mtu), secret=secret, banks=banks,
                          bank_stride=stride, port=s.udp_port, shared=s.share_dev,
                          credit_bytes=credit_bytes(s), verify_csum=CHECKSUMS[s.checksums])


class LtpServerLink(ServerLink):
    name = "ltp"
    opens = True       # a round must be open before its data arrives

    def __init__(self, s: Settings, workers: int, group: str | None,
                 secret: bytes | None = None, shard: int = 0, servers: int = 1,
                 key=None):
        self.s, self.ids = s, list(range(workers))
        self.shard, self.servers = shard, servers   # server `shard` of S: its rounds r·S + shard
        self.group = (group, W.PORT) if group else None
        self.ep: Endpoint | None = None
        self.size = 0
        self.peers: list[Peer] = []
        self.bubble, self.early_close = "mean", "{}"
        self.wait_s = min(s.timeout, ROUND_LIMIT_S)
        self.log = settings_table.env("round_log")
        self.policies: dict = {}     # round kind -> its EarlyClose (see policy())
        # the round tokens' secret, derived from the job key the server read
        # from its LTP_SECRET_FILE (jobkey.token_secret): never in the store
        self.secret = secret
        # with a secret every answer is signed (trust/signing.py): a
        # member holding the group key can send GROUP frames, not answers
        self.signer = Signer(secret, s.job) if secret is not None else None
        self.sign_s = 0.0            # seconds spent signing answers (the step breakdown's)
        # a step's gradients travel as its op says (Op.wire: configure)
        self.codec, self.wire = ServerCodec(chunk_bytes_for(s.mtu), answer_feedback(s)), "none"
        self.defer = s.loss_policy == "defer"
        if self.defer and (s.compress not in settings_table.EXACT_COMPRESS or s.downlink_code == "rs"):
            raise CommError("loss_policy defer needs compress none or auto and downlink_code off: "
                            "a deferred chunk is one the answer's bytes leave out")
        # the bfloat16 wire under loss: for a compress that leaves the choice
        # to LTP (auto), with error feedback to carry its rounding
        self.loss = LossPolicy(s.loss_policy, s.loss_budget, s.loss_warmup,
                               half=s.compress == "auto" and s.error_feedback)
        # uplink rounds opened with no loss budget: what they lose is the
        # path's loss (a budget's early close leaves out chunks never lost)
        self.honest: set[int] = set()
        self.measured = [0, 0]   # this step's honest rounds: chunks in only as re-sends, chunks in
        self.verdicts: dict[int, tuple] = {}   # answer -> its verdict (defer.py), for a retry
        # workers whose frames never reach a NIC, on this host (a co-located
        # trainer's own, a node's others: link_ltp_near.py); `key` their hello's
        self.near = NearRows(s.ip, s.udp_port, rank_host(s.netns, s.node), key)

    def address(self) -> dict:
        return {"compress": self.s.compress, "chunk_bytes": chunk_bytes_for(self.s.mtu),
                "ltp_port": self.s.udp_port, "shared": self.s.share_dev,
                "downlink_code": self.s.downlink_code,
                "answers": "tolerant" if self.defer else "whole",
                "signed": self.signer is not None, **self.near.address()}

    def connect(self, metas: dict[int, dict]) -> None:
        self.near.connect(metas, self.ids, self.s.timeout)
        self.near.beat = self.beat    # its rows awaited, the open rounds stay ACKed
        if self.near:
            check_tolerant(self.defer)
        self.peers = [Peer(w, metas[w]["ip"], metas[w].get("ltp_port", W.PORT))
                      for w in self.near.far(self.ids)]
        # a group frame goes to one port: a worker on another (several share
        # its device, each on a port of its own) takes its answers by unicast
        off = [p.worker for p in self.peers if p.port != W.PORT]
        if off and self.group is not None:
            shared = [w for w in off if metas[w].get("shared")]
            why = (f"worker(s) {shared} share a device with other ranks" if shared else
                   f"worker(s) {off} take LTP on a port of their own")
            print(f"ltpx.torch server: {why}: answers go by unicast", file=sys.stderr)
            self.group = None

    def ensure(self, nelems: int) -> bool:
        """An endpoint for rounds of up to nelems; True if one was (re)made (the
        rounds open on an old one are gone with it)."""
        if self.ep is not None and nelems <= self.size:
            return False
        old = getattr(self.ep, "ep", self.ep)    # a RoundSpace's endpoint, or the endpoint
        s, size = self.s, endpoint_room(nelems, self.s.downlink_code == "rs", self.s.mtu, self.defer)
        ep = Endpoint(s.dev, s.ip, {w: i for i, w in enumerate(self.ids)}, size,
                      # server s of S: rounds r·S + s, banks by r (roundspace.py)
                      endpoint_config(s, self.secret, stride=self.servers),
                      early_close=self.early_config(self.early_close),
                      bubble_strategy=self.endpoint_bubble(self.bubble),
                      # the answers' group send goes once to every worker; the
                      # clock would clock each worker's own unicast copy of it
                      sender="socket" if s.downlink == "group" else s.sender,
                      label=f"rank {self.shard}",   # server s is rank s (`ltp flows`)
                      succeeds=old)   # in its place at once: no frame meets no program
        self.close_endpoint()
        self.honest.clear()      # the rounds open on the old endpoint are gone with it
        self.near.clear()
        self.ep = ep if self.servers == 1 else RoundSpace(ep, self.shard, self.servers)
        self.size = size
        return True

    def early_config(self, fields_json: str) -> EarlyCloseConfig:
        fields = json.loads(fields_json)
        budget = 0.0 if self.loss.held("threshold_min" in fields) else self.loss.choice.budget
        return EarlyCloseConfig(**{"hard_timeout_s": self.wait_s, "budget": budget, **fields})

    def choose(self, half: bool = True) -> Choice:
        """The loss policy's choice for this step (losspolicy.py), from the
        loss this step's rounds met: the budget of the rounds opened from now
        on, unless the op's Early Close fields fix one (they rule, as in
        early_config). Fields that fix `threshold_min` hold auto's own budget
        off (a budget's floor would close rounds below it); a `loss_budget`
        the rank was given still holds. half: the workers may take a wire."""
        retx, got = self.measured
        if got:
            self.loss.saw_uplink(retx / got)
        self.measured = [0, 0]
        fields = json.loads(self.early_close)
        c = self.loss.choose(held="threshold_min" in fields, half=half)
        if "budget" not in fields:
            for p in self.policies.values():
                if p.cfg.budget != c.budget:
                    p.cfg = dataclasses.replace(p.cfg, budget=c.budget)
        return c

    def loss_summary(self) -> dict:
        return self.loss.summary()

    def configure(self, bubble: str, early_close: str, wire: str = "none",
                  carry: bool = False) -> None:
        """A step's Bubble Filling, Early Close settings and wire, from its op."""
        self.codec.set_carry(carry)
        if self.defer and wire != "none":   # the workers choose from this server's record
            raise CommError(f"a step op's wire is {wire}, but this server defers answers "
                            "(loss_policy defer), which leaves out float32 chunks: give "
                            "every rank the same loss_policy and compress")
        if (bubble, wire) != (self.bubble, self.wire):
            self.bubble, self.wire = bubble, wire
            self.ep.bubble_strategy = self.endpoint_bubble(bubble)
        if early_close != self.early_close:
            self.early_close = early_close
            self.policies = {}

    def endpoint_bubble(self, bubble: str) -> str:
        """What the endpoint fills: "stale" is server.py's, compressed
        rounds are filled once decoded (ServerCodec), and a round with near
        rows once they are in (NearRows.gather), so zeros then."""
        return "zero" if bubble == "stale" or self.wire != "none" or self.near else bubble

    def policy(self, key) -> EarlyClose:
        """The Early Close state of one kind of round (a step's bucket i).

        An EarlyClose keeps the open round's deadline and threshold and learns
        rates and times from past rounds. Two rounds are open at once here,
        and buckets differ in size, so each bucket has its own, handed to the
        endpoint with the round it judges (Endpoint.open_round(early=))."""
        if key not in self.policies:
            self.policies[key] = EarlyClose(self.s.capacity, self.early_config(self.early_close))
        return self.policies[key]

    def open(self, r: int, nelems: int, workers: list[int], reliable: bool, key=None) -> None:
        nelems = self.codec.open(r, nelems, reliable, self.wire)
        early = self.policy(key)
        far = self.near.far(workers)
        if self.near:
            self.near.opened(r, nelems, wired=bool(far), reliable=reliable)
            if not far:     # every worker of it on this host: nothing over XDP
                return
        self.ep.open_round(r, nelems, workers=far, reliable=reliable, early=early)
        if not reliable and not early.cfg.budget:   # what it loses is the path's (choose)
            self.honest.add(r)

    def beat(self) -> None:
        """Keep the XDP program ACKing open rounds while the server waits
        elsewhere (coord.on_wait; Endpoint.beat)."""
        if self.ep is not None:
            self.ep.beat()

    def cancel(self, r: int) -> None:
        self.honest.discard(r)
        self.codec.cancel(r)
        if not self.near or self.near.cancel(r):
            self.ep.cancel_round(r)

    def gather(self, r: int, nelems: int, workers: list[int]) -> Gathered:
        near = bool(self.near)     # workers on this host: their rows taken off the wire
        res = self.ep.wait_round(r) if not near or r in self.near.wired else None
        if res is not None:
            self.note_round(r, res)
        codec = self.codec.compressed(r)
        if near:   # its holes filled once every row is in (endpoint_bubble), unless decoded
            g = self.near.gather(r, workers, res, chunk_bytes_for(self.s.mtu) // 4, self.wait_s,
                                 fill=None if codec is not None or self.bubble != "mean"
                                 else "mean")
        else:
            g = Gathered(round=r, values=res.values, workers=list(res.workers),
                         delivered=res.masks.sum(axis=1), chunks=res.layout.nchunks,
                         filled=np.asarray(res.filled), reason=res.reason,
                         chunk_elems=res.layout.chunk_elems, masks=res.masks,
                         duration_s=res.duration_s, error=res.error["vs_noise"],
                         arrivals=res.arrivals, attribution=res.attribution)
        if codec is not None:
            g.values = self.codec.decode(r, g.values, g.masks, self.bubble)
            g.chunk_elems = codec.per_chunk
        return g

    def note_round(self, r: int, res) -> None:
        """What uplink round r's result tells the loss policy, and its
        LTP_ROUND_LOG line."""
        if r in self.honest:     # of the chunks in, those that came only as a re-send
            self.honest.discard(r)   # (a late or dead worker's missing ones are no loss)
            self.measured[0] += res.retx_chunks
            self.measured[1] += int(res.masks.sum())
        if self.log:   # LTP_ROUND_LOG=1: one JSON line per uplink round on stderr
            line = res.report()      # the op's round; a sharded server's on the wire too
            line.update(round=r, **({"wire_round": line["round"], "server": self.shard}
                                    if self.servers > 1 else {}))
            print(json.dumps({"round_log": line}), file=sys.stderr, flush=True)

    def send(self, d: int, buf: np.ndarray, group: bool, *, to: list[int] | None = None,
             wait_s: float | None = None,
             critical_from: int | None = None) -> np.ndarray | None:
        peers = self.peers if to is None else [p for p in self.peers if p.worker in to]
        near = self.near.near_of(self.ids if to is None else to)
        if not peers and not near:
            return None
        timeout_s = self.wait_s if wait_s is None else min(self.wait_s, wait_s)
        if self.defer and critical_from is not None:   # (never with near workers: connect)
            return self._send_deferred(d, buf, group, peers, critical_from, timeout_s)
        buf = self.codec.answer(buf, d)    # buf itself unless a compressed step preceded it
        if self.signer:
            buf = self.timed_sign(d, buf)
        # off the wire, while XDP sends: a local worker loses nothing, so it
        # has the link's whole time (and a retry's give skips those that took it)
        given = self.near.give(d, buf, near, self.wait_s)
        try:
            if peers:
                self.ep.push_reliable(d, buf, peers, timeout_s=timeout_s,
                                      group=self.group if group else None,
                                      coded=self.s.downlink_code == "rs")
        except BaseException:
            if given is not None:   # the push's error is the one to say (DeadPeerError)
                with contextlib.suppress(CommError):
                    given()
            raise
        if given is not None:
            given()
        return None

    @property
    def sig_elems(self) -> int:
        return SIG_ELEMS if self.signer else 0

    def stream(self, d: int, buf: np.ndarray, group: bool, *, to: list[int],
               wait_s: float) -> AnswerStream | None:
        """Answer d sent part by part as buf fills (transport/stream.py), its
        last `sig_elems` elements the signature; None where answers go
        otherwise (coded, compressed, tolerant, or per worker, or to local
        workers alone). Local workers take it whole once it is final
        (NearStream, below)."""
        if not self.s.stream_share or self.wire != "none" or self.defer or not group \
                or self.s.downlink_code == "rs" or self.group is None:
            return None
        peers = [p for p in self.peers if p.worker in to]
        if not peers:
            return None
        signer = None if self.signer is None else \
            StreamSigner(self.signer, d, len(buf) - SIG_ELEMS)
        stream = AnswerStream(self.ep, d, buf, peers, group=self.group,
                              timeout_s=min(self.wait_s, wait_s), signer=signer,
                              share=self.s.stream_share)
        near = self.near.near_of(to)
        return NearStream(stream, self.near, d, buf, near, self.wait_s) if near else stream

    def timed_sign(self, d: int, buf: np.ndarray) -> np.ndarray:
        """Answer d signed; the time it took counted in sign_s."""
        t0 = time.perf_counter()
        try:
            return self.signer.sign(d, buf)
        finally:
            self.sign_s += time.perf_counter() - t0

    def _send_deferred(self, d: int, buf: np.ndarray, group: bool, peers: list[Peer],
                       critical_from: int, timeout_s: float) -> np.ndarray:
        """A step's answer, tolerantly (transport/defer.py): the elements it
        left out, for the server to carry into its next answer. A signed
        job signs the answer as the workers use it (the deferred chunks zero)."""
        sign = None if self.signer is None else (
            lambda used: self.timed_sign(d, used)[-SIG_ELEMS:].tobytes())
        for old in [k for k in self.verdicts if k < d - 4]:
            del self.verdicts[old]
        rep = self.ep.push_deferred(d, buf, peers, critical_from=critical_from,
                                    timeout_s=timeout_s, group=self.group if group else None,
                                    sign=sign, sig_bytes=SIG_ELEMS * 4 if self.signer else 0,
                                    memo=self.verdicts)
        return np.repeat(rep.deferred, chunk_bytes_for(self.s.mtu) // 4)[:buf.size]

    def close(self) -> None:
        self.near.close()
        self.close_endpoint()

    def close_endpoint(self) -> None:
        if self.ep is not None:
            ep, self.ep = self.ep, None
            ep.close()


def endpoint_room(nelems: int, coded: bool, mtu: int, deferred: bool = False) -> int:
    """Elements an endpoint for rounds of up to nelems holds: with a coded
    downlink, room for an answer's parity slots too (up to half again); with
    a tolerant one, for its verdict (defer.py)."""
    cb = chunk_bytes_for(mtu)
    if coded:
        nelems = fec.coded_elems(nelems, cb // 4)
    if deferred:
        data = -(-nelems // (cb // 4))
        nelems = (data + defer.extra_chunks(data, cb, SIG_ELEMS * 4)) * (cb // 4)
    return nelems + HEADROOM


class NearStream:
    """A streamed answer (transport/stream.AnswerStream) whose far workers
    get it part by part as the server sums, and whose near ones get it whole
    off the wire once it is final: its signature written, its last part
    sent (`finish`), as `LtpServerLink.send` gives them an answer sent whole."""

    def __init__(self, inner, rows: NearRows, d: int, buf: np.ndarray, near: list[int],
                 wait_s: float):
        self.inner, self.rows, self.d, self.buf = inner, rows, d, buf
        self.near, self.wait_s = near, wait_s

    @property
    def sign_s(self) -> float:
        return self.inner.sign_s

    def feed(self, nelems: int) -> None:
        self.inner.feed(nelems)

    def finish(self) -> None:
        self.inner.finish()
        given = self.rows.give(self.d, self.buf, self.near, self.wait_s)
        if given is not None:
            given()

    def abort(self) -> None:
        self.inner.abort()
