# SPDX-License-Identifier: Apache-2.0
"""What the server and the workers exchange rounds through, whatever the transport.

The contract is two abstract classes, `ServerLink` and `WorkerLink`: the op
loops (server.py, exchange.py) call only their methods, with everything a
call depends on passed as an argument (who to send to, how long to try, the
Early Close state of a round's kind). link_ltp.py (XDP endpoints: Early
Close and Bubble Filling on the uplink, the reliable class with an optional
group address on the downlink) and link_tcp.py (one connection per worker,
every byte delivered) implement them; a new transport implements them too
(a missing method fails at construction). A sharded worker holds one
WorkerLink per server (shards.ShardLinks; `parts()` lists them).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from .losspolicy import Choice


@dataclass
class Gathered:
    """One uplink round as the server sees it."""

    round: int
    values: np.ndarray            # float32 [k, n]: per-worker rows (holes filled)
    workers: list[int]
    delivered: np.ndarray         # int [k]: chunks that arrived per worker
    chunks: int                   # chunks per worker
    filled: np.ndarray            # int [k]: chunks Bubble Filling wrote per worker
    reason: str = "complete"      # complete | early | deadline | timeout (LTP)
    chunk_elems: int = 0
    masks: np.ndarray | None = None   # bool [k, chunks] (LTP)
    duration_s: float = 0.0
    error: float = 0.0            # the holes' cost against the aggregate's noise (LTP)
    arrivals: object = None       # results.Arrivals: the NIC's arrival times (LTP)
    attribution: object = None    # straggler.Attribution: whom the round waited for (LTP)

    @property
    def missing(self) -> list[int]:
        """Workers none of whose chunks arrived (their whole row was filled)."""
        return [w for w, d in zip(self.workers, self.delivered) if d == 0]

    @property
    def early_closed(self) -> bool:
        return self.reason in ("early", "deadline")


class ServerLink(ABC):
    """The server's side of a transport."""

    name: str          # "ltp" | "tcp"
    opens: bool        # uplink rounds are opened (and kept alive with beat()) before gathering
    sign_s: float = 0.0   # seconds spent signing answers so far (the step breakdown's `sign`)

    @abstractmethod
    def address(self) -> dict:
        """What the workers need to reach this server (its store record)."""

    @abstractmethod
    def connect(self, metas: dict[int, dict]) -> None:
        """Learn every worker's record (address, port)."""

    @abstractmethod
    def configure(self, bubble: str, early_close: str, wire: str = "none",
                  carry: bool = False) -> None:
        """Bubble Filling's strategy, Early Close's fields (JSON) and what the
        gradients travel as (Op.wire) for a step's uplink rounds from now on;
        `carry` (Op.carry): the answers carry their rounding into the next."""

    @abstractmethod
    def ensure(self, nelems: int) -> bool:
        """Room for rounds of nelems; True if the link was (re)made."""

    @abstractmethod
    def open(self, r: int, nelems: int, workers: list[int], reliable: bool, key=None) -> None:
        """Make uplink round r receivable from `workers`; `key` names the round's
        kind (a step's bucket i), which keeps its own Early Close state."""

    @abstractmethod
    def cancel(self, r: int) -> None:
        """Retire an open round without gathering it."""

    @abstractmethod
    def gather(self, r: int, nelems: int, workers: list[int]) -> Gathered:
        """Uplink round r, one row per worker (holes filled)."""

    def readmit(self, w: int) -> None:
        """Worker w (one that died, restarted) is admitted again: its next
        op's rounds include it. A link that keeps a connection per worker
        (TCP) takes its new one then; the default has nothing to do."""
        return None

    def ahead(self, r: int, nelems: int, workers: list[int]) -> None:
        """A hint just before a gather: round r (nelems, from `workers`) is
        the one the server gathers after it, so a link may read r in while
        the server sums the round that gather returns (the TCP link does).
        The gather after that one must then be r's. The default ignores it."""
        return None

    @abstractmethod
    def send(self, d: int, buf: np.ndarray, group: bool, *, to: list[int] | None = None,
             wait_s: float | None = None,
             critical_from: int | None = None) -> np.ndarray | None:
        """Answer d to the workers `to` (None: every worker), trying at most
        `wait_s` (None: the link's own limit). critical_from, a step's
        answer (its report from that element on): a link that tolerates
        loss (LTP with loss_policy defer) may leave out chunks before it
        that a worker lost, zero for every worker, and returns them (a bool
        mask over buf) for the server to add into its next answer; None when
        buf went whole. A transport that delivers every
        byte or fails may send to every connected worker and take its own
        limit. A peer silent for the whole time raises DeadPeerError naming it."""

    def beat(self) -> None:  # noqa: B027 (optional: only a link that opens rounds keeps them alive)
        """Keep open rounds alive while the server waits elsewhere (LTP)."""

    sig_elems = 0      # elements an answer's buffer keeps at its end for a signature (stream)

    def choose(self, half: bool = True) -> Choice:
        """The loss policy's choice for this step (losspolicy.py), once a step
        after its gather (`half`: its workers may take a wire from it); the
        default: a link that tolerates no loss."""
        return Choice()

    def loss_summary(self) -> dict | None:
        """The loss policy's summary (LossPolicy.summary), if the link has one."""
        return None

    def stream(self, d: int, buf: np.ndarray, group: bool, *, to: list[int],
               wait_s: float):
        """Answer d sent in parts as buf fills (a transport/stream.AnswerStream:
        feed, finish, abort), its last `sig_elems` elements the signature;
        None (the default) where the link sends answers whole."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Release sockets and endpoints."""


class WorkerLink(ABC):
    """A worker's side of a transport (to one server)."""

    name: str
    opens: bool

    @property
    def uplink(self) -> dict:
        """Counters of this worker's pushes (LTP: pushes, DATA sent, clock-made)."""
        return {}

    @property
    def downlink(self) -> dict:
        """Counters of the answers it took (LTP, deferred answers: `answers`
        that deferred something, the `chunks` they deferred)."""
        return {}

    def parts(self) -> list[WorkerLink]:
        """The links to each server (one, unsharded)."""
        return [self]

    def answers_deferred(self) -> bool:
        """Whether its server answers a step tolerantly (loss_policy defer,
        the server's setting: its store record says)."""
        return False

    @abstractmethod
    def address(self) -> dict:
        """This worker's store record."""

    @abstractmethod
    def connect(self, server: dict) -> None:
        """Reach the server from its store record."""

    @abstractmethod
    def ensure(self, nelems: int) -> bool:
        """Room for answers of nelems; True if the link was (re)made."""

    @abstractmethod
    def expect(self, d: int, nelems: int, tolerant: bool = False) -> None:
        """Be ready for answer d of nelems (tolerant: a step's, which a link
        that tolerates loss may send so: see ServerLink.send)."""

    @abstractmethod
    def expect_wire(self, d: int, n: int, wire: str) -> None:
        """Answer d starts with the aggregate's n elements in `wire` (Op.wire)."""

    @abstractmethod
    def push(self, r: int, buf: np.ndarray, reliable: bool, answer: int | None = None,
             at: int = 0, wire: str = "none") -> bool:
        """This worker's piece for uplink round r; `answer`: the op's answer,
        whose arrival from element `at` on (where r's part of it starts: the
        server may send an answer in parts) ends the push (r is over); `wire`:
        what a tolerant piece travels as (its op's)."""

    @abstractmethod
    def pull(self, d: int, out: np.ndarray) -> None:
        """Answer d, copied into `out`."""

    scatters = False   # pull_parts: the answer straight into its places (a sharded worker's)

    def pull_parts(self, d: int, parts: list[np.ndarray]) -> None:
        """Answer d, copied into `parts` in order (float32, contiguous; their
        sizes add up to the answer's): where `scatters`."""
        raise NotImplementedError(f"{type(self).__name__} answers into one buffer only")

    @abstractmethod
    def close(self) -> None:
        """Release sockets and endpoints."""
