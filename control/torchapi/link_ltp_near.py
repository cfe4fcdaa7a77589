# SPDX-License-Identifier: Apache-2.0
"""A worker and an LTP server on one host, in one network namespace: a
co-located trainer's own slice, and another trainer's of its node, off the
wire, where XDP never sees it (colocate.py; docs/transport.md, "One device
for every role").

Trainer r's worker and server r share the trainer's device (each a seat of
its mux), but the worker's slice for the server beside it would go to the
host's own address, which the kernel delivers through its own stack: XDP
never sees it. So the worker reaches a server on its host by the server's
Unix socket (localsock.py; sockchannel.py's `SockChannel`: the TCP
transport's hello, a MAC under the job key, and its header), or, where the
server is in its own process (on a thread: LTP_COLOCATE_THREAD=1), in
memory (handoff.py's `Pair`). The worker gives its piece of a round as it would push it on the
wire (compressed where its op's wire says), and the server takes it
straight into that worker's row of the round; the server gives its answer
as it would send it (compressed, signed), and the worker takes it and
checks and decodes it as an answer off the wire. The other workers' rows
come over XDP as always, in the same round, closed by Early Close; a local
row is whole, or, late in a round Early Close may close without it, left
out as a far straggler's is (`NearRows.gather`).

`NearRows` is the server's side: which workers are near, and a round's rows
put together, in the workers' order (the sum's order, so a replica sums as
one whose every row came over the wire).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait

import numpy as np

from ...errors import CommError
from ..accept import accept_workers
from ..transport.bubble import fill as bubble_fill
from ..transport.early_close import COMPLETE
from ..transport.results import Arrivals
from ..trust.hello import MAC_HELLO, mac_hello, mac_parser
from .handoff import pair as handoff_pair, proc
from .links import Gathered
from .localsock import connect_local, here, listen_local, on_host, unlisten
from .sockchannel import HEAD_S, SockChannel


BEAT_S = 0.2     # a wait for a near row beats the endpoint this often


def as_bytes(buf: np.ndarray) -> memoryview:
    """buf's bytes, for a Slot (a contiguous copy where it is not one)."""
    return memoryview(np.ascontiguousarray(buf).view(np.uint8))


class NearRows:
    """An LTP server's workers on its host (near), their channels, and its
    open rounds as they concern them."""

    def __init__(self, ip: str, port: int, host: str, key=None):
        self.ip, self.port, self.host, self.key = ip, port, host, key
        self.pairs: dict = {}       # worker id -> its handoff.Pair or SockChannel
        # open round -> (wire elems, open ns, reliable)
        self.sizes: dict[int, tuple[int, int, bool]] = {}
        self.wired: set[int] = set()           # open rounds with workers over XDP too
        self.took: dict[int, set[int]] = {}    # answer -> the near workers that took it
        self.beat = None                       # keeps the endpoint ACKing while rows wait
        self.pool: ThreadPoolExecutor | None = None
        # a row left out: its worker's pieces up to late[w] are let go as they
        # come (_drain, one live a worker at most, draining[w] its future)
        self.late: dict[int, int] = {}
        self.draining: dict[int, Future] = {}
        self.live: dict[int, object] = {}      # worker -> the token of its live drain
        self.mid: set[int] = set()             # workers whose drain is mid-piece
        self.lock = threading.Lock()
        self.ux, self.ux_path = listen_local(ip, port, 64)   # for workers on this host

    def address(self) -> dict:
        return {"proc": proc(), "host": self.host, **here(),
                **({"unix": self.ux_path} if self.ux_path else {})}

    def connect(self, metas: dict[int, dict], ids: list[int], timeout_s: float) -> None:
        """The workers on this host: those in this process a pair each, the
        others by the Unix socket (each says its hello first: accept.py)."""
        near = [w for w in ids if on_host(metas.get(w, {}), self.host)]
        self.pairs = {w: handoff_pair(self.ip, self.port, w) for w in near
                      if metas[w].get("proc") == proc()}
        here = [w for w in near if w not in self.pairs]
        try:
            if here and self.ux is None:
                raise CommError(f"worker(s) {here} share this server's host, which has no "
                                "place for the local socket they need (localsock.py)")
            if here:
                got = accept_workers([self.ux], len(here), MAC_HELLO.size,
                                     mac_parser(here, self.key), timeout_s)
                if len(got.conns) < len(here):
                    for c in got.conns.values():
                        c.close()
                    raise CommError(f"only {len(got.conns)} of the {len(here)} workers on "
                                    f"this host connected within {timeout_s:g}s")
                self.pairs.update({w: SockChannel(c, w) for w, c in got.conns.items()})
        finally:   # every worker is in (or the job ends): the file goes
            unlisten(self.ux, self.ux_path)
            self.ux = self.ux_path = None

    def __bool__(self) -> bool:
        return bool(self.pairs)

    def far(self, workers: list[int]) -> list[int]:
        return [w for w in workers if w not in self.pairs]

    def near_of(self, workers: list[int]) -> list[int]:
        """Those of `workers` that are near."""
        return [w for w in workers if w in self.pairs]

    def opened(self, r: int, nelems: int, wired: bool, reliable: bool = True) -> None:
        self.sizes[r] = (nelems, time.monotonic_ns(), reliable)
        if wired:
            self.wired.add(r)

    def cancel(self, r: int) -> bool:
        """Round r forgotten; True if it was open over XDP too."""
        self.sizes.pop(r, None)
        if r in self.wired:
            self.wired.discard(r)
            return True
        return False

    def clear(self) -> None:
        self.sizes.clear()
        self.wired.clear()

    def gather(self, r: int, workers: list[int], res, chunk_elems: int,
               wait_s: float, fill: str | None = None) -> Gathered:
        """Round r's rows in `workers`' order: the far ones from `res` (the XDP
        round's result, None when every worker is near; its holes zero), the
        near ones taken from their pairs, whole; `fill`: the far rows'
        holes Bubble-Filled from every row ("mean")."""
        n, open_ns, reliable = self.sizes.pop(r)
        self.wired.discard(r)
        # a round Early Close may close without every row: a local row not in
        # a deadline (the round's) after the far ones closed is left out, as
        # a far straggler's is; else (reliable, whole, all local) it is awaited
        soft = res is not None and not reliable and res.threshold < 1.0
        until = time.monotonic() + (min(res.deadline_s, wait_s) if soft else wait_s)
        far = [] if res is None else list(res.workers)
        ws = sorted(set(far) | {w for w in workers if w in self.pairs})
        nch = -(-n // chunk_elems) if n else 0
        padded = np.zeros((len(ws), nch * chunk_elems), dtype=np.float32)
        values = padded[:, :n]
        masks = np.ones((len(ws), nch), dtype=bool)
        filled = np.zeros(len(ws), dtype=np.int64)
        took = np.zeros(len(ws), dtype=np.int64)
        at = {w: j for j, w in enumerate(far)}     # a far worker's row in res
        for i, w in enumerate(ws):
            if w in at:
                j = at[w]
                values[i] = res.values[j]
                masks[i], filled[i] = res.masks[j], res.filled[j]
            elif (got := self._row(w, r, as_bytes(values[i]), until, soft, reliable)):
                took[i] = time.monotonic_ns()
            else:     # late: left out, its piece let go as it comes (_drain); or gone
                masks[i], filled[i] = False, nch
                if got is False:
                    self._let_go(w, r, wait_s)
        if fill is not None and not masks.all():
            bubble_fill(padded.reshape(len(ws), nch, chunk_elems), masks, fill)
        close_ns = max(int(took.max()) if len(ws) else 0,
                       res.arrivals.close_ns if res is not None and res.arrivals else 0)
        return Gathered(round=r, values=values, workers=ws, delivered=masks.sum(axis=1),
                        chunks=nch, filled=filled,
                        reason=COMPLETE if res is None else res.reason,
                        chunk_elems=chunk_elems, masks=masks,
                        duration_s=(close_ns - open_ns) / 1e9 if res is None else res.duration_s,
                        error=0.0 if res is None else res.error["vs_noise"],
                        arrivals=_arrivals(res, at, ws, took, open_ns, close_ns),
                        attribution=None if res is None else res.attribution)

    def _row(self, w: int, r: int, into: memoryview, until: float, soft: bool,
             reliable: bool) -> bool | None:
        """take(), and None where worker w's socket ended in a tolerant round:
        its trainer died (its server serves on, childserver.py), and the
        row is missing, as a dead far worker's is, until the barrier drops it."""
        try:
            return self.take(w, r, into, until, soft)
        except CommError:
            if reliable or not getattr(self.pairs[w], "closed", ""):
                raise
            return None

    def take(self, w: int, r: int, into: memoryview, until: float, soft: bool) -> bool:
        """Worker w's piece of round r into `into`, the endpoint beaten while
        it is awaited (its XDP program keeps ACKing the rounds open on it);
        an earlier round's piece, one given up on, is let go. Not begun by
        `until` (time.monotonic): False where `soft`, else a CommError. One
        begun is taken whole, as its header was read (HEAD_S at least: on
        a busy host a large piece may come in after a soft round's deadline;
        cut short, the stream would be out of step)."""
        ch = self.pairs[w].up
        drain = self.draining.get(w)     # a piece left out is let go first
        while drain is not None and not wait([drain], BEAT_S).done:
            if self.beat is not None:
                self.beat()
            if soft and time.monotonic() > until and w not in self.mid:
                return False   # nothing more come: this row is late too (a piece begun is let go)
        self.draining.pop(w, None)
        while True:
            if ch.ready(BEAT_S):
                got = ch.peek()
                if got is not None and got < r:    # a round that went on without it
                    ch.drop()
                    continue
                ch.take(r, into, max(HEAD_S, until - time.monotonic()))
                return True
            if self.beat is not None:
                self.beat()
            if time.monotonic() > until:
                if soft:
                    return False
                raise CommError(f"{ch.what}: nothing of round {r} in time")

    def _let_go(self, w: int, r: int, wait_s: float) -> None:
        """Worker w's pieces up to round r's, left out, are read and let go
        as they come: a give waits for its take (a piece larger than the
        socket's buffer, or lent in memory), so its worker's next op would
        wait for it while the server's waits for that worker."""
        with self.lock:
            self.late[w] = r
            if w not in self.live:
                self.live[w] = token = object()
                self.draining[w] = self._pool().submit(self._drain, w, wait_s, token)

    def _drain(self, w: int, wait_s: float, token: object) -> None:
        """Let go worker w's pieces up to late[w] (it may rise meanwhile);
        up to wait_s. A later round's piece stays for its take."""
        ch, until = self.pairs[w].up, time.monotonic() + wait_s

        def through(got: int | None, dropped: bool) -> bool:
            """Whether this drain ends at the piece `got` (None: none, or
            the channel's end), said under the lock with its end, so a
            _let_go finds it live or gone, never ending."""
            with self.lock:
                last = self.late[w]
                if got is not None and (got < last or got == last and not dropped):
                    return False
                if self.live.get(w) is token:
                    del self.live[w]
                return True
        try:
            while time.monotonic() < until:
                if not ch.ready(BEAT_S):
                    continue
                got = ch.peek()
                if through(got, dropped=False):    # a later round's piece stays
                    return
                self.mid.add(w)
                try:
                    ch.drop()
                finally:
                    self.mid.discard(w)
                if through(got, dropped=True):
                    return
        except CommError:     # the channel ended: the next take says so
            pass
        through(None, dropped=False)

    def _pool(self) -> ThreadPoolExecutor:
        """Threads for the gives (answers) and drains (late pieces): two a worker."""
        if self.pool is None:
            self.pool = ThreadPoolExecutor(2 * len(self.pairs), thread_name_prefix="ltpx-near")
        return self.pool

    def give(self, d: int, wire: np.ndarray, near: list[int], wait_s: float):
        """Answer d (its words as they go on the wire) to the near workers
        `near`, a thread each: a wait() for them all (None: no one to give to)."""
        took = self.took.setdefault(d, set())
        for old in [k for k in self.took if k < d - 4]:
            del self.took[old]
        # a retry's: those that took it do not; nor a worker whose socket ended
        near = [w for w in near if w not in took and not getattr(self.pairs[w], "closed", "")]
        if not near:
            return None
        pool, body = self._pool(), as_bytes(wire)

        def one(w: int) -> None:
            self.pairs[w].down.give(d, body, wait_s)
            took.add(w)
        futs = [pool.submit(one, w) for w in near]

        def done() -> None:
            """Every give ended (none still lends the answer), then the first error."""
            wait(futs)
            for f in futs:
                f.result()
        return done

    def close(self) -> None:
        unlisten(self.ux, self.ux_path)
        self.ux = self.ux_path = None
        for p in self.pairs.values():
            p.close("the co-located LTP server")
        self.pairs, self.draining = {}, {}
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None


def _arrivals(res, at: dict[int, int], ws: list[int], took: np.ndarray, open_ns: int,
              close_ns: int) -> Arrivals | None:
    """The round's arrival times with a near worker's row stamped when it was
    taken; `at`: a far worker's row in res."""
    a = None if res is None else res.arrivals
    if res is not None and a is None:
        return None
    first, last, thresh = (np.zeros(len(ws), dtype=np.int64) for _ in range(3))
    for i, w in enumerate(ws):
        if w in at:
            j = at[w]
            first[i], last[i], thresh[i] = a.first_ns[j], a.last_ns[j], a.thresh_ns[j]
        else:
            first[i] = last[i] = thresh[i] = took[i]
    return Arrivals(open_ns=open_ns if a is None else a.open_ns, close_ns=close_ns,
                    first_ns=first, last_ns=last, thresh_ns=thresh)


def worker_pair(server: dict, worker: int, host: str, key, timeout_s: float):
    """The way to a server XDP never sees this worker's frames reach, one on
    this host in this network namespace: in memory where it is in this
    process too (its meta's `proc` this one's), else by its Unix socket;
    None: over the wire (a rank in another namespace is another host to
    the NIC, in this process or not)."""
    if not on_host(server, host):
        return None
    if server.get("proc") == proc():
        return handoff_pair(server["ip"], int(server["ltp_port"]), worker)
    sock = connect_local(server, host, timeout_s)
    if sock is None:
        raise CommError(f"the server at {server['ip']} shares this worker's host, and its "
                        "local socket does not answer: frames to it would never reach a NIC")
    try:
        sock.sendall(mac_hello(worker, key))
    except OSError as e:
        sock.close()
        raise CommError(f"the server at {server['ip']} on this host: its local socket: {e}") \
            from e
    return SockChannel(sock, worker)


def check_tolerant(deferred: bool) -> None:
    """Tolerant answers leave out chunks a worker lost, and every worker
    zeroes them: the near worker has no such loss to agree on."""
    if deferred:
        raise CommError("a co-located LTP server answers its own trainer in memory, which "
                        "tolerant answers (loss_policy defer) do not cover: use loss_policy "
                        "auto or repair")
