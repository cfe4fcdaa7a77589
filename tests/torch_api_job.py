# SPDX-License-Identifier: Apache-2.0
"""One rank of an ltpx.torch job the tests start (test_torch_api.py over TCP on
loopback, test_launch.py over LTP on a rig): `python torch_api_job.py CASES`.

Each case trains a small model with its own DistributedOptimizer; every rank
prints one JSON line per case ({"case": ..., "digest": ..., ...}), then
{"event": "result", "cases": {...}}. Cases:

  set_to_none  zero_grad(set_to_none=True), the default: parameters must match
               a single-process reference trained on the same global batches
  keep_grads   the same with zero_grad(set_to_none=False)
  fp16, bf16   half-precision parameters: they train, keep their dtype
  unused       a layer no step uses, and one only worker 0 uses: no hang, the
               unused layer unchanged (SGD without momentum), its .grad zeros
  filled       worker 1 sleeps inside backward at step 3 (between two
               buckets): the server closes that bucket without it; the report
               counts it and a FilledWarning says so
  nonfinite    worker 1's gradient turns NaN at step 3: every replica stays
               finite, the report names it
  modes        overlap=False and sync="wbsp" each train a model 20 steps; an allreduce
  contract     torch's optimizer contract: the DistributedOptimizer is of the user's
               optimizer's class (its own attributes and step), torch's step hooks
               run once a step and see the aggregate, an LR scheduler made with it
               steps without a warning, its state_dict loads into a plain SGD; more
               groups, wrapping it twice and copying it refused

JOB_DEVICE=cuda puts every model on the GPU (tests/gpu/test_ltpx_gpu.py).
"""
import copy
import hashlib
import json
import logging
import os
import sys
import time
import warnings

import torch
import torch.nn.functional as F

import ltpx.torch as lt

if os.environ.get("JOB_LOG"):   # a script that configures logging sees ltpx.torch's lines
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

DEV = torch.device(os.environ.get("JOB_DEVICE", "cpu"))   # cuda: tests/gpu
D, B, CLASSES = 12, 24, 3   # B divides by 2, 3, 4: equal shares of every batch
WHOLE = {"threshold_min": 1.0, "threshold_max": 1.0, "min_deadline_s": 2.0}


def batches(seed: int, steps: int):
    """The same global batches on every rank."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(B, D, generator=g)
        yield x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def mine(t: torch.Tensor) -> torch.Tensor:
    return t[lt.rank()::lt.size()].to(DEV)


def mlp(seed: int, hidden: int = 64) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(D, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, CLASSES)).to(DEV)


def exact(set_to_none: bool) -> dict:
    model, ref = mlp(1), mlp(1)
    lt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = lt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  named_parameters=model.named_parameters(), bucket_mb=0.01,
                                  early_close=WHOLE)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in batches(2, 30):
        opt.zero_grad(set_to_none=set_to_none)
        loss = F.cross_entropy(model(mine(x)), mine(y))
        loss.backward()
        opt.step()
        ref_opt.zero_grad()
        F.cross_entropy(ref(x.to(DEV)), y.to(DEV)).backward()
        ref_opt.step()
        losses.append(loss.item())
    diff = max((p - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))
    return {"max_diff_to_single": diff, "first_loss": sum(losses[:5]) / 5,
            "last_loss": sum(losses[-5:]) / 5,
            "buckets": len(opt.ltp.plan), "digest": lt.digest(model)}


def half(dtype: torch.dtype) -> dict:
    model = mlp(3).to(dtype)
    lt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = lt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                  named_parameters=model.named_parameters())
    losses = []
    for x, y in batches(4, 40):
        opt.zero_grad()
        loss = F.cross_entropy(model(mine(x).to(dtype)).float(), mine(y))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"dtypes": sorted({str(p.dtype) for p in model.parameters()}), "wire": opt.ltp.op.wire,
            "first_loss": sum(losses[:5]) / 5, "last_loss": sum(losses[-5:]) / 5,
            "digest": lt.digest(model)}


class Partly(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.body, self.head = torch.nn.Linear(D, 32), torch.nn.Linear(32, CLASSES)
        self.only_w0 = torch.nn.Linear(32, 32)    # used by worker 0 alone
        self.never = torch.nn.Linear(32, 32)      # used by no one

    def forward(self, x):
        h = torch.relu(self.body(x))
        if lt.rank() == 0:
            h = h + self.only_w0(h)
        return self.head(h)


def unused() -> dict:
    model = Partly().to(DEV)
    before = model.never.weight.detach().clone()
    lt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = lt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters())
    for x, y in batches(6, 10):
        opt.zero_grad()
        F.cross_entropy(model(mine(x)), mine(y)).backward()
        opt.step()
    return {"never_unchanged": bool(torch.equal(model.never.weight, before)),
            "never_grad_zero": bool(model.never.weight.grad is not None
                                    and not model.never.weight.grad.any()),
            "only_w0_moved_everywhere": bool(model.only_w0.weight.grad.abs().sum() > 0),
            "digest": lt.digest(model)}


def on_worker1_at_step3(doc: str, act):
    """An identity autograd Function whose backward applies `act` to worker
    1's gradient at step 3 (set `.step` before each step)."""
    class Hook(torch.autograd.Function):
        step = 0

        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            return act(g) if lt.rank() == 1 and Hook.step == 3 else g
    Hook.__doc__ = doc
    return Hook


def _sleep_then(g):
    time.sleep(2.0)
    return g


Slow = on_worker1_at_step3("Identity; its backward sleeps on worker 1 at step 3.", _sleep_then)


def filled() -> dict:
    torch.manual_seed(7)
    l1, l2, l3 = torch.nn.Linear(D, 256), torch.nn.Linear(256, 256), torch.nn.Linear(256, 3)
    model = torch.nn.ModuleList([l1, l2, l3]).to(DEV)
    lt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = lt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                  named_parameters=model.named_parameters(), bucket_mb=0.1,
                                  early_close={"min_deadline_s": 0.2}, warn_every=100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t, (x, y) in enumerate(batches(8, 6), start=1):
            Slow.step = t
            opt.zero_grad()
            h = torch.relu(l1(mine(x)))
            h = torch.relu(l2(Slow.apply(h)))
            F.cross_entropy(l3(h), mine(y)).backward()
            opt.step()
            if t == 3:
                at3 = opt.last_report.to_dict()
    for w in caught:
        print(f"{w.category.__name__}: {w.message}", file=sys.stderr)
    return {"buckets": len(opt.ltp.plan), "step3": at3,
            "total": opt.last_report.wholly_filled_total,
            "warnings": sum(isinstance(w.message, lt.FilledWarning) for w in caught),
            "digest": lt.digest(model)}


Poison = on_worker1_at_step3("Identity; its backward turns worker 1's gradient into NaN at "
                             "step 3.", lambda g: g * float("nan"))


def nonfinite() -> dict:
    torch.manual_seed(11)
    l1, l2 = torch.nn.Linear(D, 64), torch.nn.Linear(64, 3)
    model = torch.nn.ModuleList([l1, l2]).to(DEV)
    lt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = lt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                  named_parameters=model.named_parameters())
    reports = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t, (x, y) in enumerate(batches(8, 6), start=1):
            Poison.step = t
            opt.zero_grad()
            F.cross_entropy(l2(torch.relu(Poison.apply(l1(mine(x))))), mine(y)).backward()
            opt.step()
            reports.append(opt.last_report.to_dict()["nonfinite_workers"])
    return {"reports": reports, "finite": all(bool(torch.isfinite(p).all())
                                              for p in model.parameters()),
            "warned": any("NaN or Inf" in str(w.message) for w in caught),
            "digest": lt.digest(model)}


def modes() -> dict:
    """The optimizer's other paths (no overlap; wbsp, whose step() adds
    gradients into its host buffer) and an allreduce, on DEV."""
    out = {}
    for name, kw in (("no_overlap", {"overlap": False}), ("wbsp", {"sync": "wbsp"})):
        model = mlp(9)
        lt.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = lt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      named_parameters=model.named_parameters(),
                                      bucket_mb=0.01, **kw)
        # under wbsp a fast worker's step() may not move the model: as many
        # batches as it takes (the stream is lazy)
        losses, data = [], batches(10, 10**6)
        while opt.steps < 20:
            x, y = next(data)
            opt.zero_grad()
            loss = F.cross_entropy(model(mine(x)), mine(y))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        out[name] = {"first_loss": sum(losses[:5]) / 5, "last_loss": sum(losses[-5:]) / 5,
                     "steps": opt.steps, "digest": lt.digest(model)}
    t = torch.full((3, 2), float(lt.rank() + 1), device=DEV)
    mean = lt.allreduce(t)
    out["allreduce"] = {"device": mean.device.type, "values": sorted(set(mean.view(-1).tolist()))}
    out["digest"] = out["no_overlap"]["digest"] + out["wbsp"]["digest"]
    return out


class Counted(torch.optim.SGD):
    """A user's optimizer with attributes and a step of its own."""

    def __init__(self, params, lr: float):
        super().__init__(params, lr=lr, momentum=0.9)
        self.calls = 0

    def step(self, closure=None):
        self.calls += 1
        return super().step(closure)


def grads_digest(model) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.grad.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def contract() -> dict:
    model = mlp(11)
    lt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = lt.DistributedOptimizer(Counted(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters(), early_close=WHOLE)
    seen = {"pre": 0, "post": 0, "grads": []}

    def pre(o, args, kwargs):
        seen["pre"] += 1
        seen["grads"].append(grads_digest(model))   # each rank's own, unless aggregated

    opt.register_step_pre_hook(pre)
    opt.register_step_post_hook(lambda o, a, k: seen.__setitem__("post", seen["post"] + 1))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in batches(12, 6):
            opt.zero_grad()
            F.cross_entropy(model(mine(x)), mine(y)).backward()
            opt.step()
            sched.step()
    plain = torch.optim.SGD(mlp(11).parameters(), lr=1.0)
    plain.load_state_dict(opt.state_dict())
    # the same class without LTP, for how many times torch runs its hooks a step
    # (twice: Counted's step and SGD's, which it calls, are each wrapped)
    ref = Counted(plain.param_groups[0]["params"], lr=0.1)
    ref_hooks = []
    ref.register_step_pre_hook(lambda o, a, k: ref_hooks.append(1))
    ref.step()
    refused = []
    for act in (lambda: opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]}),
                lambda: lt.DistributedOptimizer(opt), lambda: copy.deepcopy(opt)):
        try:
            act()
        except Exception as e:
            refused.append(type(e).__name__)
    return {"class": type(opt).__name__, "is_sgd": isinstance(opt, torch.optim.SGD),
            "own_steps": opt.calls, "steps": opt.steps, "pre": seen["pre"], "post": seen["post"],
            "grads": seen["grads"], "lr": opt.param_groups[0]["lr"],
            "warnings": [str(w.message)[:120] for w in caught],
            "loaded_momenta": sum("momentum_buffer" in v for v in plain.state.values()),
            "params": len(list(model.parameters())), "refused": refused,
            "plain_hooks_per_step": len(ref_hooks),
            "digest": lt.digest(model)}


CASES = {"set_to_none": lambda: exact(True), "keep_grads": lambda: exact(False),
         "fp16": lambda: half(torch.float16), "bf16": lambda: half(torch.bfloat16),
         "unused": unused, "filled": filled, "nonfinite": nonfinite, "modes": modes,
         "contract": contract}

if __name__ == "__main__":
    lt.init()
    torch.set_num_threads(1)
    out = {}
    for case in sys.argv[1].split(","):
        out[case] = CASES[case]()
        print(json.dumps({"case": case, **out[case]}), flush=True)
    lt.shutdown()
    # the natural pattern: rank() and size() still answer after shutdown()
    print(json.dumps({"event": "result", "rank": lt.rank(), "size": lt.size(), "cases": out}),
          flush=True)
