# SPDX-License-Identifier: Apache-2.0
"""A gloo rank's place in the job (`RankContext`) and its metadata in the store (`Coord`).

The parameter-server runs go through ltpx.torch, whose coordination is
control/torchapi/coord.py; the gloo baseline (gloo.py) only needs the
rank's place and each worker's final summary (`done/<w>`) in the store.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import timedelta
from collections.abc import Callable

from ..trust.jobkey import key_from_env, store_key
from .config import TrainConfig

# Store keys; a torchrun restart starts a fresh key space (an agent store
# outlives attempts, and a stale key would be read as this attempt's).
KEY = f"ltpx/train/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"


@dataclass
class RankContext:
    """One gloo rank's place in the job (from the env:// rendezvous and its flags)."""

    rank: int
    world: int
    store: object                       # torch.distributed.Store
    cfg: TrainConfig
    dev: str | None = None
    timeout_s: float = 300.0
    emit: Callable[[dict], None] = lambda obj: None

    @property
    def workers(self) -> int:
        return self.world

    @property
    def worker_id(self) -> int:
        return self.rank


class Coord:
    """Metadata through the rendezvous store (never the tensors), sealed with
    the job key LTP_SECRET_FILE names (trust/sealing.py) when there is one."""

    def __init__(self, store, workers: int, timeout_s: float):
        self.store, self.workers = store, workers
        self.timeout = timedelta(seconds=timeout_s)
        store.set_timeout(self.timeout)
        from ..trust.sealing import Seal  # noqa: PLC0415 (cryptography: a rank's --help need not)
        self.seal = Seal(store_key(key_from_env()))

    def set_json(self, key: str, obj) -> None:
        self.store.set(KEY + key, self.seal.seal(KEY + key, json.dumps(obj)))

    def get_json(self, key: str):
        self.store.wait([KEY + key], self.timeout)
        return self.seal.read(KEY + key, self.store.get(KEY + key), json.loads)
