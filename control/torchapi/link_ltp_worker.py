# SPDX-License-Identifier: Apache-2.0
"""The LTP worker link (links.py says what each call does): its endpoint has
one slot, its own id, for the answers (group-sent ones included).

A sharded worker's links to the servers whose routes leave by one device
share one endpoint (`SharedDevice`; transport/roundspace.py: server s's
rounds r·S + s, two banks each), so a worker needs one device for any
number of servers, as a host with one NIC has.
"""
from __future__ import annotations

import numpy as np

from ...dataplane.xdp import wire as W
from ...dataplane.xdp.wire import chunk_bytes_for
from ...errors import CommError
from ..transport.early_close import COMPLETE, EarlyCloseConfig
from ..transport.endpoint import Endpoint, Peer
from ..transport.roundspace import RoundSpace, banks_for
from ..transport.stream import answered_from
from ..trust import tokens
from ..trust.signing import SIG_ELEMS, ForgedAnswerError, Verifier
from .codec import WorkerCodec, check_peer, piece_feedback
from .handoff import Pair, proc
from .host import rank_host
from .link_ltp import ROUND_LIMIT_S, endpoint_room, endpoint_config
from .link_ltp_near import SockChannel, as_bytes, check_tolerant, worker_pair
from .localsock import here
from .links import WorkerLink
from .settings import Settings

TAKEN_KEPT = 2         # answers a remade worker endpoint still ACKs late re-sends of (a bank each)


class LtpWorkerLink(WorkerLink):
    name = "ltp"
    opens = True

    def __init__(self, s: Settings, worker: int, workers: int, secret: bytes | None = None,
                 device: SharedDevice | None = None, shard: int = 0, key=None):
        self.s, self.id, self.workers = s, worker, workers
        # sharded: the endpoint this link's rounds (server `shard`'s) share
        # with the other servers' links whose routes leave by its device
        self.device, self.shard = device, shard
        if device is not None:
            device.links.append(self)
        self.ep: Endpoint | RoundSpace | None = None
        self.size = 0
        self.ps: Peer | None = None
        self.wait_s = min(s.timeout, ROUND_LIMIT_S)
        # the tokens' (jobkey.token_secret): from a member key file, this
        # worker's own key (tokens.MemberSecret), with the group key or not
        self.secret = secret
        self.coded = False                 # the downlink is coded (the server says, connect)
        self.deferred = False              # ... tolerant: its steps' answers (defer.py)
        self.plans: dict[int, object] = {}   # answer -> its defer.Plan
        self.verifier: Verifier | None = None   # the answers are signed (the server says)
        self.codec = WorkerCodec(chunk_bytes_for(s.mtu), piece_feedback(s))   # a step's wire: its op's
        # this worker's pushes so far, those the socket sent (auto under
        # loss, or asked for): DATA sent, and how much of it the ACK clock made
        self.counts = {"pushes": 0, "socket_pushes": 0, "sent": 0, "clock_tx": 0}
        self.deferrals = {"answers": 0, "chunks": 0}   # tolerant answers that deferred some
        self.taken: list[int] = []         # the latest answers taken (one per bank)
        # a server whose frames never reach a NIC: in this process or on this
        # host (link_ltp_near.py); `key` the hello to its local socket
        self.pair: Pair | SockChannel | None = None
        self.key, self.host = key, rank_host(s.netns, s.node)
        self.sizes: dict[int, int] = {}    # ... the answers it is to give: their words

    @property
    def uplink(self) -> dict:
        return self.counts

    @property
    def downlink(self) -> dict:
        return self.deferrals

    def address(self) -> dict:
        return {"ltp_port": self.s.udp_port, "shared": self.s.share_dev, "proc": proc(),
                **here()}

    def connect(self, server: dict) -> None:
        check_peer(self.s.compress, chunk_bytes_for(self.s.mtu), server, chunks=True)
        self.ps = Peer(self.id, server["ip"], server.get("ltp_port", W.PORT))
        self.coded = server.get("downlink_code") == "rs"   # the server's choice rules
        self.deferred = server.get("answers") == "tolerant"
        self.verifier = None
        if server.get("signed"):
            pub = tokens.answer_pub(self.secret)
            if pub is None:
                raise CommError("the server signs its answers but this worker holds no key "
                                "to check them: give every rank a key file of this job "
                                "(LTP_SECRET_FILE; a member file made by this ltp)")
            self.verifier = Verifier(pub, self.s.job, tokens.run_of(self.secret))
        self.pair = worker_pair(server, self.id, self.host, self.key, self.s.timeout)
        if self.pair is not None:
            check_tolerant(self.deferred)

    def ensure(self, nelems: int) -> bool:
        if self.ep is not None and nelems <= self.size:
            return False
        size = endpoint_room(nelems, self.coded, self.s.mtu, self.deferred)
        if self.device is not None:
            self.device.ensure(size, self)     # binds this link, or every link of a new one
            return True
        old = self.ep      # its place taken at once: the device never goes without a program
        ep = worker_endpoint(self.s, self.id, self.workers, size, self.secret, succeeds=old)
        self.close_endpoint()
        self.bind(ep, size)
        return True

    def bind(self, ep: Endpoint, size: int) -> None:
        """This link's rounds on endpoint `ep` (of `size` elements), made anew."""
        self.ep = ep if self.device is None else RoundSpace(ep, self.shard, self.device.servers)
        # the server may still be re-sending the last answers' tails (their
        # ACKs lost): the new program ACKs them CLOSED, as the old one would
        for d in self.taken:
            self.ep.retire(d, self.id)
        self.size = size

    def answers_deferred(self) -> bool:
        return self.deferred

    def expect_wire(self, d: int, n: int, wire: str) -> None:
        """Answer d starts with n elements in `wire` (a step's aggregate)."""
        self.codec.expect(d, n, wire)

    def expect(self, d: int, nelems: int, tolerant: bool = False) -> None:
        if self.pair is not None:    # given off the wire, as it would be sent
            self.sizes[d] = self.codec.wire_elems(d, nelems) + (SIG_ELEMS if self.verifier
                                                               else 0)
            return
        if self.deferred and tolerant:   # the signature comes in its verdict
            self.plans = {k: p for k, p in self.plans.items() if k > d - 4}
            self.plans[d] = self.ep.expect_deferred(
                d, nelems, self.id, sig_bytes=SIG_ELEMS * 4 if self.verifier else 0)
            return
        nelems = self.codec.wire_elems(d, nelems)
        if self.verifier:
            nelems += SIG_ELEMS
        self.ep.expect(d, nelems, self.id, coded=self.coded)

    def push(self, r: int, buf: np.ndarray, reliable: bool, answer: int | None = None,
             at: int = 0, wire: str = "none") -> bool:
        """Send this worker's piece of round r; True when the server closed the
        round before all of it arrived.
        answer: the downlink round that answers r's op, `at` the element where
        r's part of it starts; once a chunk of it from there on arrives (any
        chunk, where answers are coded or tolerant) r is closed, and the push
        ends even if its last ACKs were lost. wire: what a tolerant piece
        travels as (its op's); compressed, buf is left holding the rounding error."""
        compressed = wire != "none" and not reliable
        if compressed:
            buf = self.codec.piece(buf, wire)
        up = self.uplink
        if self.pair is not None:     # a server on this host: the piece off the wire, whole
            self.pair.up.give(r, as_bytes(buf), self.wait_s)
            up["pushes"], up["off_wire"] = up["pushes"] + 1, up.get("off_wire", 0) + 1
            return False
        ep = self.ep
        first = 0 if compressed or self.coded or self.deferred else \
            at // (chunk_bytes_for(self.s.mtu) // 4)
        over = None if answer is None else (lambda: answered_from(ep, answer, first))
        rep = ep.push(r, buf, self.ps, reliable=reliable, timeout_s=self.wait_s, over=over)
        up["pushes"], up["sent"], up["clock_tx"] = (up["pushes"] + 1, up["sent"] + rep.sent,
                                                    up["clock_tx"] + rep.clock_tx)
        up["socket_pushes"] += rep.sender == "socket"
        return rep.closed_by_receiver and rep.acked < rep.chunks

    def pull(self, d: int, out: np.ndarray) -> None:
        if self.pair is not None:
            self.pull_near(d, out)
            return
        # wait_round gives a view of the mapped memory: one copy, into `out`
        res = self.ep.wait_round(d, poll_s=0.0005)
        if res.reason != COMPLETE:
            raise CommError(f"the server's answer {d} is incomplete after "
                            f"{res.duration_s:.2f}s: {int(res.masks.sum())}/{res.masks.size} "
                            "chunks (is the server alive? is its --capacity right?)")
        values = res.values[0]
        self.taken = [*self.taken, d][-TAKEN_KEPT:]
        plan = self.plans.pop(d, None)
        if plan is not None and plan.deferred is not None and plan.deferred.any():
            self.deferrals["answers"] += 1
            self.deferrals["chunks"] += int(plan.deferred.sum())
        if plan is not None and self.verifier:   # the answer as used, and the verdict's signature
            if len(plan.sig) != SIG_ELEMS * 4:
                raise ForgedAnswerError(f"answer {d}'s verdict carries a signature of "
                                        f"{len(plan.sig)} bytes, not {SIG_ELEMS * 4}: refused, "
                                        "nothing of it used")
            values = np.concatenate([values, np.frombuffer(plan.sig, dtype=np.float32)])
        self.use(d, values, out)

    def pull_near(self, d: int, out: np.ndarray) -> None:
        """Answer d from a server on this host, off the wire: straight into
        `out` where it comes as it is used (no signature, not compressed)."""
        n = self.sizes.pop(d)
        if not self.verifier and not self.codec.compressed(d) and n == out.size \
                and out.dtype == np.float32 and out.flags.c_contiguous:
            self.pair.down.take(d, as_bytes(out), self.wait_s)
            return
        values = np.empty(n, dtype=np.float32)
        self.pair.down.take(d, as_bytes(values), self.wait_s)
        self.use(d, values, out)

    def use(self, d: int, values: np.ndarray, out: np.ndarray) -> None:
        """Answer d's words as taken: checked (signed), decoded into `out`."""
        if self.verifier:      # ForgedAnswerError unless the server's: nothing used then
            values = self.verifier.check(d, values)
        self.codec.decode(d, values, out)   # a copy, unless it starts compressed

    def close(self) -> None:
        if self.pair is not None:
            self.pair.close(f"worker {self.id}")
            self.pair = None
        self.close_endpoint()

    def close_endpoint(self) -> None:
        if self.ep is not None:
            ep, self.ep = self.ep, None
            if self.device is None:    # a shared one goes with its SharedDevice
                ep.close()


def worker_endpoint(s: Settings, worker: int, workers: int, size: int, secret,
                    banks: int = 2, succeeds: Endpoint | None = None) -> Endpoint:
    """A worker's endpoint for answers of up to `size` elements; `secret`
    its servers' (a list of them, one per server, where several share it);
    `succeeds`: the smaller endpoint whose place it takes (succession.py)."""
    # the answers are reliable: only completeness closes them, or this timeout
    return Endpoint(s.dev, s.ip, {worker: 0}, size, endpoint_config(s, secret, banks),
                    early_close=EarlyCloseConfig(hard_timeout_s=min(s.timeout, ROUND_LIMIT_S)),
                    initial_rate_bps=s.capacity / max(1, workers),
                    self_id=worker,   # group-sent answers are taken as its own
                    sender=s.sender,
                    # a worker computes between its pull and the next answer
                    # (wbsp: while the answer comes): only the server proves
                    # liveness to senders; a dead worker shows in the store
                    liveness_s=None, succeeds=succeeds,
                    label=f"rank {s.servers + worker}")   # servers first (`ltp flows`)


class SharedDevice:
    """One endpoint for a sharded worker's links to the servers whose routes
    leave by one device (transport/roundspace.py: server s's rounds r·S + s,
    two banks each), made as large as the largest op of any of them."""

    def __init__(self, s: Settings, worker: int, workers: int, secrets: list, servers: int):
        self.s, self.id, self.workers = s, worker, workers
        self.secrets, self.servers = secrets, servers   # every server's, round r's: r % S
        self.ep: Endpoint | None = None
        self.size = 0
        self.links: list[LtpWorkerLink] = []

    def ensure(self, size: int, link: LtpWorkerLink) -> None:
        """An endpoint of at least `size` elements for `link`: made anew (and
        every link bound to it: the rounds open on the old one are gone) when
        the one there is smaller."""
        if self.ep is not None and size <= self.size:
            if link.ep is None:
                link.bind(self.ep, self.size)
            return
        secret = self.secrets if any(x is not None for x in self.secrets) else None
        ep = worker_endpoint(self.s, self.id, self.workers, size, secret,
                             banks_for(self.servers), succeeds=self.ep)   # in its place at once
        self.close()
        self.ep = ep
        self.size = size
        for each in self.links:
            each.bind(self.ep, size)

    def close(self) -> None:
        if self.ep is not None:
            ep, self.ep = self.ep, None
            for link in self.links:
                link.ep = None
            ep.close()
