"""The job's coordination through the rendezvous store: metadata and barriers, never tensors.

Keys (under ltpx/job/<TORCHELASTIC_RESTART_COUNT>/, so a restarted job never
sees a stale barrier):
  meta/<rank>      each rank's role, address, device, host, pid
  ready/<s>, go/<s>  op s's barrier: a counter, and the op's description
                   (ops.Op JSON) set by the last worker to arrive
  open/<r>         the server opened uplink round r (a round it did not open
                   ahead of its op's barrier)
  ack/<r>/<w>      worker w's push of round r ended on the server's close; the
                   server waits for it before it reuses r's bank when w sent
                   nothing of r (so w's late packets meet a closed round, which
                   answers them, not a newer one, which would not)
  k/<s>/<w>        wbsp: how many gradients worker w averaged for op s
  fin              the server's summary when the job ends
  user/...         what code above the API keeps here (lt.store_set/store_get)
"""
from __future__ import annotations

import json
import os
from datetime import timedelta

from ...errors import CommError
from .ops import Op

KEY = f"ltpx/job/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"


class Coord:
    """Barriers and metadata through the store (a torch.distributed Store)."""

    def __init__(self, store, workers: int, timeout_s: float):
        self.store, self.workers, self.timeout_s = store, workers, timeout_s
        self.timeout = timedelta(seconds=timeout_s)
        store.set_timeout(self.timeout)

    # ------------------------------------------------------------------ metadata
    def set_json(self, key: str, obj) -> None:
        self.store.set(KEY + key, json.dumps(obj))

    def get_json(self, key: str):
        self.wait([key])
        return json.loads(self.store.get(KEY + key))

    def get_many(self, keys: list[str]) -> list:
        self.wait(keys)
        return [json.loads(v) for v in self.store.multi_get([KEY + k for k in keys])]

    def wait(self, keys: list[str], timeout_s: float | None = None) -> None:
        t = self.timeout if timeout_s is None else timedelta(seconds=timeout_s)
        try:
            self.store.wait([KEY + k for k in keys], t)
        except RuntimeError as e:   # torch's DistStoreError: a timeout or a lost store
            if "timeout" in str(e).lower() or "timed out" in str(e).lower():
                raise CommError(f"waited {t.total_seconds():g}s for {', '.join(keys)} in the "
                                "rendezvous store: a rank is stuck or gone") from None
            raise CommError(f"the rendezvous store failed: {e}") from None

    # ------------------------------------------------------------------ op barrier
    def arrive(self, s: int, op: Op) -> bool:
        """This worker is at op s; True if it was the last (it posts the op)."""
        if self.store.add(f"{KEY}ready/{s}", 1) == self.workers:
            self.store.set(f"{KEY}go/{s}", op.to_json())
            return True
        return False

    def wait_go(self, s: int) -> None:
        self.wait([f"go/{s}"])

    def gone(self, s: int) -> bool:
        return self.store.check([f"{KEY}go/{s}"])

    def next_op(self, s: int, idle_s: float = 86400.0) -> Op:
        """The server's wait for op s: as long as the workers take (they may
        evaluate or save between steps; a launcher ends a job whose rank
        failed), at most idle_s seconds."""
        self.wait([f"go/{s}"], idle_s)
        return Op.from_json(self.store.get(f"{KEY}go/{s}"))

    # ------------------------------------------------------------------ rounds
    def announce_open(self, r: int) -> None:
        self.store.set(f"{KEY}open/{r}", "1")

    def wait_open(self, r: int) -> None:
        self.wait([f"open/{r}"])

    def ack(self, r: int, w: int) -> None:
        self.store.set(f"{KEY}ack/{r}/{w}", "1")

    def wait_acks(self, r: int, workers: list[int]) -> None:
        self.wait([f"ack/{r}/{w}" for w in workers])

    # ------------------------------------------------------------------ wbsp
    def set_k(self, s: int, w: int, k: int) -> None:
        self.store.set(f"{KEY}k/{s}/{w}", str(k))

    def get_k(self, s: int, ids: list[int]) -> list[int]:
        keys = [f"k/{s}/{w}" for w in ids]
        self.wait(keys)
        return [int(v) for v in self.store.multi_get([KEY + k for k in keys])]
