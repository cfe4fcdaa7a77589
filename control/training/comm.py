"""How gradients go up and parameters come down: LTP, or TCP sockets.

Both transports give the training loops (ps.py, worker.py) the same four calls, so the
training loop is one piece of code and a comparison is like with like:

  PS:      open(t)            make uplink round t receivable
           gather(t)          -> Gathered: one gradient row per worker
           broadcast(t, p)    parameters of version t to every worker
  worker:  expect(t)          be ready for parameters of version t
           push(t, g)         this worker's gradient for round t
           pull(t, out)       parameters of version t, copied into `out`

LTP: gradients go with the tolerable class (Endpoint.push; the PS's Early
Close may shut a round with chunks missing, Bubble Filling fills them), the
parameters with the reliable class (push_reliable / expect + wait_round).
Round numbers: uplink t = iteration t (1..T), downlink t = the parameters
after step t (0..T). Both use the same number on purpose: uplink banks live
on the PS's receiver and the workers' senders, downlink banks on the workers'
receivers and the PS's sender, so they never share one.

TCP: one persistent connection per worker (its congestion control set per
socket), a 12-byte header (magic, round, bytes) before each buffer.
"""
from __future__ import annotations

import errno
import select
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from ...dataplane.xdp import wire as W
from ..transport.early_close import COMPLETE, DEADLINE, EARLY, EarlyCloseConfig
from ..transport.endpoint import Endpoint, Peer
from ...dataplane.tcp_cc import set_cc
from ...errors import CommError

TCP_MAGIC = 0x4C545054            # "LTPT"
_TCP_HDR = struct.Struct(">III")  # magic, round, payload bytes
IP_UDP_LTP = 20 + 8 + 32          # IPv4 + UDP + LTP header bytes per datagram


def chunk_bytes_for(mtu: int) -> int:
    """The largest LTP chunk one frame of `mtu` carries, in whole float64 pairs
    (control/bench/cluster.py sizes its chunks alike, so a rig round looks the same)."""
    return (mtu - IP_UDP_LTP) // 8 * 8


@dataclass
class Gathered:
    """One uplink round as the PS sees it."""

    round: int
    values: np.ndarray            # float32 [W, n]: per-worker gradients (holes filled)
    workers: list[int]
    reason: str = COMPLETE        # complete | early | deadline | timeout (LTP), complete (TCP)
    delivered_fraction: float = 1.0
    duration_s: float = 0.0
    filled_chunks: int = 0
    late: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def early_closed(self) -> bool:
        return self.reason in (EARLY, DEADLINE)


# --------------------------------------------------------------------------- LTP

class LtpPs:
    """The PS side over LTP: one Endpoint (XDP on `dev`), a slot per worker."""

    name = "ltp"

    def __init__(self, dev: str, ip: str, workers: list[int], nelems: int, *,
                 ns: str | None = None, mode: str = "native", capacity_bps: float = 1e9,
                 mtu: int = 1500, job: int = 0, bubble: str = "mean",
                 early_close: EarlyCloseConfig | None = None, timeout_s: float = 30.0,
                 group: str | None = None):
        self.ids = list(workers)
        # the parameter downlink's first pass goes once, to this broadcast or
        # multicast address, instead of once per worker
        self.group = (group, W.PORT) if group else None
        self.nelems = nelems
        self.timeout_s = timeout_s
        self.ep = Endpoint(dev, ip, {w: i for i, w in enumerate(self.ids)}, nelems, ns=ns,
                           mode=mode,
                           job=job, capacity_bps=capacity_bps, chunk_bytes=chunk_bytes_for(mtu),
                           early_close=early_close, bubble_strategy=bubble)
        self.ip = ip
        self.peers: list[Peer] = []

    def address(self) -> dict:
        return {"ip": self.ip}

    def connect(self, workers: dict[int, dict]) -> None:
        """Learn each worker's address (from the rendezvous metadata)."""
        self.peers = [Peer(w, workers[w]["ip"]) for w in self.ids]

    def open(self, t: int) -> None:
        self.ep.open_round(t, self.nelems)

    def gather(self, t: int) -> Gathered:
        res = self.ep.wait_round(t)
        return Gathered(round=t, values=res.values, workers=res.workers, reason=res.reason,
                        delivered_fraction=res.delivered_fraction, duration_s=res.duration_s,
                        filled_chunks=int(res.filled.sum()), late=res.late,
                        extra={"active_s": res.active_s, "threshold": res.threshold,
                               "deadline_s": res.deadline_s, "retx_chunks": res.retx_chunks,
                               "missing_workers": res.missing_workers})

    def broadcast(self, t: int, params: np.ndarray) -> None:
        self.ep.push_reliable(t, params, self.peers, timeout_s=self.timeout_s, group=self.group)

    def close(self) -> None:
        self.ep.close()


class LtpWorker:
    """A worker over LTP: its own Endpoint with one slot (its id) for the downlink."""

    name = "ltp"

    def __init__(self, dev: str, ip: str, worker: int, nelems: int, *, workers: int,
                 ns: str | None = None, mode: str = "native", capacity_bps: float = 1e9,
                 mtu: int = 1500, job: int = 0, timeout_s: float = 30.0, poll_s: float = 0.0005):
        self.id, self.nelems = worker, nelems
        self.timeout_s, self.poll_s = timeout_s, poll_s
        # The downlink is reliable: only completeness closes it, or this timeout.
        cfg = EarlyCloseConfig(hard_timeout_s=timeout_s)
        self.ep = Endpoint(dev, ip, {worker: 0}, nelems, ns=ns, mode=mode, job=job,
                           capacity_bps=capacity_bps, chunk_bytes=chunk_bytes_for(mtu),
                           early_close=cfg, initial_rate_bps=capacity_bps / max(1, workers),
                           self_id=worker)  # so group-sent parameters are taken as its own
        self.ip = ip
        self.ps: Peer | None = None
        self.last_push = None

    def address(self) -> dict:
        return {"ip": self.ip}

    def connect(self, ps: dict) -> None:
        self.ps = Peer(self.id, ps["ip"])

    def expect(self, t: int) -> None:
        self.ep.expect(t, self.nelems, self.id)

    def push(self, t: int, grad: np.ndarray) -> None:
        self.last_push = self.ep.push(t, grad, self.ps, timeout_s=self.timeout_s)

    def pull(self, t: int, out: np.ndarray) -> None:
        # Endpoint.receive() returns a fresh copy; wait_round gives the view of
        # mapped memory, so the parameters are copied once, straight into `out`.
        res = self.ep.wait_round(t, poll_s=self.poll_s)
        if res.reason != COMPLETE:
            raise CommError(f"parameters of version {t} incomplete after "
                            f"{res.duration_s:.2f}s: {int(res.masks.sum())}/"
                            f"{res.masks.size} chunks")
        np.copyto(out, res.values[0])

    def close(self) -> None:
        self.ep.close()


# --------------------------------------------------------------------------- TCP

class TcpPs:
    """The PS side over TCP: a listening socket, one connection per worker."""

    name = "tcp"

    def __init__(self, ip: str, port: int, workers: list[int], nelems: int, *,
                 cc: str = "cubic", timeout_s: float = 60.0):
        self.ids = list(workers)
        self.nelems, self.cc, self.timeout_s = nelems, cc, timeout_s
        self.values = np.empty((len(self.ids), nelems), dtype=np.float32)
        self.ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        set_cc(self.ls, cc)
        self.ls.bind((ip, port))
        self.ls.listen(len(self.ids) + 8)
        self.ip, self.port = ip, self.ls.getsockname()[1]
        self.conns: list[socket.socket] = []

    def address(self) -> dict:
        return {"ip": self.ip, "port": self.port}

    def connect(self, workers: dict[int, dict]) -> None:
        """Accept one connection per worker; each says its id first."""
        by_id: dict[int, socket.socket] = {}
        self.ls.settimeout(self.timeout_s)
        try:
            while len(by_id) < len(self.ids):
                c, _ = self.ls.accept()
                c.settimeout(self.timeout_s)
                wid = struct.unpack(">I", _recv_exact(c, 4))[0]
                if wid not in self.ids or wid in by_id:
                    c.close()
                    raise CommError(f"unexpected worker id {wid} connected")
                set_cc(c, self.cc)
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                c.setblocking(False)
                by_id[wid] = c
        except TimeoutError:
            raise CommError(f"only {len(by_id)} of {len(self.ids)} workers connected within "
                            f"{self.timeout_s:g}s") from None
        self.conns = [by_id[w] for w in self.ids]

    def open(self, t: int) -> None:
        pass  # a TCP connection is always "open"

    def _ready(self, event: int, done: set[int], stalled: Callable[[], str]) -> Iterator[int]:
        """The index of each connection ready for `event`, until the caller has put
        every index in `done`; CommError(stalled()) once self.timeout_s has passed
        with nothing ready."""
        fds = {c.fileno(): i for i, c in enumerate(self.conns)}
        poller = select.epoll()
        try:
            for c in self.conns:
                poller.register(c.fileno(), event)
            deadline = time.monotonic() + self.timeout_s
            while len(done) < len(self.conns):
                events = poller.poll(1.0)
                if not events and time.monotonic() > deadline:
                    raise CommError(stalled())
                for fd, _ in events:
                    i = fds[fd]
                    yield i
                    if i in done:   # finished: no more events for it this round
                        poller.unregister(fd)
        finally:
            poller.close()

    def _recv_some(self, i: int, into: memoryview) -> int:
        k = self.conns[i].recv_into(into)   # BlockingIOError: nothing there after all
        if k == 0:
            raise CommError(f"worker {self.ids[i]} closed its connection")
        return k

    def gather(self, t: int) -> Gathered:
        """Read round t's header and gradient from every connection at once."""
        t0 = time.perf_counter()
        n = len(self.conns)
        need = self.nelems * 4
        hdrs = [bytearray(_TCP_HDR.size) for _ in range(n)]
        hgot = [0] * n
        views = [memoryview(self.values[i]).cast("B") for i in range(n)]
        got = [0] * n
        done: set[int] = set()

        def stalled() -> str:
            return (f"round {t}: workers {[self.ids[i] for i in range(n) if i not in done]} "
                    f"sent nothing complete within {self.timeout_s:g}s")
        for i in self._ready(select.EPOLLIN, done, stalled):
            try:
                if hgot[i] < _TCP_HDR.size:
                    hgot[i] += self._recv_some(i, memoryview(hdrs[i])[hgot[i]:])
                    if hgot[i] == _TCP_HDR.size:
                        magic, rnd, nbytes = _TCP_HDR.unpack(hdrs[i])
                        if magic != TCP_MAGIC or rnd != t or nbytes != need:
                            raise CommError(f"worker {self.ids[i]}: bad header (round {rnd}, "
                                            f"{nbytes} bytes; want round {t}, {need} bytes)")
                    continue
                got[i] += self._recv_some(i, views[i][got[i]:])
            except BlockingIOError:
                continue
            if got[i] == need:
                done.add(i)
        return Gathered(round=t, values=self.values, workers=list(self.ids),
                        duration_s=time.perf_counter() - t0)

    def broadcast(self, t: int, params: np.ndarray) -> None:
        """Send the parameters to every worker at once (non-blocking writes)."""
        body = memoryview(np.ascontiguousarray(params)).cast("B")
        hdr = _TCP_HDR.pack(TCP_MAGIC, t, len(body))
        total = len(hdr) + len(body)
        sent = [0] * len(self.conns)
        done: set[int] = set()

        def stalled() -> str:
            return f"broadcast of version {t} stalled for {self.timeout_s:g}s"
        for i in self._ready(select.EPOLLOUT, done, stalled):
            try:
                sent[i] += self.conns[i].sendmsg(_iov(hdr, body, sent[i]))
            except BlockingIOError:
                continue
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.ENOBUFS):
                    continue
                raise CommError(f"sending to worker {self.ids[i]}: {e}") from e
            if sent[i] == total:
                done.add(i)

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.ls.close()


class TcpWorker:
    """A worker over TCP: one blocking connection to the PS."""

    name = "tcp"

    def __init__(self, worker: int, nelems: int, *, cc: str = "cubic", timeout_s: float = 60.0):
        self.id, self.nelems, self.cc, self.timeout_s = worker, nelems, cc, timeout_s
        self.sock: socket.socket | None = None

    def address(self) -> dict:
        return {}

    def connect(self, ps: dict) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            set_cc(s, self.cc)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(self.timeout_s)
            try:
                s.connect((ps["ip"], int(ps["port"])))
                break
            except OSError as e:
                s.close()
                if time.monotonic() > deadline:
                    raise CommError(f"cannot connect to the PS at {ps['ip']}:{ps['port']}: "
                                    f"{e}") from e
                time.sleep(0.05)
        s.sendall(struct.pack(">I", self.id))
        self.sock = s

    def expect(self, t: int) -> None:
        pass

    def push(self, t: int, grad: np.ndarray) -> None:
        body = memoryview(np.ascontiguousarray(grad)).cast("B")
        _sendmsg_all(self.sock, _TCP_HDR.pack(TCP_MAGIC, t, len(body)), body)

    def pull(self, t: int, out: np.ndarray) -> None:
        magic, rnd, nbytes = _TCP_HDR.unpack(_recv_exact(self.sock, _TCP_HDR.size))
        if magic != TCP_MAGIC or rnd != t or nbytes != out.nbytes:
            raise CommError(f"PS sent round {rnd} ({nbytes} bytes); expected version {t} "
                            f"({out.nbytes} bytes)")
        view = memoryview(out).cast("B")
        got = 0
        while got < nbytes:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise CommError("the PS closed the connection")
            got += k

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise CommError("connection closed by the peer")
        got += k
    return bytes(buf)


def _iov(hdr: bytes, body: memoryview, sent: int) -> list:
    """What is left to send of header + body after `sent` bytes, as sendmsg buffers."""
    return [hdr[sent:], body] if sent < len(hdr) else [body[sent - len(hdr):]]


def _sendmsg_all(sock: socket.socket, hdr: bytes, body: memoryview) -> None:
    total = len(hdr) + len(body)
    sent = 0
    while sent < total:
        sent += sock.sendmsg(_iov(hdr, body, sent))
