# SPDX-License-Identifier: Apache-2.0
"""Contention-free path assignment for jobs on a two-tier leaf-spine fabric.

The problem (vClos, see /work/shared/PAPERS.md): with plain ECMP every flow's
spine is a hash of its 5-tuple, so two jobs' flows land on one leaf-spine link
by chance and each runs at a fraction of the link. Here the control plane
picks the spine of every cross-leaf flow; the data path enforces it
(bpf/path_pin.c, dataplane/rig/pathpin.py, dataplane/rig/leafspine.py).

A flow from a host on leaf u to a host on leaf d (u != d) through spine s uses
two links: the uplink ("L", u, s) and the downlink ("S", s, d). Flows inside
one leaf use no spine link and are not assigned.

`assign(spines, flows)` is deterministic (sorted inputs, ties to the lowest
index, no randomness) and works in one of two regimes:

1. spines >= jobs that cross the spine layer: **exclusive**. Job k (jobs in
   order of decreasing bytes, then name) owns spines {k, k+J, k+2J, ...}
   (J = number of jobs), so no two jobs ever share a leaf-spine link. Within
   its own spines a job's flows are placed by the greedy rule below, which
   spreads them when a job owns several spines.
2. spines < jobs: **balanced**. Flows are taken in order of decreasing bytes
   (then job, src, dst) and each goes to the spine that minimises, in order:
   (a) the larger of the two loads its links would carry after adding it
   (greedy longest-processing-time for the most loaded link: LPT is within
   4/3 of the optimum min-max for identical parallel machines), (b) the
   number of other jobs already on those links (keeps jobs apart when
   loads tie), (c) the spine index.

What it optimises: first isolation (no link shared between jobs) whenever the
topology allows it, then the maximum bytes on any leaf-spine link.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from collections.abc import Iterable

from ..dataplane.xdp import wire as W
from ..errors import RigError
import random

LinkId = tuple  # ("L", leaf, spine) uplink, or ("S", spine, leaf) downlink


def link_name(link: LinkId) -> str:
    """("L", 1, 0) -> "l1>s0"; ("S", 0, 0) -> "s0>l0"."""
    kind, a, b = link
    return f"l{a}>s{b}" if kind == "L" else f"s{a}>l{b}"


@dataclass(frozen=True)
class Flow:
    """One sender -> receiver flow of a job. Leaves are indices; bytes is the
    expected volume (per round), the weight the balancer uses."""

    job: str
    src: str
    dst: str
    src_leaf: int
    dst_leaf: int
    bytes: int = 1

    @property
    def crosses(self) -> bool:
        return self.src_leaf != self.dst_leaf

    def links(self, spine: int) -> tuple[LinkId, LinkId]:
        return ("L", self.src_leaf, spine), ("S", spine, self.dst_leaf)


@dataclass
class Assignment:
    """flow -> spine, and what it puts on each link."""

    spines: int
    regime: str                                   # exclusive | balanced | none
    spine_of: dict[Flow, int] = field(default_factory=dict)

    def link_bytes(self) -> dict[LinkId, int]:
        out: dict[LinkId, int] = {}
        for f, s in self.spine_of.items():
            for link in f.links(s):
                out[link] = out.get(link, 0) + f.bytes
        return out

    def link_jobs(self) -> dict[LinkId, set[str]]:
        out: dict[LinkId, set[str]] = {}
        for f, s in self.spine_of.items():
            for link in f.links(s):
                out.setdefault(link, set()).add(f.job)
        return out

    def shared_links(self) -> list[LinkId]:
        return sorted(link for link, jobs in self.link_jobs().items() if len(jobs) > 1)

    def max_link_bytes(self) -> int:
        return max(self.link_bytes().values(), default=0)

    def job_spines(self) -> dict[str, list[int]]:
        out: dict[str, set[int]] = {}
        for f, s in self.spine_of.items():
            out.setdefault(f.job, set()).add(s)
        return {j: sorted(v) for j, v in sorted(out.items())}

    def to_dict(self) -> dict:
        return {"spines": self.spines, "regime": self.regime,
                "flows": [{**asdict(f), "spine": s} for f, s in
                          sorted(self.spine_of.items(), key=lambda kv: _flow_order(kv[0]))],
                "job_spines": self.job_spines(),
                "link_bytes": {link_name(k): v for k, v in sorted(self.link_bytes().items())},
                "shared_links": [link_name(k) for k in self.shared_links()]}


def _flow_order(f: Flow) -> tuple:
    return (f.job, f.src, f.dst)


def _greedy(flows: list[Flow], allowed: dict[str, list[int]], spine_of: dict[Flow, int],
            load: dict[LinkId, int], jobs_on: dict[LinkId, set[str]]) -> None:
    for f in sorted(flows, key=lambda f: (-f.bytes, f.job, f.src, f.dst)):
        def cost(s: int, f: Flow = f) -> tuple:
            up, dn = f.links(s)
            worst = max(load.get(up, 0), load.get(dn, 0)) + f.bytes
            others = len(jobs_on.get(up, set()) - {f.job}) + len(jobs_on.get(dn, set()) - {f.job})
            return (worst, others, s)
        best = min(allowed[f.job], key=cost)
        spine_of[f] = best
        for link in f.links(best):
            load[link] = load.get(link, 0) + f.bytes
            jobs_on.setdefault(link, set()).add(f.job)


def assign(spines: int, flows: Iterable[Flow]) -> Assignment:
    """Choose a spine for every cross-leaf flow (see the module docstring)."""
    if spines < 1:
        raise ValueError(f"spines: must be at least 1, got {spines}")
    cross = [f for f in flows if f.crosses]
    if len({(f.job, f.src, f.dst) for f in cross}) != len(cross):
        raise ValueError("flows: each (job, src, dst) must appear once")
    volume: dict[str, int] = {}
    for f in cross:
        volume[f.job] = volume.get(f.job, 0) + f.bytes
    jobs = sorted(volume, key=lambda j: (-volume[j], j))
    if not jobs:
        return Assignment(spines, "none")
    if spines >= len(jobs):
        allowed = {j: list(range(k, spines, len(jobs))) for k, j in enumerate(jobs)}
        regime = "exclusive"
    else:
        allowed = {j: list(range(spines)) for j in jobs}
        regime = "balanced"
    a = Assignment(spines, regime)
    _greedy(cross, allowed, a.spine_of, {}, {})
    return a


# --------------------------------------------------------------------------- on a leaf-spine rig
# The functions below apply the policy above to a dataplane.rig.leafspine.LeafSpine:
# probing each flow's leaf hash, writing pins, reading per-link counters.

PROBE_PORTS = range(20000, 20032)    # outside the ephemeral range (32768-60999)


def rig_flows(ls, bytes_per_flow: int = 1) -> list[Flow]:
    """One flow per worker -> its job's PS (the LTP push direction)."""
    out = []
    for j in range(ls.config.jobs):
        job = ls.job(j)
        out += [Flow(f"j{j}", w.name, job.ps.name, w.leaf, job.ps.leaf, bytes_per_flow)
                for w in job.workers]
    return out


def probe_flows(ls, flows: Iterable[Flow], dport: int = W.PORT) -> dict[Flow, dict[int, int]]:
    """flow -> {source port: spine} for the candidate ports (pins of these
    flows are removed first: they would rewrite the probes)."""
    flows = [f for f in flows if f.crosses]
    ls.clear_pins()
    return {f: ls.probe(ls.host(f.src), ls.host(f.dst), dport, PROBE_PORTS) for f in flows}


def pin(ls, assignment: Assignment, dport: int = W.PORT,
        probes: dict[Flow, dict[int, int]] | None = None) -> list[dict]:
    """Enforce `assignment`: for every flow, the lowest probed source port that
    the source leaf hashes onto the assigned spine goes into path_pins."""
    probes = probes or probe_flows(ls, assignment.spine_of, dport)
    ls.clear_pins()
    out = []
    for f, spine in sorted(assignment.spine_of.items(), key=lambda kv: _flow_order(kv[0])):
        ports = sorted(p for p, s in probes.get(f, {}).items() if s == spine)
        if not ports:
            raise RigError(f"no probed source port of {f.src}->{f.dst} hashes to spine "
                               f"{spine} (probed {len(probes.get(f, {}))} ports); re-run "
                               "`ltp paths pin` or check the rig with `ltp paths show`")
        src, dst = ls.host(f.src), ls.host(f.dst)
        ls.set_pin(src.ip, dst.ip, dport, ports[0], spine)
        out.append({"job": f.job, "src": f.src, "dst": f.dst, "sport": ports[0], "spine": spine})
    return out


def ecmp_draw(ls, flows: Iterable[Flow], seed: int, dport: int = W.PORT) -> list[dict]:
    """Plain ECMP with a fresh 5-tuple per flow: a random source port from the
    ephemeral range (what a new socket would get); the leaf's hash picks the
    spine. Written as pins so the endpoints' sockets need not be re-made."""
    rng = random.Random(seed)
    ls.clear_pins()
    out = []
    for f in sorted((f for f in flows if f.crosses), key=_flow_order):
        sport = rng.randrange(32768, 61000)
        src, dst = ls.host(f.src), ls.host(f.dst)
        ls.set_pin(src.ip, dst.ip, dport, sport, 0xFFFF)
        out.append({"job": f.job, "src": f.src, "dst": f.dst, "sport": sport})
    return out


def observe(ls, min_fraction: float = 0.01) -> dict:
    """Bytes per link per job from the link counters ("j0": worker -> PS push
    bytes, "j0:ack": PS -> worker, "other": probes, anything else). A link is
    shared when two or more jobs each put at least `min_fraction` of its push
    bytes on it; ACKs (built in XDP, not pinned) are shown but not judged."""
    host_of = {h.ip: h for h in ls.hosts}
    per_link: dict[str, dict[str, int]] = {lk.label: {} for lk in ls.links}
    flows: dict[tuple, dict] = {}
    for e in ls.link_counters():
        hs, hd = host_of.get(e["saddr"]), host_of.get(e["daddr"])
        job = "other"
        if hs and hd and hs.job == hd.job:       # push j<k>; PS -> worker (ACKs) j<k>:ack
            job = f"j{hs.job}" if hd.role == "ps" else f"j{hs.job}:ack"
        d = per_link.setdefault(e["link"], {})
        d[job] = d.get(job, 0) + e["bytes"]
        if job.startswith("j") and ":" not in job:
            fk = (e["saddr"], e["daddr"], e["sport"], e["dport"], e["link"])
            fl = flows.setdefault(fk, {"job": job, "saddr": e["saddr"], "daddr": e["daddr"],
                                       "sport": e["sport"], "dport": e["dport"],
                                       "link": e["link"], "spine": e["spine"], "bytes": 0})
            fl["bytes"] += e["bytes"]
    shared = []
    for link, d in per_link.items():
        push = {j: v for j, v in d.items() if j != "other" and ":" not in j}
        total = sum(push.values())
        heavy = [j for j, v in push.items() if total and v >= min_fraction * total]
        if len(heavy) > 1:
            shared.append(link)
    used = [link for link, d in per_link.items()
            if any(k != "other" and ":" not in k and v for k, v in d.items())]
    return {"link_bytes": {k: dict(sorted(v.items())) for k, v in sorted(per_link.items())},
            "shared_links": sorted(shared), "used_links": sorted(used),
            "shared_link_fraction": len(shared) / len(used) if used else 0.0,
            "flows": sorted(flows.values(), key=lambda f: (f["job"], f["saddr"], f["link"]))}
