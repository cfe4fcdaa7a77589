# SPDX-License-Identifier: Apache-2.0
"""The LTP transport: an endpoint per host, pushing and receiving rounds.

An `Endpoint` owns one ltp_xdp program attached to the host's device (in its
network namespace) and one UDP socket. The same endpoint sends (its XDP program
records the ACKs its peers' programs build) and receives (its XDP program
writes DATA into mapped memory and answers with ACKs): sending is a `Push`
(push.py), receiving a `Receiver`'s rounds (receiver.py).

Parameter server: `ps.open_round(r, nelems)`, then `ps.wait_round(r)` returns a
`RoundResult` with per-worker arrays (views of the mapped memory), delivery
masks, Bubble-Filled values and the aggregate.
Worker: `wk.push(r, grads, ps_addr)` sends tolerable chunks until the PS closes
the round; `wk.expect(r, nelems)` + `wk.receive(r)` take the reliable
parameter downlink that the PS sends with `ps.push_reliable(r, params, peers)`.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ...dataplane import netns
from ...dataplane.doctor.growcheck import grow_verdict
from ...dataplane.xdp import lookup, mux, registry
from ...dataplane.xdp.loader import Dataplane, Geometry
from ...errors import DeadPeerError, TransportError

# how pushes leave: "socket" (paced sendmsg, push.Push) or "xdp" (the ACK
# clock: the XDP program turns each ACK into the next DATA, ackclock.ClockPush)
from .ackclock import ClockPush
from .early_close import COMPLETE, DEADLINE, TIMEOUT, EarlyClose, EarlyCloseConfig
from .endpoint_config import EndpointConfig
from . import defer, fec, succession
from .layout import ChunkLayout, as_f32
from .options import AUTO, PUSH_TIMEOUT_S, PushSpec, choose_sender
from .rate import SharePolicy, credit_window, fine_timer_slack
from .receiver import Receiver
from .push import Push
from .results import Peer, PushReport, RoundResult
from .sender import Sender
from .udpsock import device_mac, udp_socket
from ..trust.tokens import for_rounds

FORCE_FIX = "Endpoint(..., force=True) replaces it"
CHECKSUMS = {"auto": None, "on": True, "off": False}   # a setting's word -> verify_csum=


def _on(part: str, name: str, doc: str) -> property:
    """An attribute of the endpoint that lives on its receiver or sender."""
    return property(lambda self: getattr(getattr(self, part), name),
                    lambda self, value: setattr(getattr(self, part), name, value), doc=doc)

class Endpoint:
    """One host's LTP endpoint: XDP program on `dev` plus a UDP socket.

    Made with an `EndpointConfig` (endpoint_config.py), or its fields as
    keywords over the defaults (`Endpoint(dev, ip, peers, n, job=7)`), or
    both (`config`, then fields over it); `self.config` is what it was made
    with. The fields:

    peers: worker id -> slot. A PS lists every worker; a worker lists itself
    (its uplink ACKs and its downlink DATA both carry its own id).
    self_id: a worker's own id. With it the endpoint also receives downlink
    DATA sent to a group address (`push_reliable(..., group=...)`): its XDP
    program takes such packets as addressed to self_id and ACKs them from
    this host's own MAC and address.
    role: "ps" or "worker", as `ltp status` lists this endpoint; by default a
    worker when self_id is given (workers name themselves), else a PS. Never
    from the peer count: a PS with one worker has one peer, as a worker does.
    secret: the job's secret (16..64 bytes, `tokens.new_secret()`), the same
    on every member of the job, or a worker's own key alone
    (`tokens.member(secret, self_id, group=...)`: GROUP frames taken only
    with the group key): each flow's DATA and ACKs carry a
    token derived from it per worker, direction and round, and the XDP
    program drops packets without theirs (`bad_token`), so neither a host
    off the path nor a member holding its own key can forge them. Without one the
    tokens are 0 and only the job cookie is checked (`protected` is False;
    the first such endpoint of a process warns: tokens.UnprotectedWarning).
    verify_csum: the XDP program verifies each DATA frame's UDP checksum and
    counts a frame that fails `bad_csum`, never delivered nor ACKed. None
    (the default): where frames carry whole sums (lookup.csum_complete: a
    NIC, yes; a veth or loopback, no: a local socket's frames carry the sum
    unfinished, left to offload, so the rig's senders would all fail); the
    choice is `self.verify_csum`.
    sender: how this endpoint's pushes leave (SENDERS; docs/transport.md,
    "The ACK clock"): "xdp" (the ACK clock), "socket" (the paced socket), or
    "auto" (the default): the clock where `ltp doctor`'s grow check passes in
    this `mode`, else the socket, with a warning logged once per process;
    chosen once, here (`sender_choice` says which and why; the check runs
    once per process and its answer is cached per kernel). An
    explicit sender is used as given. push_options: the sender
    and the ACK clock's knobs together (options.PushOptions; a push may
    name its own: `push(..., options=)`). credit_bytes: what the
    clocked senders pushing to this endpoint may keep in flight together,
    the bottleneck's buffer plus one BDP (default: rate.credit_window's),
    in frames at most rate.RING_FRAMES (one receive ring: with a multi-queue
    NIC, one ring for all flows together).
    liveness_s: DATA of an open round is ACKed only while this endpoint's
    control thread beat the program's heartbeat at most that long ago (it
    beats when it opens a round, while it waits for one and while it
    pushes; `beat()` between), so a hung or stopped process stops ACKing
    and its senders get DeadPeerError; None or 0 turns the check off.
    force: take `dev` even if it carries an XDP program (another endpoint's,
    `ltp load`'s, anyone's). Without it such a device is refused at once,
    before compiling, with an error naming what holds it.

    The program is attached through a BPF link this process holds and
    nothing is pinned: attachment and maps go when the endpoint closes or
    its process dies. publish=True writes a record (owner pid, program and
    map ids) so `ltp status/flows/top` see the endpoint while it lives.

    succeeds: an endpoint of this process whose device or seat and socket
    this one takes once its program is ready, in one update (succession.py:
    no frame meets a device without a program); close it after.
    """

    def __init__(self, dev: str, ip: str, peers: dict[int, int], max_elems: int,
                 config: EndpointConfig | None = None, *, succeeds: Endpoint | None = None,
                 **fields):
        cfg = self.config = EndpointConfig.of(config, **fields)
        self_id, job, chunk_bytes, capacity_bps = cfg.self_id, cfg.job, cfg.chunk_bytes, \
            cfg.capacity_bps
        mode, ns, port = cfg.mode, cfg.ns, cfg.port
        if self_id is not None and self_id not in peers:
            raise ValueError(f"self_id {self_id} must be one of the peers {sorted(peers)}")
        if not peers:
            raise ValueError("an endpoint needs at least one peer")
        options = cfg.options
        # checked before the compile
        tokens = for_rounds(cfg.secret, job, f"Endpoint({dev!r})", self_id=self_id)
        share, early = SharePolicy(capacity_bps), EarlyClose(capacity_bps, cfg.early_close)
        self.dev, self.ip, self.ns, self.job, self.port = dev, ip, ns, job, port
        self.peers = dict(peers)
        self.slots = max(peers.values()) + 1
        self.max_elems, self.chunk_bytes, self.capacity_bps = max_elems, chunk_bytes, capacity_bps
        max_chunks = ChunkLayout(max_elems, chunk_bytes).nchunks
        if succeeds is not None:
            succession.check(succeeds, dev, ns, port, cfg.shared)
        elif not cfg.force and not cfg.shared:  # fail before the compile, naming whoever
            registry.check_free(dev, ns or netns.current(), fix=FORCE_FIX)   # holds the device
        self.verify_csum = lookup.csum_complete(dev, ns) if cfg.verify_csum is None \
            else bool(cfg.verify_csum)
        #: which sender this endpoint's pushes use and why (options.SenderChoice)
        self.sender_choice = choose_sender(options.sender, lambda: grow_verdict(mode),
                                           where=f"Endpoint({dev!r})")
        options = dataclasses.replace(options, sender=self.sender_choice.sender)
        self.dp = Dataplane(Geometry(slots=self.slots, max_chunks=max_chunks,
                                     chunk_bytes=chunk_bytes, banks=cfg.banks,
                                     stride=cfg.bank_stride, port=port),
                            job=job)
        self._published = None
        self.seat: mux.Seat | None = None
        self.role = cfg.role or ("worker" if self_id is not None else "ps")
        try:
            self.maps = self.dp.maps()
            self.maps.set_peers(self.peers)
            self.maps.set_liveness(cfg.liveness_s)
            self.maps.set_verify_csum(self.verify_csum)
            self.sock = succeeds.sock if succeeds is not None else \
                udp_socket(ip, ns, port, strict=cfg.shared)
            if self_id is not None:
                self.maps.set_self(self_id, ip, device_mac(self.sock, dev))
            self.receiver = Receiver(self.maps, self.peers, self.slots, chunk_bytes=chunk_bytes,
                                     max_elems=max_elems, capacity_bps=capacity_bps,
                                     share=share, early=early,
                                     bubble_strategy=cfg.bubble_strategy, tokens=tokens,
                                     window=credit_window(capacity_bps, chunk_bytes,
                                                          cfg.credit_bytes))
            self.sender = Sender(self.sock, self.maps, self.peers, job=job,
                                 chunk_bytes=chunk_bytes, max_elems=max_elems, initial_rate_bps=(
                                     cfg.initial_rate_bps or capacity_bps / max(1, len(peers))),
                                 tokens=tokens, options=options,
                                 kinds={"socket": Push, "xdp": ClockPush},
                                 why=self.sender_choice.why,
                                 asked_auto=self.sender_choice.asked == AUTO,
                                 auto=lambda: self._auto_choice(mode))
            self._onto(dev, mode, succeeds)    # last, all of it ready
        except BaseException:  # nothing of a half-made endpoint stays attached or listed
            if getattr(self, "sock", None) is not None and \
                    (succeeds is None or succeeds.sock is not self.sock):   # not its yet
                self.sock.close()
            try:
                self._leave()
            finally:
                self._withdraw()
                self.dp.close()
            raise
        self.protected = tokens.protected
        fine_timer_slack()

    def _onto(self, dev: str, mode: str, succeeds) -> None:
        """This endpoint's program onto the device, and its record: in
        `succeeds`'s place (its device or seat, at once, and its socket), in
        a seat of the device's mux (shared), or the device its own. Last in
        the making, so after a successor's switch nothing can fail but the
        record."""
        cfg, ns = self.config, self.ns
        if succeeds is not None:
            succession.take_place(self, succeeds)
        elif cfg.shared:
            self.seat = mux.take_seat(dev, ns, mode, self.dp.prog_fd, self.port)
        else:
            self.dp.attach(dev, ns, mode, force=cfg.force, fix=FORCE_FIX)
        if cfg.publish:     # a record (the seat's, if shared): `ltp status/flows/top`
            self._publish(dev, ns, mode)

    def _auto_choice(self, mode: str):
        """What auto picks here (options.SenderChoice): the endpoint's choice
        if it asked for auto, else the grow check's now (a push asking for
        auto on an endpoint given a sender)."""
        if self.sender_choice.asked == AUTO:
            return self.sender_choice
        return choose_sender(AUTO, lambda: grow_verdict(mode), where="Endpoint")

    def _publish(self, dev: str, ns: str | None, mode: str) -> None:
        ns = ns or netns.current()  # a process started inside a namespace
        self._published = registry.publish(self.dp, dev, ns, role=self.role, job=self.job,
                                           label=self.config.label,
                                           mode=mode, peers=self.peers,
                                           sender=self.sender_choice.sender,
                                           sender_why=self.sender_choice.why,
                                           seat_link=self.seat.link_id() if self.seat else 0)

    def _withdraw(self) -> None:
        if self._published:
            registry.withdraw(self._published)
            self._published = None

    # The receive policies live with the receiver; tests and callers swap them here.
    early = _on("receiver", "early", "the Early Close state (EarlyClose)")
    share = _on("receiver", "share", "the rate share policy (SharePolicy)")
    bubble_strategy = _on("receiver", "bubble_strategy", "how holes are filled (bubble.STRATEGIES)")
    initial_rate_bps = property(lambda self: self.sender.initial_rate_bps,
                                doc="the rate a first push to a peer starts at")

    # ------------------------------------------------------------------ receive
    def open_round(self, round_: int, nelems: int, workers: list[int] | None = None,
                   critical: np.ndarray | None = None, reliable: bool = False,
                   early: EarlyClose | None = None, code: tuple | None = None) -> None:
        """Make round_ receivable for `workers` (default: all peers).

        critical: bool per chunk that must arrive from every worker before the
        round may close. reliable: every chunk is critical and only
        completeness (or the hard timeout, an error) closes the round.
        early: the Early Close state that judges this round (rounds of
        different kinds open at once each keep their own; default: the
        endpoint's `early`). code: a coded or deferred reliable round's
        (plan, data elements): expect() and expect_deferred() say it."""
        self.receiver.open(round_, nelems, workers, critical, reliable, early, code)

    def wait_round(self, round_: int, poll_s: float = 0.0003) -> RoundResult:
        """Block until round_ closes (Early Close rules); return the filled result.

        Polls the mapped progress counters, sleeping while much data is still
        to come, so a receiver that waits costs little CPU (many share a
        machine on the rig) and still sees the last chunk within `poll_s`."""
        return self.receiver.wait(round_, poll_s)

    def arrived_from(self, round_: int, chunk: int) -> bool:
        """Whether a chunk at index `chunk` or later of open round_ (a
        reliable answer) has arrived (Receiver.arrived_from)."""
        return self.receiver.arrived_from(round_, chunk)

    def drop_worker(self, round_: int, worker: int) -> None:
        """Take no more of `worker`'s DATA in open round_ (see Receiver.drop)."""
        self.receiver.drop(round_, worker)

    def cancel_round(self, round_: int) -> None:
        """Retire an open round without collecting it (its bank is closed)."""
        self.receiver.cancel(round_)

    def retire(self, round_: int, source_worker: int) -> None:
        """Take round_ (`source_worker`'s slot) as over though this endpoint
        never held it: its late DATA, with the round's tokens, is ACKed
        CLOSED, never written. An endpoint made anew keeps so answering the
        re-sends of a round the one before it took: the sender, whose ACKs
        were lost, stops at once instead of taking this host for dead."""
        self.receiver.open(round_, 1, [source_worker], reliable=True)
        self.receiver.cancel(round_)

    # --------------------------------------------------------------------- send
    def push(self, round_: int, buf, to: Peer | list[Peer], spec: PushSpec | None = None,
             **fields) -> PushReport:
        """Send buf (float32) as round_ to one or more peers; `spec` (a
        PushSpec, or its fields as keywords over it: critical, reliable,
        timeout_s, seed, group, over, options) says how.

        Chunks go in a per-round random order, paced to the rate the receiver
        advertises. Unacknowledged chunks are re-sent (flagged RETX) while the
        receiver keeps the round open; a receiver closes a round only once its
        critical chunks (all of them with reliable=True) are in, so critical
        data is re-sent until it arrives. Returns when every target closed the
        round or acknowledged every chunk.

        A target that answers nothing is re-sent to ever more rarely and
        sparingly (lossdetect.Backoff: two more passes' worth of probes,
        past that a chunk a second); if it is still silent at `timeout_s`, DeadPeerError (a
        TransportError) names it, its `report` the push so far.

        group: (address, port) of a broadcast address or multicast group that
        reaches every target. The first pass then goes once, to the group,
        instead of once per target (each target's XDP program must know its
        own id: Endpoint(self_id=...)); what a target lacks after that is
        re-sent to it alone.

        over: a callable, True once the round is known to be over everywhere
        (push.Push.over): the push then ends as if every target closed it.

        options: this push's sender and clock knobs (options.PushOptions;
        default: the endpoint's), for a benchmark taking turns between arms."""
        return self.prepare_push(round_, buf, to, spec, **fields).send()

    def prepare_push(self, round_: int, buf, to: Peer | list[Peer],
                     spec: PushSpec | None = None, **fields) -> Push:
        """Everything `push` does before its first packet (checks, chunk order,
        headers, sender state), so a caller can do it ahead of a barrier and
        `send` the plan the moment the round starts. `buf` must not change
        until `send` returns."""
        return self.sender.prepare(round_, buf, to, PushSpec.of(spec, **fields))

    def send(self, plan: Push) -> PushReport:
        """Send a prepared push (see `push`)."""
        return plan.send()

    # ------------------------------------------------------- reliable downlink
    def push_reliable(self, round_: int, buf, to: list[Peer], timeout_s: float = PUSH_TIMEOUT_S,
                      group: tuple[str, int] | None = None, coded: bool = False) -> PushReport:
        """Send buf to every peer in `to`, every chunk critical, until all acked
        (group: see `push`).

        coded: erasure-code the round (fec.py; the receivers `expect` it
        coded): the buffer goes padded to whole chunks with Reed-Solomon
        parity, as many per group as the loss this endpoint's reliable pushes
        met calls for (none at 0 %), so a receiver rebuilds what it lost
        without a round trip; only groups beyond repair are re-sent. A coded
        push goes from the socket (the ACK clock sends whole orders)."""
        if not coded:
            return self.push(round_, buf, to, reliable=True, timeout_s=timeout_s, group=group)
        arr = as_f32(buf)
        cb = self.sender.chunk_bytes
        plan = fec.plan_for(arr.size, cb // 4)
        r = fec.parity_for(self.sender.loss_hat)   # DATA loss: SACK covers lost ACKs
        out = np.zeros(plan.nchunks * cb // 4, dtype=np.float32)
        out[:arr.size] = arr
        fec.encode(plan, out.view(np.uint8).reshape(plan.nchunks, cb), r)
        plan_push = self.prepare_push(round_, out, to, reliable=True, timeout_s=timeout_s,
                                      group=group,
                                      options=dataclasses.replace(self.sender.options, sender="socket"))
        plan_push.code(plan, r)
        return plan_push.send()

    def push_deferred(self, round_: int, buf, to: list[Peer], *, critical_from: int,
                      timeout_s: float = PUSH_TIMEOUT_S, group: tuple[str, int] | None = None,
                      sign=None, sig_bytes: int = 0, memo: dict | None = None) -> PushReport:
        """Send buf to every peer in `to` tolerantly (defer.py; the receivers
        `expect_deferred` it): once, the elements from `critical_from` on
        re-sent until every peer has them, then the verdict naming the
        chunks some peer may lack, which every peer leaves out (zero).
        `sign(answer as used)` gives its `sig_bytes`-byte signature. `memo`
        (a dict) keeps each round's verdict, so a retry of the round sends
        the same one. The report's `deferred` is the mask (per chunk)."""
        memo = {} if memo is None else memo
        rep, verdict = defer.push(self, round_, as_f32(buf), to, critical_from=critical_from,
                                  group=group, timeout_s=timeout_s, sign=sign,
                                  sig_bytes=sig_bytes, memo=memo)
        rep.deferred = verdict[0]
        return rep

    def expect_deferred(self, round_: int, nelems: int, source_worker: int,
                        sig_bytes: int = 0) -> defer.Plan:
        """Open round_ for a tolerant answer of nelems elements (defer.py):
        complete once its verdict is in and every chunk the verdict does not
        defer; the deferred chunks read zero. The plan returned holds the
        verdict (and its signature) once it is in."""
        cb = self.sender.chunk_bytes
        data = ChunkLayout(nelems, cb).nchunks
        plan = defer.Plan(data, defer.extra_chunks(data, cb, sig_bytes))
        self.open_round(round_, plan.nchunks * cb // 4, workers=[source_worker], reliable=True,
                        code=(plan, nelems))
        return plan

    def expect(self, round_: int, nelems: int, source_worker: int, coded: bool = False) -> None:
        """Open round_ to receive a reliable buffer (e.g. parameters) for
        `source_worker`'s slot (a worker uses its own id); coded: the sender
        pushes it coded (push_reliable), and it completes once every group
        can be rebuilt."""
        if not coded:
            self.open_round(round_, nelems, workers=[source_worker], reliable=True)
            return
        plan = fec.plan_for(nelems, self.sender.chunk_bytes // 4)
        self.open_round(round_, plan.nchunks * self.sender.chunk_bytes // 4,
                        workers=[source_worker], reliable=True, code=(plan, nelems))

    def receive(self, round_: int, timeout_s: float | None = None,
                out: np.ndarray | None = None) -> np.ndarray:
        """Wait for a reliable round to complete; returns a copy of the buffer
        (written into `out`, a float32 array of the round's size, if given)."""
        res = self.receive_round(round_, timeout_s)
        if out is not None:
            np.copyto(out, res.values[0])
            return out
        return res.values[0].copy()

    def receive_round(self, round_: int, timeout_s: float | None = None) -> RoundResult:
        """`receive`, but the round's whole result (values in mapped memory)."""
        if timeout_s is not None:
            self.receiver.limit(round_, timeout_s)
        res = self.wait_round(round_)
        if res.reason != COMPLETE:
            raise TransportError(f"reliable round {round_} incomplete after "
                                 f"{res.duration_s:.2f}s: {res.masks.sum()}/{res.masks.size} chunks")
        return res

    # ------------------------------------------------------------------- misc
    def beat(self) -> None:
        """Tell the XDP program this endpoint is alive (see liveness_s): for
        a caller that keeps a round open while it does something else for
        longer than liveness_s (its waits and pushes beat by themselves)."""
        self.maps.beat()

    def counters(self) -> dict[str, int]:
        return self.maps.counters()

    def _leave(self) -> None:
        """A shared endpoint's seat emptied (before its program goes)."""
        seat, self.seat = self.seat, None
        if seat is not None:
            seat.leave()

    def close(self) -> None:
        try:
            if self.sock is not None:    # a successor's now (succeeds=)
                self.sock.close()
        finally:
            try:
                self._leave()
            finally:
                self._withdraw()
                self.dp.close()

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["Endpoint", "EndpointConfig", "PushSpec", "Peer", "PushReport", "RoundResult", "TransportError",
           "DeadPeerError", "EarlyCloseConfig", "COMPLETE", "DEADLINE", "TIMEOUT"]
