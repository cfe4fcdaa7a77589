# SPDX-License-Identifier: Apache-2.0
"""Sharded servers' arithmetic (shards.py runs them): each piece cut into S
contiguous slices (`plan_slices`, `split_op`), and what the S servers say of
one step merged into one report and one summary."""
from __future__ import annotations

import dataclasses

import numpy as np

from ...errors import UsageError
from .ops import REASONS, Op, StepReport


def plan_slices(n: int, servers: int) -> list[tuple[int, int]]:
    """[lo, hi) of each server's slice of an n-element piece: contiguous,
    in server order, covering 0..n, sizes differing by at most one (the first
    n % servers slices are one larger). UsageError when a server would get
    nothing (n < servers)."""
    if servers < 1:
        raise UsageError(f"servers: must be at least 1, got {servers}")
    if n < servers:
        raise UsageError(f"cannot cut {n} element(s) into {servers} server slices: every "
                         "server needs at least one element")
    q, r = divmod(n, servers)
    out, lo = [], 0
    for i in range(servers):
        hi = lo + q + (1 if i < r else 0)
        out.append((lo, hi))
        lo = hi
    return out


def split_op(op: Op, servers: int) -> tuple[list[Op], list[list[tuple[int, int]]]]:
    """Each shard's op (its slice of every piece) and the slices per piece.
    A piece shorter than `servers` is padded with zeros to one element per
    server, so every server still sees every piece."""
    slices = [plan_slices(max(n, servers), servers) for n in op.sizes]
    subs = [dataclasses.replace(op, sizes=tuple(sl[i][1] - sl[i][0] for sl in slices))
            for i in range(servers)]
    return subs, slices


def merge_reports(reps: list[StepReport], workers: int) -> StepReport:
    """One step's report from the S servers' (each saw a slice of every bucket):
    per bucket the worst close, per worker the mean delivered fraction and
    the summed filled chunks and wholly filled bucket slices, the longest
    gather time and the largest filled error, the stragglers merged
    (merge_stragglers); anything else (step, ks, ...) as server 0 says."""
    B = len(reps[0].reasons)
    reasons = [max((r.reasons[b] for r in reps), key=REASONS.index) for b in range(B)]
    ws = range(workers)
    return dataclasses.replace(
        reps[0], reasons=reasons,
        delivered={w: float(np.mean([r.delivered[w] for r in reps])) for w in ws},
        filled_chunks={w: sum(r.filled_chunks[w] for r in reps) for w in ws},
        wholly_filled={w: sum(r.wholly_filled[w] for r in reps) for w in ws},
        nonfinite={w: n for w in ws if (n := sum(r.nonfinite.get(w, 0) for r in reps))},
        gather_s=max(r.gather_s for r in reps),
        filled_error=max(r.filled_error for r in reps), **merge_stragglers(reps))


def merge_stragglers(reps: list[StepReport]) -> dict:
    """The servers' straggler attributions as one: per worker the mean
    lateness over the servers that timed it, and the worker most servers
    named (ties: the later one), None if none did."""
    late: dict[int, list[float]] = {}
    for r in reps:
        for w, v in r.lateness.items():
            late.setdefault(w, []).append(v)
    lateness = {w: float(np.mean(v)) for w, v in sorted(late.items())}
    named = [r.straggler for r in reps if r.straggler is not None]
    straggler = max(set(named), key=lambda w: (named.count(w), lateness.get(w, 0.0))) \
        if named else None
    return {"straggler": straggler, "lateness": lateness}


def merge_summaries(sums: list[dict]) -> dict:
    """The servers' summaries as one (their own under "servers")."""
    reasons: dict[str, int] = {}
    for s in sums:
        for k, v in (s.get("rounds_by_reason") or {}).items():
            reasons[k] = reasons.get(k, 0) + v
    times = {k: round(max(s.get("ps_times", {}).get(k, 0.0) for s in sums), 4)
             for k in sums[0].get("ps_times", {})}
    medians = [s["round_s_median"] for s in sums if s.get("round_s_median") is not None]
    return {"steps": sums[0].get("steps"), "ops": sums[0].get("ops"), "ps_times": times,
            "rounds_by_reason": reasons,
            "delivered_fraction": float(np.mean([s.get("delivered_fraction", 1.0)
                                                 for s in sums])),
            "round_s_median": max(medians) if medians else None,
            "streamed_answers": sum(s.get("streamed_answers", 0) for s in sums),
            "servers": sums}
