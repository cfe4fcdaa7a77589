# SPDX-License-Identifier: Apache-2.0
"""Workers that leave and come back: the state a rejoining worker takes, and who hands it over.

A worker is out of the job when it was restarted (its process died; the
launcher or torchrun --max-restarts started it again, and it found the job
running: `joining()`), or when the job went on without it (the barrier took
it for dead, or the server dropped it after --max-missed silent steps: its
next op raises coord.Excluded). Either way it calls `rejoin(opt)`:

  1. it asks the server for a join ticket (coord.tickets.request_join);
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

from . import storevalues
from .job import current
from .ops import WIRES, Ahead
from ..trust.sealing import StoreValueError


def joining() -> bool:
    """This worker found the job running when it started: rejoin() before any op."""
    ex = current().exchange
    return bool(ex is not None and ex.joining)


def _params(opt) -> list[torch.Tensor]:
    return [p for g in opt.param_groups for p in g["params"]]


def state_blob(opt, extra: dict | None = None, joiner: bool = True) -> bytes:
    """This worker's state as bytes (see the module docstring). joiner False:
    for a checkpoint, which a new job loads without the exchange's snapshot
    (its clock and membership are the job's own), so none is taken (a
    sharded job's exchange has none: rejoining is one server's)."""
    ex = current().exchange
    buf = io.BytesIO()
    torch.save({"params": [p.detach() for p in _params(opt)],
                "optimizer": opt.state_dict(), "steps": opt.steps, "ks": list(opt.ltp.ks),
                "exchange": ex.snapshot() if joiner else {}, "extra": extra or {},
                "wire": opt.ltp.op.wire}, buf)   # the loss policy's, which the next step takes
    return buf.getvalue()


def load_blob(opt, blob: bytes) -> dict:
    """Make this worker's optimizer and parameters the blob's; its `extra`.
    Nothing is loaded from a blob that check_state refuses."""
    try:
        st = torch.load(io.BytesIO(blob), weights_only=True, map_location="cpu")
    except Exception as e:     # weights_only refuses anything but tensors and plain data
        raise StoreValueError(f"the state handed over does not load: {e}") from None
    check_state(st, _params(opt), current().exchange.co.workers)
    with torch.no_grad():
        for p, v in zip(_params(opt), st["params"]):
            p.copy_(v)
    opt.load_state_dict(st["optimizer"])
    opt.ltp.steps, opt.ltp.ks = st["steps"], list(st["ks"])
    opt.ltp.follow(st.get("wire", "none"))
    current().exchange.restore(st["exchange"])
    return st["extra"]


def check_state(st, params: list[torch.Tensor], workers: int | None) -> None:
    """StoreValueError unless `st` is a state this worker can take: a
    tensor of each parameter's shape and dtype, a step count, one k per
    step, and (workers given) an exchange snapshot whose clock, op and
    worker ids are in range: what a donor wrote, checked as any store value
    is (a checkpoint's snapshot is not used: workers None)."""
    def bad(why: str):
        return StoreValueError(f"the state handed over is refused: {why}")
    if not isinstance(st, dict) or not {"params", "optimizer", "steps", "ks", "exchange",
                                        "extra"} <= set(st):
        raise bad("not a state (params, optimizer, steps, ks, exchange, extra)")
    ps = st["params"]
    if not isinstance(ps, list) or len(ps) != len(params):
        raise bad(f"{len(ps) if isinstance(ps, list) else 'no'} parameters, this model has "
                  f"{len(params)}")
    for i, (v, p) in enumerate(zip(ps, params)):
        if not isinstance(v, torch.Tensor) or v.shape != p.shape or v.dtype != p.dtype:
            raise bad(f"parameter {i} is not a {p.dtype} tensor of shape {tuple(p.shape)}")
    if not isinstance(st["optimizer"], dict) or not isinstance(st["extra"], dict):
        raise bad("the optimizer's state and extra must be dicts")
    try:
        steps = storevalues.count_value(st["steps"], "steps")
        ks = st["ks"]
        if not isinstance(ks, list) or len(ks) > steps + 1:
            raise ValueError(f"ks must be a list of at most steps + 1 = {steps + 1} counts")
        for k in ks:
            storevalues.count_value(k, "a k")
        if workers is not None:
            check_snapshot(st["exchange"], workers)
        if st.get("wire", "none") not in WIRES:
            raise ValueError(f"wire must be one of {', '.join(WIRES)}")
    except (ValueError, TypeError, KeyError) as e:
        raise bad(str(e)) from None


def check_ahead(d, workers: int) -> None:
    """ValueError unless `d` is an ops.Ahead snapshot: ops of this job, at
    most Ahead.KEEP pairs."""
    op = storevalues.op_value(workers)
    if not isinstance(d, dict) or not isinstance(d.get("after"), list) or \
            len(d["after"]) > Ahead.KEEP:
        raise ValueError(f"ahead must hold prev and at most {Ahead.KEEP} pairs of ops")
    for name in ("prev", "step"):
        if d.get(name) is not None:
            op(str(d[name]).encode())
    for pair in d["after"]:
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError("ahead: each entry must be a pair of ops")
        for text in pair:
            op(str(text).encode())


def check_snapshot(d, workers: int) -> None:
    """ValueError unless `d` is an Exchange.snapshot of a job of `workers`."""
    if not isinstance(d, dict):
        raise ValueError("the exchange snapshot must be a dict")
    for name in ("seq", "up"):
        storevalues.count_value(d[name], name)
    check_ahead(d["ahead"], workers)
    view = d["view"]
    if not isinstance(view, dict):
        raise ValueError("the view must be a dict")
    for name in ("members", "absent"):
        if not isinstance(view[name], list):
            raise ValueError(f"view.{name} must be a list of worker ids")
        for w in view[name]:
            storevalues.count_value(w, f"view.{name}", workers - 1)
    for name in ("lost", "dropped", "rejoined"):
        if not isinstance(d[name], dict):
            raise ValueError(f"{name} must map worker ids to steps")
        for w, step in d[name].items():
            storevalues.count_value(w, name, workers - 1)
            storevalues.count_value(step, name)


def reset(opt) -> None:
    """Forget the step that was in flight when this worker was excluded."""
    try:
        opt.drain()
    except Exception:   # the exclusion itself, raised again by the comm thread
        pass
    opt.ltp.reset()


def rejoin(opt, timeout_s: float | None = None) -> dict | None:
    """Come back into the job (see the module docstring): the donor's `extra`,
    or None if the job ended before this worker was admitted."""
    job = current()
    reset(opt)
    ticket = job.coord.tickets.request_join(job.exchange.id)
    blob = job.coord.tickets.take_sync(ticket, timeout_s, w=job.exchange.id)
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
        ex.co.tickets.put_sync(ticket, blob)
    ex.donations = {}
    return served
