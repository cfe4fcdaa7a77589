# SPDX-License-Identifier: Apache-2.0
"""`DistributedOptimizer`: the user's optimizer, its gradients aggregated over LTP.

Built the Horovod way: `DistributedOptimizer(opt)` returns an optimizer of a
class made at run time, a subclass of the user's optimizer's class (cached per
class), so it *is* that optimizer: `isinstance(opt, torch.optim.Adam)` holds,
torch's own `Optimizer.__init__` makes it (its step hooks, state_dict and
load_state_dict, zero_grad, LR schedulers are torch's), and its step is the
user's class's step once the gradients are the aggregate. It shares the
wrapped optimizer's param_groups and state (what was loaded into it stays)
until its own load_state_dict gives it new ones, and takes its class's own
attributes (a custom optimizer's). Refused: an optimizer whose step needs
a closure (LBFGS: it would compute gradients again, locally), one whose
step was already patched (an LR scheduler made with it: make schedulers with
the optimizer this returns), and pickling it (save its state_dict).

What it adds:
  step(closure=None)   exchange this step's gradients (gradsync.py), then the
      class's own step, with torch's step pre- and post-hooks around that step
      alone: a pre-hook sees the aggregated gradients, and under wbsp a step
      that may not move the model yet runs neither.
  synchronize(), skip_synchronize()   Horovod's idiom (clip, then step).
  ltp          the GradientSync: buckets, buffers, communication thread.
  last_report, steps, wholly_filled_total, times(), drain(), close().
add_param_group after it is made is refused (its buckets are fixed).
"""
from __future__ import annotations

import contextlib
import functools
import inspect

import torch

from ...errors import UsageError
from .gradsync import FilledWarning, GradientSync

__all__ = ["DistributedOptimizer", "FilledWarning", "check_wrappable", "distributed_class"]


class Distributed:
    """The methods a DistributedOptimizer's class puts before its optimizer's
    class in the MRO (see the module docstring)."""

    ltp: GradientSync | None = None   # None while torch's __init__ adds the groups

    def step(self, closure=None):
        """Exchange the gradients (unless synchronize() did), then the optimizer's
        own step; under wbsp, until the round's slowest worker arrives, only
        keep this gradient (the model does not move; no step hook runs)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self.ltp.synchronize():
            return loss
        with self.ltp.stepping():
            super().step()   # the class's own step, inside torch's hooks
        return loss

    # torch wraps a class's step in its hook runner once (Optimizer._patch_step_function);
    # marked done, this step is left bare and the hooks run once, around the class's own
    step.hooked = True

    def synchronize(self) -> bool:
        """Exchange now; afterwards every .grad is the aggregate (clip it, then
        step(), which does not exchange again). False under wbsp while the
        slowest worker has not arrived."""
        return self.ltp.synchronize()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Horovod's idiom: synchronize(), change the .grads, then step() inside
        this block. step() after synchronize() never exchanges twice."""
        yield

    @property
    def last_report(self):
        return self.ltp.last_report

    @property
    def steps(self) -> int:
        return self.ltp.steps

    @property
    def wholly_filled_total(self) -> int:
        return self.ltp.wholly_filled_total

    def times(self) -> dict:
        return self.ltp.times()

    def drain(self) -> None:
        self.ltp.drain()

    def close(self, wait_s: float = 10.0) -> None:
        self.ltp.close(wait_s)

    def add_param_group(self, param_group) -> None:
        if self.ltp is not None:
            raise UsageError("DistributedOptimizer: its buckets are fixed; add the group to "
                             "the optimizer before wrapping it")
        super().add_param_group(param_group)

    def __repr__(self) -> str:
        return f"DistributedOptimizer({super().__repr__()}, buckets={list(self.ltp.plan.sizes)})"

    def __reduce_ex__(self, protocol):
        raise UsageError("a DistributedOptimizer is not pickled or copied (its buckets, threads "
                         "and job are this process's): save and load opt.state_dict()")


@functools.cache
def distributed_class(base: type) -> type:
    """The DistributedOptimizer class of an optimizer class: one per class, so
    every wrapped SGD is of one type."""
    return type(base.__name__, (Distributed, base),
                {"__module__": base.__module__, "__qualname__": base.__qualname__,
                 "__doc__": base.__doc__})


def check_wrappable(optimizer: torch.optim.Optimizer) -> None:
    """UsageError for an optimizer whose step needs a closure, or whose step
    this object already had patched (torch's LR schedulers do: the patch
    would be copied over the exchange)."""
    try:
        closure = inspect.signature(type(optimizer).step).parameters.get("closure")
    except (TypeError, ValueError):   # a step callable inspect cannot read: let it be
        closure = None
    if closure is not None and closure.default is inspect.Parameter.empty:
        raise UsageError(f"DistributedOptimizer: {type(optimizer).__name__}'s step needs a "
                         "closure, which would compute the gradients again on this worker "
                         "alone after they were aggregated: use an optimizer without one")
    if "step" in vars(optimizer):
        raise UsageError("DistributedOptimizer: this optimizer's step was patched already (an "
                         "LR scheduler made with it?): wrap the optimizer first, then make "
                         "schedulers with the optimizer DistributedOptimizer returns")


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None,
                         **options) -> torch.optim.Optimizer:
    """`optimizer` as a DistributedOptimizer (module docstring); options are
    GradientSync's (gradsync.py): sync, bubble, early_close, downlink,
    bucket_mb, overlap, backward_passes_per_step, warn_every, error_feedback.
    Make LR schedulers and step hooks with the optimizer this returns."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(f"DistributedOptimizer: wraps a torch.optim.Optimizer, got "
                         f"{type(optimizer).__name__}")
    if isinstance(optimizer, Distributed):
        raise UsageError("DistributedOptimizer: this optimizer is already distributed")
    check_wrappable(optimizer)
    cls = distributed_class(type(optimizer))
    opt = cls.__new__(cls)
    opt.__dict__.update(vars(optimizer))   # the class's own attributes
    torch.optim.Optimizer.__init__(opt, optimizer.param_groups, optimizer.defaults)
    opt.state = optimizer.state            # one state: what was loaded stays
    opt.ltp = GradientSync(opt, named_parameters, **options)
    return opt
