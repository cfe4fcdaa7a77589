# SPDX-License-Identifier: Apache-2.0
"""A co-located trainer's own slice over the LTP transport: handed over in
memory, where XDP never sees it (colocate.py; docs/transport.md, "One
device for every role").

Trainer r's worker and server r share the trainer's device (each a seat of
its mux), but the worker's slice for the server beside it would go to the
host's own address, which the kernel delivers through its own stack: XDP
never sees it. So the server runs on a thread of the trainer's process, and
the two meet in memory (handoff.py's `Pair`, as the TCP transport's do): the
worker gives its piece of a round, as it would push it on the wire
(compressed where its op's wire says), and the server takes it straight
into that worker's row of the round; the server gives its answer as it
would send it (compressed, signed), and the worker takes it and checks and
decodes it as an answer off the wire. The other workers' rows come over XDP
as always, in the same round, closed by Early Close; the near row is whole.

`NearRows` is the server's side: which workers are near, and a round's rows
put together, in the workers' order (the sum's order, so a replica sums as
one whose every row came over the wire).
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...errors import CommError
from ..transport.early_close import COMPLETE
from ..transport.results import Arrivals
from .handoff import Pair, pair as handoff_pair, proc
from .links import Gathered


def as_bytes(buf: np.ndarray) -> memoryview:
    """buf's bytes, for a Slot (a contiguous copy where it is not one)."""
    return memoryview(np.ascontiguousarray(buf).view(np.uint8))


class NearRows:
    """The server's workers in its own process, and the rounds only they push."""

    def __init__(self, ip: str, port: int):
        self.ip, self.port = ip, port
        self.pairs: dict[int, Pair] = {}       # worker id -> its pair
        self.sizes: dict[int, tuple[int, int]] = {}   # open round -> (wire elems, open ns)
        self.wired: set[int] = set()           # open rounds with workers over XDP too
        self.pool: ThreadPoolExecutor | None = None

    def connect(self, metas: dict[int, dict], ids: list[int]) -> None:
        self.pairs = {w: handoff_pair(self.ip, self.port, w) for w in ids
                      if metas.get(w, {}).get("proc") == proc()}

    def __bool__(self) -> bool:
        return bool(self.pairs)

    def far(self, workers: list[int]) -> list[int]:
        return [w for w in workers if w not in self.pairs]

    def near_of(self, workers: list[int]) -> list[int]:
        """Those of `workers` that are near."""
        return [w for w in workers if w in self.pairs]

    def opened(self, r: int, nelems: int, wired: bool) -> None:
        self.sizes[r] = (nelems, time.monotonic_ns())
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
               wait_s: float) -> Gathered:
        """Round r's rows in `workers`' order: the far ones from `res` (the XDP
        round's result, None when every worker is near), the near ones
        taken from their pairs, whole."""
        n, open_ns = self.sizes.pop(r)
        self.wired.discard(r)
        far = [] if res is None else list(res.workers)
        ws = sorted(set(far) | {w for w in workers if w in self.pairs})
        nch = -(-n // chunk_elems) if n else 0
        values = np.empty((len(ws), n), dtype=np.float32)
        masks = np.ones((len(ws), nch), dtype=bool)
        filled = np.zeros(len(ws), dtype=np.int64)
        took = np.zeros(len(ws), dtype=np.int64)
        for i, w in enumerate(ws):
            if w in far:
                j = far.index(w)
                values[i] = res.values[j]
                masks[i], filled[i] = res.masks[j], res.filled[j]
            else:
                self.pairs[w].up.take(r, as_bytes(values[i]), wait_s)
                took[i] = time.monotonic_ns()
        close_ns = max(int(took.max()) if len(ws) else 0,
                       res.arrivals.close_ns if res is not None and res.arrivals else 0)
        return Gathered(round=r, values=values, workers=ws, delivered=masks.sum(axis=1),
                        chunks=nch, filled=filled,
                        reason=COMPLETE if res is None else res.reason,
                        chunk_elems=chunk_elems, masks=masks,
                        duration_s=(close_ns - open_ns) / 1e9 if res is None else res.duration_s,
                        error=0.0 if res is None else res.error["vs_noise"],
                        arrivals=_arrivals(res, far, ws, took, open_ns, close_ns),
                        attribution=None if res is None else res.attribution)

    def give(self, d: int, wire: np.ndarray, near: list[int], wait_s: float):
        """Answer d (its words as they go on the wire) to the near workers
        `near`, on a thread: a future to wait on (None: no one to give to)."""
        if not near:
            return None
        if self.pool is None:
            self.pool = ThreadPoolExecutor(1, thread_name_prefix="ltpx-near")
        body = as_bytes(wire)
        return self.pool.submit(lambda: [self.pairs[w].down.give(d, body, wait_s)
                                         for w in near])

    def close(self) -> None:
        for p in self.pairs.values():
            p.close("the co-located LTP server")
        self.pairs = {}
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None


def _arrivals(res, far: list[int], ws: list[int], took: np.ndarray, open_ns: int,
              close_ns: int) -> Arrivals | None:
    """The round's arrival times with a near worker's row stamped when it was taken."""
    a = None if res is None else res.arrivals
    if res is not None and a is None:
        return None
    first, last, thresh = (np.zeros(len(ws), dtype=np.int64) for _ in range(3))
    for i, w in enumerate(ws):
        if w in far:
            j = far.index(w)
            first[i], last[i], thresh[i] = a.first_ns[j], a.last_ns[j], a.thresh_ns[j]
        else:
            first[i] = last[i] = thresh[i] = took[i]
    return Arrivals(open_ns=open_ns if a is None else a.open_ns, close_ns=close_ns,
                    first_ns=first, last_ns=last, thresh_ns=thresh)


def worker_pair(server: dict, worker: int) -> Pair | None:
    """The pair to the server in this process (its meta's `proc` this one's), else None."""
    if server.get("proc") != proc():
        return None
    return handoff_pair(server["ip"], int(server["ltp_port"]), worker)


def check_tolerant(deferred: bool) -> None:
    """Tolerant answers leave out chunks a worker lost, and every worker
    zeroes them: the near worker has no such loss to agree on."""
    if deferred:
        raise CommError("a co-located LTP server answers its own trainer in memory, which "
                        "tolerant answers (loss_policy defer) do not cover: use loss_policy "
                        "auto or repair")
