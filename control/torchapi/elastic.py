# SPDX-License-Identifier: Apache-2.0
"""Workers that leave and come back: the state a rejoining worker takes, and who hands it over.

A worker is out of the job when it was restarted (its process died; the
launcher or torchrun --max-restarts started it again, and it found the job
running: `joining()`), or when the job went on without it (the barrier took
it for dead, or the server dropped it after --max-missed silent steps: its
next op raises coord.Excluded). Either way it calls `rejoin(opt)`:

  1. it asks the server for a join ticket (coord.request_join);
  2. the server admits it in the next step's report; the lowest present
     worker, right after that step (its optimizer has stepped), serializes
     its state and puts it in the rendezvous store under sync/<ticket>
     (`donate`, which the training loop calls after every opt.step());
  3. the joiner loads it: parameters, the wrapped optimizer's state (SGD
     momentum...), the step count, the exchange's clock and membership, and
     whatever `extra` the script passed (its data position, say); its next
     op is the next op of everyone else, as a member.

The state goes once through the store (a few MB for the built-in job), not
over LTP: the joiner needs no open round to take it. Its wait on that key
gives up early if the server dies (the liveness watch covers the server).
If the member that owes it the state (the server names it under
donor/<ticket>) dies first, the joiner asks again with a new ticket: the
barrier takes a worker asking to join as gone, so the others go on, and the
next step admits it again with a living donor (before, it waited out the
store timeout, `timeout`, 300 s by default, and the barrier with it).
Non-parameter buffers (BatchNorm's running stats) travel in `extra` if the
script wants them.
"""
from __future__ import annotations

import io

import torch

from .job import current


def joining() -> bool:
    """This worker found the job running when it started: rejoin() before any op."""
    ex = current().exchange
    return bool(ex is not None and ex.joining)


def _params(opt) -> list[torch.Tensor]:
    return [p for g in opt.param_groups for p in g["params"]]


def state_blob(opt, extra: dict | None = None) -> bytes:
    """This worker's state as bytes (see the module docstring)."""
    ex = current().exchange
    buf = io.BytesIO()
    torch.save({"params": [p.detach() for p in _params(opt)],
                "optimizer": opt.inner.state_dict(), "steps": opt.steps, "ks": list(opt.ks),
                "exchange": ex.snapshot(), "extra": extra or {}}, buf)
    return buf.getvalue()


def load_blob(opt, blob: bytes) -> dict:
    """Make this worker's optimizer and parameters the blob's; its `extra`."""
    st = torch.load(io.BytesIO(blob), weights_only=True, map_location="cpu")
    with torch.no_grad():
        for p, v in zip(_params(opt), st["params"]):
            p.copy_(v)
    opt.inner.load_state_dict(st["optimizer"])
    opt.steps, opt.ks = st["steps"], list(st["ks"])
    current().exchange.restore(st["exchange"])
    return st["extra"]


def reset(opt) -> None:
    """Forget the step that was in flight when this worker was excluded."""
    try:
        opt.drain()
    except Exception:   # the exclusion itself, raised again by the comm thread
        pass
    opt.cur = None
    opt.synced = False
    opt.k = 0


def rejoin(opt, timeout_s: float | None = None) -> dict | None:
    """Come back into the job (see the module docstring): the donor's `extra`,
    or None if the job ended before this worker was admitted."""
    job = current()
    reset(opt)
    ticket = job.coord.request_join(job.exchange.id)
    blob = job.coord.take_sync(ticket, timeout_s, w=job.exchange.id)
    if blob is None:
        return None
    return load_blob(opt, blob)


def donate(opt, extra: dict | None = None) -> list[int]:
    """Hand this worker's state to the workers admitted at its last step, if
    it is their donor (call after every opt.step()); the workers served."""
    ex = current().exchange
    if not ex.donations:
        return []
    blob = state_blob(opt, extra)
    served = sorted(ex.donations)
    for ticket in ex.donations.values():
        ex.co.put_sync(ticket, blob)
    ex.donations = {}
    return served
