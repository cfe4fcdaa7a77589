"""A rank's place in the job (`RankContext`) and its coordination through the store (`Coord`).

The rendezvous store (a torch.distributed TCPStore) carries barriers and
metadata only, never tensors: each rank's address (`meta/<rank>`), the round
barrier (`ready/<t>` counter, `go/<t>` flag), wbsp's k per worker and round,
each worker's summary (`done/<w>`) and the PS's `fin`.
"""
from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable

from .config import TrainConfig

# Store keys; a torchrun restart starts a fresh key space (an agent store
# outlives attempts, and a stale barrier key would let a round run early).
KEY = f"ltpx/train/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"


@dataclass
class RankContext:
    """One rank's place in the job (from the env:// rendezvous and its flags)."""

    rank: int
    world: int
    store: object                       # torch.distributed.Store
    cfg: TrainConfig
    dev: str | None = None
    ip: str | None = None
    xdp_mode: str = "native"
    capacity_bps: float = 1e9
    mtu: int = 1500
    job: int = 0x7472
    tcp_port: int = 0
    timeout_s: float = 300.0
    deadline_min_s: float | None = None
    early_close: dict = field(default_factory=dict)   # EarlyCloseConfig fields (LTP PS)
    netns: str | None = None            # the namespace this rank runs in (names its pins)
    group: str | None = None            # address of downlink "group" (broadcast or multicast)
    emit: Callable[[dict], None] = lambda obj: None

    @property
    def workers(self) -> int:
        return self.world if self.cfg.transport == "gloo" else self.world - 1

    @property
    def worker_id(self) -> int:
        return self.rank if self.cfg.transport == "gloo" else self.rank - 1

    def meta(self, role: str, extra: dict) -> dict:
        """What this rank tells the others about itself (`meta/<rank>` in the store)."""
        return {"rank": self.rank, "role": role,
                "worker": None if role == "ps" else self.worker_id,
                "dev": self.dev, "ip": self.ip, "host": socket.gethostname(),
                "pid": os.getpid(), **extra}


class Coord:
    """Barriers and metadata through the rendezvous store (never the tensors)."""

    def __init__(self, store, workers: int, timeout_s: float):
        self.store, self.workers = store, workers
        self.timeout = timedelta(seconds=timeout_s)
        store.set_timeout(self.timeout)

    def set_json(self, key: str, obj) -> None:
        self.store.set(KEY + key, json.dumps(obj))

    def get_json(self, key: str):
        self.store.wait([KEY + key], self.timeout)
        return json.loads(self.store.get(KEY + key))

    def arrive(self, t: int) -> bool:
        """This worker has a gradient for round t; True if it was the last."""
        if self.store.add(f"{KEY}ready/{t}", 1) == self.workers:
            self.store.set(f"{KEY}go/{t}", "1")
            return True
        return False

    def wait_go(self, t: int) -> None:
        self.store.wait([f"{KEY}go/{t}"], self.timeout)

    def gone(self, t: int) -> bool:
        return self.store.check([f"{KEY}go/{t}"])

    def set_k(self, t: int, worker: int, k: int) -> None:
        self.store.set(f"{KEY}k/{t}/{worker}", str(k))

    def get_k(self, t: int, ids: list[int]) -> list[int]:
        keys = [f"{KEY}k/{t}/{w}" for w in ids]
        self.store.wait(keys, self.timeout)
        return [int(v) for v in self.store.multi_get(keys)]
