# SPDX-License-Identifier: Apache-2.0
"""The TCP links: the same server and workers over one TCP connection per worker
(the baseline; links.py says what each call does).

Each piece is a 12-byte header (magic, round, bytes) and the float32 body
(compressed, a step's pieces and answers are codec.py's words, as over LTP);
the congestion control is set per socket. Nothing is opened or lost: every
round is complete. The server reads its workers at once and writes the answer
to all of them at once: a piece of PARALLEL_BYTES or more on a thread per
worker (the copies in and out of the kernel then run side by side, each
releasing the GIL; LTP_TCP_THREADS=0 keeps them in the loop), a smaller one
in one non-blocking epoll loop. A worker whose connection ends (it died)
is gone: its rows of a tolerant round are filled (Bubble Filling, as a dead
worker's over LTP) until the server drops it, it gets no answers, and a
round that must be whole fails. Rounds go into two buffers in turn: the
op's next round (`ahead`, the server's hint) is read in while the server
sums the one before. A worker on the server's own host connects by a Unix
socket instead (localsock.py: the same stream, not through TCP/IP), and one
in the server's own process (a co-located trainer's) meets it in memory
(handoff.py: a copy each way, no socket).
"""
from __future__ import annotations

import errno
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...dataplane.tcp_cc import set_cc
from ...dataplane.xdp.wire import chunk_bytes_for
from ...errors import CommError
from .. import settings_table
from ..accept import accept_workers
from ..trust.hello import MAC_HELLO, mac_parser
from ..transport.bubble import fill as fill_bubbles
from .handoff import Pair, pair as handoff_pair, proc
from .codec import ServerCodec, answer_feedback
from .localsock import listen_local, ns_id, unlisten
from .links import Gathered, ServerLink
from .link_tcp_back import Gone, GoneAndBack, TakeBack, tune, whole
from .link_tcp_worker import HDR, TCP_MAGIC, TcpWorkerLink, iov
from .settings import Settings

PARALLEL_BYTES = 1 << 20          # a piece this large moves on a thread per worker

__all__ = ["HDR", "PARALLEL_BYTES", "TCP_MAGIC", "TcpServerLink", "TcpWorkerLink"]


class TcpServerLink(GoneAndBack, ServerLink):
    name = "tcp"
    opens = False

    def __init__(self, s: Settings, workers: int, key: bytes | None = None):
        self.ids, self.cc, self.timeout_s = list(range(workers)), s.cc, s.timeout
        self.key = key     # the hellos' MAC key (jobkey.hello_key)
        self.strays = 0    # connections that were not a worker's, closed
        # two buffers of rounds: one summed while the next is read in (`ahead`)
        self.bufs = [np.empty((workers, 0), dtype=np.float32) for _ in (0, 1)]
        self.side = 0
        self.hint: tuple | None = None      # the op's next round, to read ahead
        self.pre: tuple | None = None       # ((round, words, workers), side, its read's future)
        self.ahead_pool: ThreadPoolExecutor | None = None
        self.ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            set_cc(self.ls, self.cc)
            self.ls.bind((s.ip, s.tcp_port))
            self.ls.listen(workers + 8)
        except BaseException:
            self.ls.close()
            raise
        self.ip, self.port = s.ip, self.ls.getsockname()[1]
        # workers on this host come by a Unix socket (localsock.py)
        self.ux, self.ux_path = listen_local(s.ip, self.port, workers + 8) \
            if settings_table.env("tcp_local") else (None, None)
        self.conns: list[socket.socket | None] = []   # None: a worker in this process
        self.back: TakeBack | None = None      # workers that connect again (`connect`)
        self.near: dict[int, Pair] = {}        # by index: those workers' pairs
        # compressed (a step's Op.wire), pieces are the same words as over LTP
        # (its chunk size for the MTU)
        self.compress, self.chunk_bytes, self.wire = s.compress, chunk_bytes_for(s.mtu), "none"
        self.codec = ServerCodec(self.chunk_bytes, answer_feedback(s))
        self.threads = settings_table.env("tcp_threads")
        self.pool: ThreadPoolExecutor | None = None   # a thread per worker (`_each`)
        self.pool_lock, self.closed = threading.Lock(), False
        self.gone: set[int] = set()           # workers whose connection ended (`lose`)
        self.joining: set[int] = set()        # ... admitted again (`readmit`)
        self.lost_in: dict[int, frozenset] = {}   # round -> those gone when it was read
        self.bubble, self.exact = "mean", {}  # the fill; round -> must it be whole

    def address(self) -> dict:
        return {"port": self.port, "compress": self.compress, "chunk_bytes": self.chunk_bytes,
                "proc": proc(),
                **({"unix": self.ux_path, "netns_id": ns_id("net")} if self.ux_path else {})}

    def connect(self, metas: dict[int, dict]) -> None:
        """Accept one connection per worker; each says its id and a MAC of it
        under the job key first (accept.py: any other connection is closed,
        counted in `strays`, and the wait goes on). A worker in this process
        (its meta's `proc` this one's) meets the server in memory instead."""
        if settings_table.env("tcp_local"):
            self.near = {i: handoff_pair(self.ip, self.port, w) for i, w in enumerate(self.ids)
                         if metas.get(w, {}).get("proc") == proc()}
        far = [w for i, w in enumerate(self.ids) if i not in self.near]
        try:
            got = accept_workers([self.ls] + ([self.ux] if self.ux else []), len(far),
                                 MAC_HELLO.size, mac_parser(far, self.key), self.timeout_s)
        finally:   # every worker is in (or the job ends): the file goes
            unlisten(self.ux, self.ux_path)
            self.ux = self.ux_path = None
        self.strays += got.strays
        by_id = got.conns
        if len(by_id) < len(far):
            for c in by_id.values():
                c.close()
            raise CommError(f"only {len(by_id)} of {len(far)} workers connected within "
                            f"{self.timeout_s:g}s ({got.strays} other connection(s) closed: "
                            "a hello without this job's key?)")
        self.conns = [tune(by_id[w], self.cc) if w in by_id else None for w in self.ids]
        self.back = TakeBack(self.ls, far, self.key, self.cc)   # restarted ones, mid-job

    def ensure(self, nelems: int) -> bool:
        self._settle()
        self.take_back()     # a restarted worker's new connection, at an op's start
        for side in (0, 1):
            self._grow(side, nelems)
        return False

    def _grow(self, side: int, nelems: int) -> None:
        if self.bufs[side].shape[1] < nelems:
            self.bufs[side] = np.empty((len(self.ids), nelems), dtype=np.float32)

    def configure(self, bubble: str, early_close: str, wire: str = "none",
                  carry: bool = False) -> None:
        self.wire = wire   # nothing is lost over TCP but a dead worker's rows
        self.bubble = bubble
        self.codec.set_carry(carry)

    def open(self, r: int, nelems: int, workers: list[int], reliable: bool, key=None) -> None:
        # a connection is always open; only the piece's form is noted
        self.codec.open(r, nelems, reliable, self.wire)
        self.exact[r] = reliable

    def cancel(self, r: int) -> None:
        self.codec.cancel(r)
        self.exact.pop(r, None)

    def _ready(self, event: int, idx: list[int], done: set[int],
               stalled: Callable[[], str]) -> Iterator[int]:
        """The index of each connection in idx ready for `event`, until the caller
        has put every one in `done`; CommError(stalled()) after self.timeout_s idle."""
        fds = {self.conns[i].fileno(): i for i in idx}
        poller = select.epoll()
        try:
            for fd in fds:
                poller.register(fd, event)
            deadline = time.monotonic() + self.timeout_s
            while len(done) < len(idx):
                events = poller.poll(1.0)
                if not events and time.monotonic() > deadline:
                    raise CommError(stalled())
                for fd, _ in events:
                    i = fds[fd]
                    yield i
                    if i in done:
                        poller.unregister(fd)
        finally:
            poller.close()

    def _recv_some(self, i: int, into: memoryview) -> int:
        try:
            k = self.conns[i].recv_into(into)   # BlockingIOError: nothing there after all
        except ConnectionError as e:
            raise Gone(i, f"worker {self.ids[i]}'s connection: {e}") from e
        if k == 0:
            raise Gone(i, f"worker {self.ids[i]} closed its connection")
        return k

    def ahead(self, r: int, nelems: int, workers: list[int]) -> None:
        """The op's next round: read it in (on a thread, into the other of two
        buffers) as soon as the round now gathered is in, while the server
        sums that one. Only a large uncompressed round (PARALLEL_BYTES), and
        only with LTP_TCP_THREADS."""
        if self.threads and nelems * 4 >= PARALLEL_BYTES and self.codec.compressed(r) is None:
            self.hint = (r, nelems, list(workers))

    def gather(self, r: int, nelems: int, workers: list[int]) -> Gathered:
        """Round r's header and piece from every worker in `workers` at once
        (read ahead, if `ahead` named it; then the next one named starts)."""
        t0 = time.perf_counter()
        hint, self.hint = self.hint, None
        n = nelems
        codec = self.codec.compressed(r)
        if codec is not None:
            nelems = codec.words(n)
        pre, self.pre = self.pre, None
        if pre is not None:
            (pr, pn, pws), side, fut = pre
            fut.result()          # its error, if the read failed
            if (pr, pn, pws) != (r, nelems, list(workers)):
                raise CommError(f"round {r} asked for, round {pr} ({pn} elements from "
                                f"workers {pws}) read ahead")
        else:
            side = self.side = self.side ^ 1
            self._grow(side, nelems)
            self._read(r, nelems, workers, side)
        if hint is not None and hint[0] != r:
            other = side ^ 1
            self._grow(other, hint[1])
            self.side = other
            self.pre = (hint, other, self._reader().submit(self._read, *hint, other))
        values = self.bufs[side]
        exact = self.exact.pop(r, True)
        gone = self.lost_in.pop(r, ())      # as its read left them (the next one may lose more)
        lost = np.array([w in gone for w in workers], dtype=bool)
        if lost.any() and exact:
            raise whole(r, [self.ids[w] for w, x in zip(workers, lost) if x])
        rows = values[workers, :nelems] if workers != self.ids else values[:, :nelems]
        if lost.any():
            rows[lost] = 0        # what a dead worker left half-sent is not decoded
        if n != nelems:
            rows = self.codec.decode(r, rows, None, "zero")
        if lost.any() and rows.shape[1]:     # as a dead worker's over LTP: Bubble Filling
            fill_bubbles(rows.reshape(len(workers), 1, -1), ~lost[:, None],
                         "mean" if self.bubble == "mean" else "zero")
        return Gathered(round=r, values=rows, workers=list(workers),
                        delivered=(~lost).astype(np.int64), chunks=1,
                        filled=lost.astype(np.int64), reason="early" if lost.any() else
                        "complete", duration_s=time.perf_counter() - t0)

    def _read(self, r: int, nelems: int, workers: list[int], side: int) -> None:
        """Round r (nelems words from each of `workers`) into buffer `side`."""
        need = nelems * 4
        values = self.bufs[side]
        hdrs = {i: bytearray(HDR.size) for i in workers}
        hgot, got = dict.fromkeys(workers, 0), dict.fromkeys(workers, 0)
        views = {i: memoryview(values[i, :nelems]).cast("B") for i in workers}

        def step(i: int) -> bool:
            """Read what worker i has sent of the round (BlockingIOError: nothing
            there); True once it is whole, or the worker is gone."""
            try:
                return take(i)
            except Gone as e:
                self.lose(e.i, f"round {r}", str(e))
                if self.exact.get(r, False):    # no use waiting for the others
                    raise whole(r, [self.ids[e.i]]) from e
                return True

        def take(i: int) -> bool:
            if hgot[i] < HDR.size:
                hgot[i] += self._recv_some(i, memoryview(hdrs[i])[hgot[i]:])
                if hgot[i] == HDR.size:
                    magic, rnd, nbytes = HDR.unpack(hdrs[i])
                    if magic != TCP_MAGIC or rnd != r or nbytes != need:
                        raise CommError(f"worker {i}: bad header (round {rnd}, {nbytes} "
                                        f"bytes; want round {r}, {need} bytes)")
                if need:
                    return False
            if need:
                got[i] += self._recv_some(i, views[i][got[i]:])
            return got[i] == need and hgot[i] == HDR.size

        def stalled(left) -> str:
            return (f"round {r}: workers {sorted(left)} sent nothing complete within "
                    f"{self.timeout_s:g}s")

        def near(i: int, abort: threading.Event) -> None:
            self.near[i].up.take(r, views[i], self.timeout_s, abort)
        self._each(select.EPOLLIN, [i for i in workers if i not in self.gone], need, step,
                   stalled, near)
        self.lost_in[r] = frozenset(i for i in workers if i in self.gone)

    def _reader(self) -> ThreadPoolExecutor:
        if self.ahead_pool is None:
            self.ahead_pool = ThreadPoolExecutor(1, thread_name_prefix="ltpx-tcp-ahead")
        return self.ahead_pool

    def _settle(self) -> None:
        """A round read ahead and never gathered (its op given up): waited for;
        read whole, it is dropped (the connections are where the next op
        starts); a read that failed leaves them out of step: CommError."""
        pre, self.pre = self.pre, None
        if pre is None:
            return
        (r, _, _), _, fut = pre
        err = fut.exception()
        self.lost_in.pop(r, None)
        if err is not None:
            raise CommError(f"round {r}, read ahead and never gathered, failed ({err}): the "
                            "workers' connections are out of step") from err

    def send(self, d: int, buf: np.ndarray, group: bool, *, to: list[int] | None = None,
             wait_s: float | None = None, critical_from: int | None = None) -> None:
        """The answer to every connected worker at once (non-blocking writes):
        each gets every byte within the link's timeout or the send fails, so
        `to`, `wait_s` (for a lossy transport's silent peers) and `critical_from` (its
        tolerance) do not apply."""
        buf = self.codec.answer(buf, d)    # buf itself unless a compressed step preceded it
        body = memoryview(np.ascontiguousarray(buf)).cast("B")
        self._write(d, HDR.pack(TCP_MAGIC, d, len(body)), body)

    def _write(self, d: int, hdr: bytes, body: memoryview) -> None:
        """hdr + body to every connected worker at once (a worker in this
        process gets body, if any, as answer d)."""
        total = len(hdr) + len(body)
        sent = [0] * len(self.conns)

        def step(i: int) -> bool:
            """Write what worker i's connection takes (BlockingIOError: nothing
            it would take); True once it has it all."""
            try:
                sent[i] += self.conns[i].sendmsg(iov(hdr, body, sent[i]))
            except BlockingIOError:
                raise
            except ConnectionError as e:     # it died: no answer, it is gone
                self.lose(i, f"answer {d}", str(e))
                return True
            except OSError as e:
                if e.errno == errno.ENOBUFS:    # as a full buffer: wait for room
                    raise BlockingIOError(errno.ENOBUFS, str(e)) from e
                raise CommError(f"sending to worker {self.ids[i]}: {e}") from e
            return sent[i] == total

        def stalled(left) -> str:
            return f"answer {d} stalled for {self.timeout_s:g}s (workers {sorted(left)})"

        def near(i: int, abort: threading.Event) -> None:
            if len(body):
                self.near[i].down.give(d, body, self.timeout_s, abort)
        self._each(select.EPOLLOUT, [i for i in range(len(self.ids)) if i not in self.gone],
                   len(body), step, stalled, near)

    def _each(self, event: int, idx: list[int], nbytes: int, step: Callable[[int], bool],
              stalled: Callable[[set], str],
              near: Callable[[int, threading.Event], None] | None = None) -> None:
        """step(i) for each connection i in idx (near(i, abort) for a worker
        in this process, on a thread of its own, alongside): see `_far`."""
        close = [i for i in idx if i in self.near]
        if not close:
            return self._far(event, idx, nbytes, step, stalled)
        abort = threading.Event()
        futs = [self._pool().submit(near, i, abort) for i in close]
        try:
            self._far(event, [i for i in idx if i not in self.near], nbytes, step, stalled)
            futures.wait(futs, return_when=futures.FIRST_EXCEPTION)
        finally:
            abort.set()          # after an error, a take under way stops waiting
            futures.wait(futs)
        for f in futs:
            if f.exception() is not None:
                raise f.exception()

    def _pool(self) -> ThreadPoolExecutor:
        with self.pool_lock:    # the read ahead's thread and the server's may both ask first
            if self.closed:
                raise CommError("the TCP server link is closed")
            if self.pool is None:    # a thread per connection, and as many for a read ahead
                self.pool = ThreadPoolExecutor(2 * len(self.conns),
                                               thread_name_prefix="ltpx-tcp")
            return self.pool

    def _far(self, event: int, idx: list[int], nbytes: int, step: Callable[[int], bool],
             stalled: Callable[[set], str]) -> None:
        """step(i) for each connection i in idx whenever it is ready for
        `event`, until step says it is done: a piece of PARALLEL_BYTES or more
        on a thread per connection (each given up after the link's timeout
        with no byte moved), else in one epoll loop (after the timeout with
        nothing ready): CommError(stalled(those not done)). A step's error is
        raised here once every thread has stopped."""
        if not idx:
            return
        if not self.threads or nbytes < PARALLEL_BYTES or len(idx) < 2:
            done: set[int] = set()
            for i in self._ready(event, idx, done, lambda: stalled(set(idx) - done)):
                try:
                    if step(i):
                        done.add(i)
                except BlockingIOError:
                    continue
            return
        left = set(idx)
        failed = threading.Event()    # one connection's error stops the others' waits

        def one(i: int) -> None:
            poller = select.poll()
            poller.register(self.conns[i].fileno(), event)
            deadline = time.monotonic() + self.timeout_s   # moved on by each step that moves bytes
            while not failed.is_set():
                try:
                    if step(i):
                        left.discard(i)
                        return
                    deadline = time.monotonic() + self.timeout_s
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise CommError(stalled(left)) from None
                    poller.poll(200)
        futs = [self._pool().submit(one, i) for i in idx]
        futures.wait(futs, return_when=futures.FIRST_EXCEPTION)
        failed.set()                # the others stop at their next wake-up (done ones are)
        futures.wait(futs)
        for f in futs:
            if f.exception() is not None:
                raise f.exception()

    def close(self) -> None:
        with self.pool_lock:
            self.closed = True
        for pool in (self.pool, self.ahead_pool):
            if pool is not None:
                pool.shutdown(wait=False)
        self.pool = self.ahead_pool = None
        for c in self.conns:
            if c is not None:
                c.close()
        for pr in self.near.values():
            pr.close("the server")
        self.conns, self.near = [], {}
        if self.back is not None:
            self.back.close()
        self.ls.close()
        unlisten(self.ux, self.ux_path)
        self.ux = self.ux_path = None
