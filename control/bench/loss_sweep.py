# SPDX-License-Identifier: Apache-2.0
"""`ltp bench loss`: training speed and accuracy against the loss rate.

One star rig; for each loss rate (set on every port, both ways), each
variant trains the same model from the same seed (`train_on_rig`), in an
order that alternates from one loss rate to the next and from one repeat to
the next (the machine drifts). Variants:

    ltp               LTP with its defaults (loss policy auto, torchapi/losspolicy.py)
    ltp:loss=repair   ... every loss repaired: the paper's rule (Early Close's 0.95
                      floor), every answer whole (TrainConfig.loss_policy)
    ltp:loss=defer    ... tolerant answers from the first step
    ltp:budget=B      ... with a fixed loss budget B (EarlyCloseConfig.budget)
    ltp:code=rs       ... with coded answers (LTP_DOWNLINK_CODE=rs)
    ltp:warmup=N      ... the loss policy's warm-up of N steps (LTP_LOSS_WARMUP)
    ltp:compress=C    ... gradients on the wire as C (TrainConfig.compress): none keeps
                      float32 at any loss, where auto (the default) lets the loss
                      policy choose bfloat16 under heavy loss
    tcp               TCP cubic (the same server over TCP)
An ltp variant's knobs combine (ltp:loss=defer:budget=0.7).

Each variant's figures per loss rate: iterations/s (median over repeats),
final accuracy, accuracy at a quarter of the run (an evaluation there: what
a tolerance costs early in training), delivered fraction, rounds closed early, the ledger's mean
filled error, the server's gather and broadcast seconds; and against its own
lossless run (`vs_lossless`: it/s ratio; `accuracy_pp`: accuracy difference
in percentage points). A run that fails (a rank's error, or longer than
`run_timeout_s`: TCP at heavy loss can take minutes a step) is kept as its
error and the sweep goes on; its variant and loss rate have figures only
from the runs that finished.
"""
from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

from ...errors import LtpError, UsageError
from ..settings_table import EXACT_COMPRESS, TABLE, to_env
from ..training.config import TrainConfig
from ..training.onrig import rig_config, train_on_rig

KEYS = ("budget", "code", "compress", "loss", "warmup")
CHOICES = {"code": ("rs", "off"), "loss": TABLE["loss_policy"].choices,
           "compress": TABLE["compress"].choices}


@dataclass(frozen=True)
class Variant:
    label: str
    transport: str = "ltp"
    budget: float = 0.0
    code: str = "off"
    env: dict = field(default_factory=dict)
    loss: str = TABLE["loss_policy"].default
    compress: str = TABLE["compress"].default


def parse_variants(text: str) -> list[Variant]:
    """`ltp,ltp:budget=0.35,tcp` as Variants; UsageError names a bad item."""
    out: list[Variant] = []
    for item in (x.strip() for x in text.split(",")):
        tr, *parts = item.split(":")
        if tr not in ("ltp", "tcp") or (tr == "tcp" and parts):
            raise UsageError(f"--variants: cannot read {item!r} (ltp, ltp:budget=B, "
                             "ltp:code=rs, ltp:loss=repair|defer|auto, ltp:warmup=N, "
                             "ltp:compress=C, tcp)")
        budget, knobs = 0.0, {"code": "off", "loss": TABLE["loss_policy"].default,
                              "compress": TABLE["compress"].default}
        env: dict = {}
        for part in parts:
            key, eq, val = part.partition("=")
            if not eq or key not in KEYS:
                raise UsageError(f"--variants: {item!r}: keys are {', '.join(KEYS)}")
            if key == "budget":
                try:
                    budget = float(val)
                except ValueError:
                    budget = -1.0
                if not 0 < budget <= TABLE["loss_budget"].hi:
                    raise UsageError(f"--variants: {item!r}: budget must be in "
                                     f"(0, {TABLE['loss_budget'].hi}]")
            elif key == "warmup":
                w = TABLE["loss_warmup"]
                try:
                    steps = int(val)
                except ValueError:
                    steps = -1
                if not w.lo <= steps <= w.hi:
                    raise UsageError(f"--variants: {item!r}: warmup is a step count, "
                                     f"{w.lo}..{w.hi}")
                env = to_env({"loss_warmup": steps})
            elif val not in CHOICES[key]:
                raise UsageError(f"--variants: {item!r}: {key} is {' or '.join(CHOICES[key])}")
            else:
                knobs[key] = val
        if env and (knobs["loss"] != "auto" or budget):
            raise UsageError(f"--variants: {item!r}: warmup is the loss policy auto's, "
                             "with no fixed budget")
        if knobs["loss"] == "defer" and (knobs["code"] == "rs" or
                                         knobs["compress"] not in EXACT_COMPRESS):
            raise UsageError(f"--variants: {item!r}: loss=defer does not combine with code=rs "
                             "or a compress that rounds")
        v = Variant(item, tr, budget, knobs["code"],
                    {**to_env({"downlink_code": knobs["code"]}), **env} if tr == "ltp" else {},
                    knobs["loss"], knobs["compress"])
        if v.label in [o.label for o in out]:
            raise UsageError(f"--variants: {item!r} twice")
        out.append(v)
    return out


@contextmanager
def _env(extra: dict):
    """This process's environment with `extra` for one run (ranks inherit it)."""
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _figures(res: dict, quarter: int) -> dict:
    ps = res.get("ps_times") or {}
    at = [e["accuracy"] for e in res.get("curve", []) if e["t"] == quarter]
    return {"iterations_per_s": res["iterations_per_s"],
            "final_accuracy": res["final_accuracy"],
            "quarter_accuracy": at[0] if at else None,
            "delivered_fraction": res.get("delivered_fraction", 1.0),
            "rounds_early_closed": res.get("rounds_early_closed", 0),
            "filled_error_mean": res.get("filled_error_mean", 0.0),
            "gather_s": ps.get("gather_s"), "broadcast_s": ps.get("broadcast_s"),
            "replicas_identical": res.get("replicas_identical")}


def run(*, losses: list[float], variants: list[Variant], workers: int, iterations: int,
        rate_bps: int, buffer_bytes: int, repeats: int = 1, name: str = "lsweep",
        seed: int = 0, progress: Callable[[str], None] | None = None,
        run_timeout_s: float = 900.0) -> dict:
    """The sweep on one rig; returns the documented JSON object."""
    runs: dict[str, dict[str, list[dict]]] = {v.label: {str(p): [] for p in losses}
                                               for v in variants}
    total, done = repeats * len(losses) * len(variants), 0
    with rig_config_rig(name, workers, rate_bps, buffer_bytes) as rig:
        for rep in range(repeats):
            for i, p in enumerate(losses):
                rig.set_loss(p)
                order = variants if (rep + i) % 2 == 0 else variants[::-1]
                for v in order:
                    # an evaluation at a quarter of the run (and at its end)
                    cfg = TrainConfig(transport=v.transport, iterations=iterations, seed=seed,
                                      eval_every=max(1, iterations // 4),
                                      loss_policy=v.loss if v.transport == "ltp"
                                      else TABLE["loss_policy"].default, loss_budget=v.budget,
                                      compress=v.compress)
                    try:
                        with _env(v.env):
                            res = train_on_rig(rig, cfg, workers=workers,
                                               timeout_s=run_timeout_s)
                        fig = _figures(res, max(1, iterations // 4))
                        said = (f"{res['iterations_per_s']:.2f} it/s, accuracy "
                                f"{res['final_accuracy']:.4f}")
                    except LtpError as e:
                        fig, said = {"error": str(e)}, f"failed: {e}"
                    runs[v.label][str(p)].append(fig)
                    done += 1
                    if progress:
                        progress(f"[{done}/{total}] loss {p:g} {v.label}: {said}")
    failed = [{"variant": label, "loss": float(p), "error": r["error"]}
              for label, per in runs.items() for p, rs in per.items() for r in rs if "error" in r]
    return {"config": {"losses": losses, "variants": [v.label for v in variants],
                       "workers": workers, "iterations": iterations, "rate_bps": rate_bps,
                       "buffer_bytes": buffer_bytes, "repeats": repeats, "seed": seed,
                       "run_timeout_s": run_timeout_s},
            "results": {label: _summary(per) for label, per in runs.items()}, "runs": runs,
            "failed": failed}


def rig_config_rig(name: str, workers: int, rate_bps: int, buffer_bytes: int):
    from ...dataplane.rig.star import Rig   # noqa: PLC0415 (pyroute2 only where a rig is made)
    return Rig(rig_config(name, "ltp", workers=workers, rate_bps=rate_bps,
                          buffer_bytes=buffer_bytes, loss=0.0))


def _summary(per: dict[str, list[dict]]) -> dict[str, dict]:
    """Per loss rate: the medians over repeats, and against the lossless run."""
    out = {}
    for p, runs in per.items():
        rs = [r for r in runs if "error" not in r]
        failed = len(runs) - len(rs)
        if not rs:       # no run of it finished: why the first did not
            out[p] = {"error": runs[0]["error"], "runs_failed": failed}
            continue
        out[p] = {k: statistics.median(r[k] for r in rs) for k in
                  ("iterations_per_s", "final_accuracy", "delivered_fraction",
                   "rounds_early_closed", "filled_error_mean")}
        qs = [r["quarter_accuracy"] for r in rs if r.get("quarter_accuracy") is not None]
        out[p]["quarter_accuracy"] = statistics.median(qs) if qs else None
        out[p]["replicas_identical"] = all(r["replicas_identical"] for r in rs)
        out[p]["runs_failed"] = failed
    base = out.get("0") or out.get("0.0")
    if base and "error" not in base:
        for row in out.values():
            if "error" not in row:
                row["vs_lossless"] = row["iterations_per_s"] / base["iterations_per_s"]
                row["accuracy_pp"] = 100 * (row["final_accuracy"] - base["final_accuracy"])
    return out


def table(res: dict) -> str:
    """One line per variant and loss rate."""
    lines = [f"{'variant':<22} {'loss':>5} {'it/s':>7} {'vs 0':>6} {'accuracy':>9} "
             f"{'pp':>6} {'at 1/4':>7} {'early':>6} {'filled err':>10}"]
    for label, per in res["results"].items():
        for p, r in per.items():
            if "error" in r:
                lines.append(f"{label:<22} {float(p):>5g} failed: {r['error']}")
                continue
            lines.append(f"{label:<22} {float(p):>5g} {r['iterations_per_s']:>7.2f} "
                         f"{r.get('vs_lossless', float('nan')):>6.2f} "
                         f"{r['final_accuracy']:>9.4f} {r.get('accuracy_pp', float('nan')):>6.2f} "
                         f"{_num(r.get('quarter_accuracy')):>7} "
                         f"{r['rounds_early_closed']:>6g} {r['filled_error_mean']:>10.4f}")
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def plot(res: dict, path: str) -> str:
    """it/s and accuracy against the loss rate, a line per variant."""
    import matplotlib   # noqa: PLC0415 (the plot extra; only with --plot)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt   # noqa: PLC0415 (as above)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for label, per in res["results"].items():
        done = {float(p): r for p, r in per.items() if "error" not in r}   # failed: no point
        a.plot(list(done), [r["iterations_per_s"] for r in done.values()], marker="o",
               label=label)
        b.plot(list(done), [r["final_accuracy"] for r in done.values()], marker="o",
               label=label)
    a.set(xlabel="loss rate (every port)", ylabel="iterations/s")
    b.set(xlabel="loss rate (every port)", ylabel="final accuracy")
    a.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
