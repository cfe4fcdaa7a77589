# SPDX-License-Identifier: Apache-2.0
"""`ltp bench paths`: two jobs pushing LTP rounds at once across a leaf-spine
fabric, under plain ECMP and under pinned paths.

One leaf-spine rig (2 leaves, 2 spines, 2 jobs; each job's PS on leaf 0 and
its workers on leaf 1). Each job is an LtpCluster (PS endpoint here, worker
processes in their namespaces) with the link rate as its capacity. Per trial:

- ecmp: every flow gets a fresh random source port (what a new socket would
  draw; written as a pin so the endpoints stay up) and the leaves' L4 hash
  picks the spine. Collisions are a matter of chance, so each trial draws anew.
- pinned: control.pathplan.assign + pin (probed source ports).

In each trial both jobs run `rounds` rounds concurrently (one thread per
job); the per-link counters are reset first and read after. Isolated: job 0
alone, pinned, for the same rounds (trials x rounds).
"""
from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

from ...dataplane.rig.leafspine import LeafSpine, LeafSpineConfig
from .. import pathplan
from .cluster import LtpCluster


def _run_jobs(clusters: list[LtpCluster], rounds: int, first_round: int, nelems: int
              ) -> list[list[float]]:
    """Run `rounds` rounds in every cluster at once; round durations per cluster."""
    out: list[list[float]] = [[] for _ in clusters]
    errors: list[BaseException] = []
    start = threading.Barrier(len(clusters))

    def job(i: int) -> None:
        try:
            start.wait()
            for r in range(first_round, first_round + rounds):
                res, _ = clusters[i].run_round(r, nelems, seed=i)
                out[i].append(res.duration_s)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
            start.abort()

    threads = [threading.Thread(target=job, args=(i,)) for i in range(len(clusters))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def run(trials: int = 10, rounds: int = 5, nelems: int = 1 << 17, rate_bps: int = 100_000_000,
        buffer_bytes: int = 60_000, workers: int = 2, name: str = "bpaths",
        progress: Callable[[str], None] | None = None) -> dict:
    say = progress or (lambda m: None)
    cfg = LeafSpineConfig(name=name, leaves=2, spines=2, jobs=2, workers=workers,
                          rate_bps=rate_bps, buffer_bytes=buffer_bytes)
    t0 = time.monotonic()
    with LeafSpine(cfg) as ls:
        flows = pathplan.rig_flows(ls, nelems * 4)
        assignment = pathplan.assign(cfg.spines, flows)
        probes = pathplan.probe_flows(ls, flows)
        clusters: list[LtpCluster] = []
        try:
            say("starting endpoints")
            for j in range(cfg.jobs):
                clusters.append(LtpCluster(ls.job(j), nelems, job=0x100 + j,
                                           capacity_bps=rate_bps, warmup=False))
            rnd = 1
            pathplan.pin(ls, assignment, probes=probes)
            for i, c in enumerate(clusters):      # warm-up, one job at a time
                c.run_round(rnd, nelems, seed=i)
            rnd += 1
            say("isolated")
            iso = _run_jobs(clusters[:1], rounds * trials, rnd, nelems)[0]
            rnd += rounds * trials
            res: dict[str, dict] = {}
            placements = {"ecmp": lambda t: pathplan.ecmp_draw(ls, flows, seed=t),  # fresh draw
                          "pinned": lambda t: pathplan.pin(ls, assignment, probes=probes)}
            for policy, place in placements.items():
                res[policy] = _trials(ls, clusters, place, trials=trials, rounds=rounds,
                                      first_round=rnd, nelems=nelems,
                                      say=lambda m, p=policy: say(f"{p} {m}"))
                rnd += rounds * trials
        finally:
            for c in clusters:
                c.close()
    return {"isolated_round_median_s": statistics.median(iso), **res,
            "assignment": assignment.to_dict(),
            "config": {"trials": trials, "rounds": rounds, "nelems": nelems,
                       "bytes_per_worker": nelems * 4, "workers_per_job": workers,
                       "jobs": 2, "leaves": 2, "spines": 2, "rate_bps": rate_bps,
                       "buffer_bytes": buffer_bytes},
            "wall_s": time.monotonic() - t0}


def _trials(ls, clusters: list[LtpCluster], place: Callable[[int], dict], *, trials: int,
            rounds: int, first_round: int, nelems: int, say: Callable[[str], None]) -> dict:
    """`trials` trials of one path policy (`place(t)` sets trial t's paths and
    returns its pins): every job's rounds at once, the links' bytes read after."""
    per_job: list[list[float]] = [[] for _ in clusters]
    tr = []
    rnd = first_round
    for t in range(trials):
        say(f"trial {t + 1}/{trials}")
        pins = place(t)
        ls.reset_link_counters()
        times = _run_jobs(clusters, rounds, rnd, nelems)
        rnd += rounds
        obs = pathplan.observe(ls)
        for j, ts in enumerate(times):
            per_job[j] += ts
        tr.append({"trial": t, "pins": pins,
                   "job_round_median_s": [statistics.median(ts) for ts in times],
                   "shared_links": obs["shared_links"],
                   "shared_link_fraction": obs["shared_link_fraction"],
                   "link_bytes": obs["link_bytes"]})
    link_bytes: dict[str, dict[str, int]] = {}
    for t in tr:
        for link, d in t["link_bytes"].items():
            acc = link_bytes.setdefault(link, {})
            for j, v in d.items():
                acc[j] = acc.get(j, 0) + v
    return {"job_round_median_s": [statistics.median(ts) for ts in per_job],
            "job_round_p90_s": [_quantile(ts, 0.9) for ts in per_job],
            "shared_link_fraction": statistics.mean(t["shared_link_fraction"] for t in tr),
            "collision_trial_fraction": sum(bool(t["shared_links"]) for t in tr) / len(tr),
            "link_bytes": link_bytes,
            "trials": tr}


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def table(r: dict) -> str:
    lines = [f"{'policy':<9}{'job0 med':>10}{'job1 med':>10}{'job0 p90':>10}{'job1 p90':>10}"
             f"{'shared':>8}{'collide':>9}"]
    for pol in ("ecmp", "pinned"):
        d = r[pol]
        m, p = d["job_round_median_s"], d["job_round_p90_s"]
        lines.append(f"{pol:<9}{m[0] * 1e3:>8.1f}ms{m[1] * 1e3:>8.1f}ms{p[0] * 1e3:>8.1f}ms"
                     f"{p[1] * 1e3:>8.1f}ms{d['shared_link_fraction']:>8.2f}"
                     f"{d['collision_trial_fraction']:>9.2f}")
    lines.append(f"isolated job0 median {r['isolated_round_median_s'] * 1e3:.1f} ms "
                 f"({r['config']['bytes_per_worker']} B x {r['config']['workers_per_job']} workers"
                 f" per job, links {r['config']['rate_bps'] / 1e6:g} Mbit/s)")
    for pol in ("ecmp", "pinned"):
        lb = r[pol]["link_bytes"]
        lines.append(f"{pol} bytes per link: " + ", ".join(
            f"{k} " + "/".join(f"{j}={v / 1e6:.1f}M" for j, v in d.items() if j != "other")
            for k, d in lb.items() if any(j != "other" for j in d)))
    return "\n".join(lines)
