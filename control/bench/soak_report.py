# SPDX-License-Identifier: Apache-2.0
"""The figures and the verdict of `ltp bench soak` (soak.py runs it): per
process start/end/max of RSS and fds, the job's and the machine's BPF and
record counts, what grew or was left behind, notes that change no verdict,
the text report and the progress line.
"""
from __future__ import annotations

from typing import Any

from . import procscan

RSS_GROWTH_LIMIT_PCT = 5.0
SLOW_EXIT_S = 5.0       # a process this long to exit after SIGTERM did not unwind promptly


def stats(values: list[int]) -> dict:
    return {"start": values[0], "end": values[-1], "max": max(values), "min": min(values)}


def growth(st: dict) -> float:
    return round(100.0 * (st["end"] - st["start"]) / st["start"], 2) if st["start"] else 0.0


def process_figures(tr: Any, t_start: float) -> dict:
    """The figures of a process (a soak.Track): `first` its first sample,
    the rest from the judged part of the soak (its samples at or after
    t_start), and how long it took to exit after the job's SIGTERM."""
    judged = [p for p in tr.points if p[0] >= t_start]
    out = {"label": tr.label, "pid": tr.pid, "rank": tr.rank, "samples": len(tr.points),
           "samples_judged": len(judged), "first_s": tr.points[0][0],
           "last_s": tr.points[-1][0], "exit_after_sigterm_s": tr.exit_s}
    for i, key in ((1, "rss_kb"), (2, "fds")):
        out[key] = dict(first=tr.points[0][i], **(stats([p[i] for p in judged]) if judged
                                                 else {}))
    out["rss_growth_pct"] = growth(out["rss_kb"]) if judged else None
    return out


def judge(rep: dict, rest: dict, after: dict) -> tuple[list[str], list[str]]:
    """(what grew or was left behind, notes that change no verdict)."""
    grew, notes = [], []
    start_s, end_s = rep["job"]["start_s"], rep["job"]["end_s"]
    for p in rep["processes"]:
        if (p["exit_after_sigterm_s"] or 0) >= SLOW_EXIT_S:
            notes.append(f"{p['label']} (pid {p['pid']}) exited {p['exit_after_sigterm_s']:.1f} s "
                         f"after the job's SIGTERM: it did not unwind promptly")
        if p["last_s"] < start_s:
            continue          # a helper that came and went before judging began
        if p["first_s"] > start_s or p["last_s"] < end_s:
            what = "started after warm-up" if p["first_s"] > start_s else "exited during the soak"
            (grew if p["rank"] is not None or p["label"] == "ltp train" else notes).append(
                f"{p['label']} (pid {p['pid']}) {what}")
            continue
        r, f = p["rss_kb"], p["fds"]
        if p["rss_growth_pct"] > RSS_GROWTH_LIMIT_PCT:
            grew.append(f"{p['label']} RSS +{p['rss_growth_pct']:.1f} % "
                        f"({r['start'] / 1024:.0f} -> {r['end'] / 1024:.0f} MiB)")
        if f["max"] != f["start"] or f["min"] != f["start"]:
            grew.append(f"{p['label']} fds {f['start']} -> {f['end']} (range {f['min']}-{f['max']})")
    for key, what in (("job_progs", "the job's BPF programs"), ("job_maps", "the job's BPF maps")):
        s = rep["bpf"][key]
        if s["max"] != s["start"] or s["min"] != s["start"]:
            grew.append(f"{what} {s['start']} -> {s['end']} (range {s['min']}-{s['max']})")
    s = rep["records"]["job_records"]
    if s["max"] != s["start"] or s["min"] != s["start"]:
        grew.append(f"the job's LTP records {s['start']} -> {s['end']}")
    left = rep["leftovers"]
    for key, what in (("progs", "BPF programs"), ("maps", "BPF maps"), ("records", "LTP records"),
                      ("processes", "processes")):
        if left[key]:
            grew.append(f"left behind after the job: {len(left[key])} {what} "
                        f"({', '.join(map(str, left[key][:6]))})")
    if left["rig"]:
        grew.append(f"left behind after the job: rig {rep['config']['rig']} (removed by the soak)")
    notes += [f"ltp train left its log folder {d} (kept for a run that did not finish)"
              for d in rep["leftovers"]["log_dirs"]]
    notes += _machine_notes(rep, rest, after)
    return grew, notes


def _machine_notes(rep: dict, rest: dict, after: dict) -> list[str]:
    """Why the machine's counts moved, when they did: whose objects they are."""
    notes = []
    for key, what in (("progs", "programs"), ("maps", "maps")):
        s = rep["bpf"][key]
        if s["min"] != s["start"] or s["max"] != s["start"]:
            notes.append(f"the machine's BPF {what} varied {s['min']}-{s['max']} while the "
                         f"job's stayed {rep['bpf']['job_' + key]['start']}: other processes")
    new_p = after["progs"] - rest["progs"] - set(rep["leftovers"]["progs"])
    new_m = after["maps"] - rest["maps"] - set(rep["leftovers"]["maps"])
    if new_p or new_m:
        held = procscan.holders(new_p, new_m)
        who = sorted({w for ws in held.values() for w in ws})
        notes.append(f"after the job the machine has {len(new_p)} programs and {len(new_m)} "
                     f"maps that were not there at rest and never the job's; "
                     f"{len(held)} of them held by {', '.join(who[:5]) or 'no process'}, the "
                     f"rest attached or pinned by others (the job's rig and records are gone)")
    gone = (len(rest["progs"] - after["progs"]), len(rest["maps"] - after["maps"]))
    if any(gone):
        notes.append(f"{gone[0]} programs and {gone[1]} maps present at rest were freed by "
                     f"others during the soak")
    return notes


def progress_line(p: dict, nranks: int) -> str:
    return (f"{p['t']:7.1f}s {p['phase']:<8} ranks {p['ranks']}/{nranks}  "
            f"rss {p['rss_kb'] / 1024:7.1f} MiB  fds {p['fds']:4d}  "
            f"job bpf {p['job_progs']} progs {p['job_maps']} maps  "
            f"machine {p['progs']} progs {p['maps']} maps  "
            f"records {p['job_records']}/{p['records']}")


def table(rep: dict) -> str:
    """The report as text: a line per process, then BPF and records."""
    c, j = rep["config"], rep["job"]
    lines = [f"ltp bench soak: {c['minutes']:g} min of ltp train, {c['workers']} workers, loss "
             f"{c['loss']:g}; ready at {j['ready_s']:.0f} s, judged from {j['start_s']:.0f} s "
             f"to {j['end_s']:.0f} s ({rep['samples_judged']} of {rep['samples']} samples); "
             f"stopped by {j['stopped_by']} in {j['stop_s']:.1f} s (exit {j['exit_code']})", "",
             f"{'process':<14} {'pid':>7} {'RSS MiB':>9} {'end':>7} {'max':>7} {'growth':>7} "
             f"{'fds':>5} {'end':>4} {'max':>4} {'exit s':>7}"]
    for p in rep["processes"]:
        if not p["samples_judged"]:
            continue
        r, f = p["rss_kb"], p["fds"]
        x = p["exit_after_sigterm_s"]
        lines.append(f"{p['label']:<14} {p['pid']:>7} {r['start'] / 1024:>9.1f} "
                     f"{r['end'] / 1024:>7.1f} {r['max'] / 1024:>7.1f} "
                     f"{p['rss_growth_pct']:>+6.2f}% {f['start']:>5} {f['end']:>4} "
                     f"{f['max']:>4} {'-' if x is None else format(x, '.1f'):>7}")
    lines += ["", f"{'':<24} {'rest':>6} {'start':>6} {'end':>6} {'max':>6} {'after':>6}"]
    rows = [("job BPF programs", rep["bpf"]["job_progs"]), ("job BPF maps", rep["bpf"]["job_maps"]),
            ("machine BPF programs", rep["bpf"]["progs"]), ("machine BPF maps", rep["bpf"]["maps"]),
            ("job LTP records", rep["records"]["job_records"]),
            ("machine LTP records", rep["records"]["records"])]
    lines += [f"{name:<24} {s['rest']:>6} {s['start']:>6} {s['end']:>6} {s['max']:>6} "
              f"{s['after']:>6}" for name, s in rows]
    lines += [""] + [f"note: {n}" for n in rep["notes"]]
    lines.append("flat: RSS growth <= 5 %, fds and BPF objects constant, nothing left behind"
                 if rep["flat"] else "NOT flat: " + "; ".join(rep["grew"]))
    return "\n".join(lines)
