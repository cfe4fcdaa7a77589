# SPDX-License-Identifier: Apache-2.0
"""The line a long wait of a starting rank prints: a wait is never silent
(the rendezvous store, the other ranks of the LTP job)."""
from __future__ import annotations

import contextlib
import os
import sys
import threading

NOTE_S = 5.0    # a wait on the store or the other ranks says so after this long


@contextlib.contextmanager
def note_after(after_s: float, message: str):
    """Print `message` on stderr once, if what the block waits for takes
    longer than after_s: a wait is never silent."""
    done = threading.Event()

    def note():
        if not done.wait(after_s):
            print(message, file=sys.stderr, flush=True)
    th = threading.Thread(target=note, name="ltpx-wait-note", daemon=True)
    th.start()
    try:
        yield
    finally:
        done.set()


def waiting_note(timeout_s: float, after_s: float = NOTE_S):
    """The note of a rendezvous that takes longer than after_s."""
    where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    return note_after(after_s, f"ltpx.torch: still waiting for the rendezvous store at {where} "
                      f"after {after_s:.0f} s (gives up after {timeout_s:.0f} s; is MASTER_ADDR "
                      "reachable from this rank's namespace?)")


def ranks_note(job, after_s: float = NOTE_S):
    """The note of a rank whose LTP job's other ranks have not all joined
    after after_s: whom the job counts, and the likeliest cause (a DDP
    script's ranks under torchrun are trainers only: its server rank is a
    process of its own)."""
    s = job.s
    why = ("Each trainer serves a slice itself (colocate): are all the trainers started, "
           "each with the same LTP_COLOCATE, LTP_SERVERS and WORLD_SIZE? (With no "
           "LTP_SERVERS the ltp backend co-locates: trainers of server ranks started apart "
           "need LTP_SERVERS=S.)" if s.colocate else
           "Under torchrun every rank of a DDP script is a trainer: start the server rank "
           "too (LTP_ROLE=server LTP_RANK=0 ..., docs/deploy.md), run it with `ltp launch`, "
           "or let the trainers serve (unset LTP_SERVERS, or LTP_COLOCATE=1)")
    return note_after(after_s, (
        f"ltpx.torch: rank {job.global_rank} of the LTP job still waits for the others after "
        f"{after_s:.0f} s (it counts {s.servers} server rank(s), ranks 0..{s.servers - 1}, "
        f"and {job.workers} worker(s): {job.world} in all; gives up after {s.timeout:.0f} s). "
        + why))
