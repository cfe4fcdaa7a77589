# SPDX-License-Identifier: Apache-2.0
"""A job's timeline as a Chrome trace-event file (Perfetto's JSON importer,
chrome://tracing), and the per-worker table `ltp trace summary` prints.

Every rank keeps its latest records in a ring (`Timeline`, RING of them: a
bounded cost however long the job runs): a server one per uplink round it
gathered (`round_record`: open and close, reason, and per worker the first,
last and threshold chunk's arrival at its NIC with the round's straggler
attribution) and one per answer it sent; a worker one per op (`OpRecord`:
its barrier, each piece's push, the answer's pull). Times are
CLOCK_MONOTONIC ns (`perf_counter_ns`, and the XDP program's
bpf_ktime_get_ns): one clock on one host, which is what a rig is. Across
hosts the clocks differ by their offset; nothing here aligns them.

`chrome_trace` lays them out: a process per server (SERVER_PID + s) with a
track per round bank ("rounds, bank b"), one for answers and one per worker
("NIC: worker w": its chunks as a slice from the first arrival to the last,
and both as instants); a process per worker (WORKER_PID + w) with tracks
for its barrier, pushes and answers. A flow arrow links each push to its
chunks at the server's NIC. Rounds carry their attribution in args, which
`summarize` reads back.
"""
from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import asdict, dataclass, field

import numpy as np

from ...dataplane import files
from ..transport.straggler import WAITED_REASONS

RING = 4096            # records a rank keeps (the trace holds its latest RING rounds/ops)
SERVER_PID, WORKER_PID = 1, 1001
BANKS = 2              # a round r lives in bank r % 2 (its slices never overlap there)
T_ANSWERS, T_NIC = 2, 10              # server tracks: answers; NIC: worker w at T_NIC + w
T_BARRIER, T_PUSH, T_PULL = 0, 1, 2   # worker tracks


class Timeline:
    """A rank's ring of its latest records (dicts)."""

    def __init__(self, n: int = RING):
        self.ring: deque = deque(maxlen=n)

    def add(self, rec) -> None:
        if rec is not None:
            self.ring.append(rec)

    def records(self) -> list[dict]:
        return [r if isinstance(r, dict) else r.to_dict() for r in self.ring]


def round_record(r: int, op: int, kind: str, g) -> dict | None:
    """A server's record of gathered round r of op `op` (links.Gathered);
    None without arrival times (TCP)."""
    a, att = g.arrivals, g.attribution
    if a is None:
        return None
    late = att.lateness if att is not None else {}
    return {"round": r, "op": op, "kind": kind, "reason": g.reason,
            "open_ns": a.open_ns, "close_ns": a.close_ns, "workers": list(g.workers),
            "first_ns": a.first_ns.tolist(), "last_ns": a.last_ns.tolist(),
            "thresh_ns": a.thresh_ns.tolist(),
            "critical": att.critical if att is not None else None,
            "cause": att.cause if att is not None else "",
            "lateness_s": [late.get(w) for w in g.workers]}


def answer_record(op: int, t0_ns: int, t1_ns: int, policy: dict | None = None) -> dict:
    """An answer sent; a step's with the loss policy's choice (Choice.to_dict)."""
    rec = {"answer": op, "t0_ns": t0_ns, "t1_ns": t1_ns}
    if policy is not None:
        rec["loss_policy"] = policy
    return rec


@dataclass
class OpRecord:
    """A worker's view of one op: its barrier (arrived, lifted; whether it
    arrived last; its own time before arriving and what that held aside:
    exchange.Arrival), its pushes (round, start, end) and the answer's pull."""

    op: int
    kind: str
    arrive_ns: int = 0
    lift_ns: int = 0
    wait_ns: int = 0           # its wait for the go (Arrival.wait_s): arrive_ns..lift_ns
                               # less its own arrival's store calls
    last: bool = False
    own_ns: int = 0
    cpu_wait_ns: int = 0
    aside: str = ""
    pushes: list = field(default_factory=list)
    pull: tuple = ()

    def to_dict(self) -> dict:
        return asdict(self)


def now_ns() -> int:
    return time.perf_counter_ns()


def _us(ns: int) -> float:
    return ns / 1e3


def _meta(pid: int, tid: int, what: str, name: str) -> dict:
    return {"ph": "M", "name": what, "pid": pid, "tid": tid, "ts": 0, "args": {"name": name}}


def _x(name: str, pid: int, tid: int, t0: int, t1: int, cat: str, args=None) -> dict:
    ev = {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": _us(t0),
          "dur": max(0.0, _us(t1) - _us(t0))}
    if args:
        ev["args"] = args
    return ev


def _server_events(s: int, recs: list[dict]) -> tuple[list[dict], dict]:
    """Server s's events, and where each (round, worker)'s chunks began at its
    NIC (pid, tid, ns): the flows' ends."""
    pid, ev, ends, workers = SERVER_PID + s, [], {}, set()
    ev.append(_meta(pid, 0, "process_name", f"server {s}"))
    for b in range(BANKS):
        ev.append(_meta(pid, b, "thread_name", f"rounds, bank {b}"))
    ev.append(_meta(pid, T_ANSWERS, "thread_name", "answers"))
    for r in recs:
        if "answer" in r:
            ev.append(_x(f"answer {r['answer']}", pid, T_ANSWERS, r["t0_ns"], r["t1_ns"],
                         "answer", {"loss_policy": r["loss_policy"]}
                         if "loss_policy" in r else None))
            continue
        late = {str(w): round(v * 1e3, 3) for w, v in zip(r["workers"], r["lateness_s"])
                if v is not None}
        ev.append(_x(f"round {r['round']}", pid, r["round"] % BANKS, r["open_ns"],
                     r["close_ns"], "round",
                     {"op": r["op"], "kind": r["kind"], "reason": r["reason"],
                      "straggler": r["critical"], "cause": r["cause"], "lateness_ms": late}))
        for w, f, last, th in zip(r["workers"], r["first_ns"], r["last_ns"], r["thresh_ns"]):
            if not f:
                continue
            workers.add(w)
            tid = T_NIC + w
            named = " (straggler)" if r["critical"] == w else ""
            ev.append(_x(f"w{w} round {r['round']}{named}", pid, tid, f, max(f, last), "nic",
                         {"round": r["round"], "thresh_ms": round((th - f) / 1e6, 3)
                          if th else None}))
            ev.append({"ph": "i", "s": "t", "name": "first chunk", "cat": "nic", "pid": pid,
                       "tid": tid, "ts": _us(f)})
            if last and last != f:
                ev.append({"ph": "i", "s": "t", "name": "last chunk", "cat": "nic", "pid": pid,
                           "tid": tid, "ts": _us(last)})
            ends[(r["round"], w)] = (pid, tid, f)
    ev += [_meta(pid, T_NIC + w, "thread_name", f"NIC: worker {w}") for w in sorted(workers)]
    return ev, ends


def _worker_events(w: int, recs: list[dict], ends: dict) -> list[dict]:
    pid = WORKER_PID + w
    ev = [_meta(pid, 0, "process_name", f"worker {w}"),
          _meta(pid, T_BARRIER, "thread_name", "barrier"),
          _meta(pid, T_PUSH, "thread_name", "push"), _meta(pid, T_PULL, "thread_name", "answer")]
    for o in recs:
        if o["arrive_ns"] and o["lift_ns"]:
            args = {"op": o["op"], "last": o["last"]}
            if o.get("wait_ns"):
                args["wait_ms"] = round(o["wait_ns"] / 1e6, 3)
            if o.get("own_ns"):
                args["own_ms"] = round(o["own_ns"] / 1e6, 3)
                args["cpu_wait_ms"] = round(o.get("cpu_wait_ns", 0) / 1e6, 3)
            if o.get("aside"):
                args["aside"] = o["aside"]
            ev.append(_x(f"barrier {o['op']}", pid, T_BARRIER, o["arrive_ns"], o["lift_ns"],
                         "barrier", args))
        for r, t0, t1 in o["pushes"]:
            ev.append(_x(f"push {r}", pid, T_PUSH, t0, t1, "push", {"op": o["op"], "round": r}))
            end = ends.get((r, w))
            if end is not None:     # an arrow from the push to its chunks at the NIC
                fid = r * 65536 + w
                ev.append({"ph": "s", "name": "push", "cat": "flow", "id": fid, "pid": pid,
                           "tid": T_PUSH, "ts": _us(t0)})
                ev.append({"ph": "f", "bp": "e", "name": "push", "cat": "flow", "id": fid,
                           "pid": end[0], "tid": end[1], "ts": _us(max(end[2], t0))})
        if o["pull"]:
            ev.append(_x(f"answer {o['op']}", pid, T_PULL, o["pull"][0], o["pull"][1], "answer",
                         {"op": o["op"]}))
    return ev


def chrome_trace(servers: dict[int, list[dict]], workers: dict[int, list[dict]],
                 meta: dict | None = None) -> dict:
    """The trace-event JSON object of the servers' and workers' records
    (server/worker id -> its records), events sorted by time."""
    events, ends = [], {}
    for s, recs in sorted(servers.items()):
        ev, e = _server_events(s, recs)
        events += ev
        ends.update(e)
    for w, recs in sorted(workers.items()):
        events += _worker_events(w, recs, ends)
    events.sort(key=lambda e: (e["ts"], e["ph"] != "M"))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"clock": "CLOCK_MONOTONIC", **clock_pair(), **(meta or {})}}


def clock_pair() -> dict:
    """CLOCK_REALTIME minus CLOCK_MONOTONIC now (ns): what `merge` adds to a
    monotonic timestamp to put it on a wall-clock trace's time base."""
    m0 = time.perf_counter_ns()
    wall = time.time_ns()
    m1 = time.perf_counter_ns()
    return {"realtime_minus_monotonic_ns": wall - (m0 + m1) // 2}


def write(path: str, trace: dict) -> None:
    """Write a trace file atomically (a temporary file renamed over it)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with files.create(tmp, binary=False) as f:      # 0600, never through a symlink
        json.dump(trace, f, separators=(",", ":"))
    os.replace(tmp, path)


def rank_trace(servers: dict[int, list], workers: dict[int, list]) -> dict:
    """One rank's trace: its events, and its records in otherData.ltp_records,
    from which `merge_ranks` rebuilds the job's (flows included)."""
    return chrome_trace(servers, workers, {"ltp_records": {"servers": servers,
                                                          "workers": workers}})


def merge_ranks(paths: list[str], meta: dict | None = None) -> tuple[dict, list[str]]:
    """The job's trace from its ranks' files (`rank_trace`); the files skipped
    (unreadable, or no records in them)."""
    servers, workers, skipped = {}, {}, []
    for p in sorted(paths):
        try:
            with open(p) as f:
                recs = json.load(f)["otherData"]["ltp_records"]
        except (OSError, ValueError, KeyError, TypeError):
            skipped.append(p)
            continue
        servers.update({int(k): v for k, v in recs.get("servers", {}).items()})
        workers.update({int(k): v for k, v in recs.get("workers", {}).items()})
    return chrome_trace(servers, workers, meta), skipped


def merge(a: dict, b: dict, offset_us: float | None = None) -> tuple[dict, float, str]:
    """Trace b's events beside trace a's, b's timestamps shifted by offset_us
    onto a's time base; the merged trace, the offset used and how it was
    found. Without offset_us: an LTP trace a (CLOCK_MONOTONIC, its
    otherData's realtime_minus_monotonic_ns) and a torch.profiler trace b
    (its ts are microseconds after its baseTimeNanoseconds, a wall-clock
    time) are aligned through the wall clock; any other b is taken to be on
    a's clock already. b's pids that a uses move up by 1,000,000 (or get a "b:" prefix), and its
    flow ids become "b:<id>", so the two never mix."""
    base, mono = b.get("baseTimeNanoseconds"), (a.get("otherData") or {}).get(
        "realtime_minus_monotonic_ns")
    if offset_us is not None:
        how = "given"
    elif base is not None and mono is not None:
        offset_us, how = (int(base) - int(mono)) / 1e3, "wall clock (baseTimeNanoseconds)"
    else:
        offset_us, how = 0.0, "same clock (none given, none found)"
    pids = {e.get("pid") for e in a.get("traceEvents", [])}
    moved = {p for p in {e.get("pid") for e in b.get("traceEvents", [])} if p in pids}
    events = list(a.get("traceEvents", []))
    for e in b.get("traceEvents", []):
        e = dict(e)
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] = e["ts"] + offset_us
        if e.get("pid") in moved:
            e["pid"] = e["pid"] + 1_000_000 if isinstance(e["pid"], int) else f"b:{e['pid']}"
        if e.get("ph") in ("s", "t", "f") and "id" in e:
            e["id"] = f"b:{e['id']}"
        events.append(e)
    events.sort(key=lambda e: (e.get("ts", 0), e.get("ph") != "M"))
    other = {**(a.get("otherData") or {}), "merged": {"offset_us": offset_us, "how": how,
                                                      "pids_moved": sorted(moved, key=str)}}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}, offset_us, how


def summarize(trace: dict) -> dict:
    """What a trace says of who the job waited for: per worker how many rounds
    the server named it straggler and its lateness at the NIC (ms) p50 and
    p99; per step op the worker its rounds named most (`nic`); and each
    worker's barrier notes (`notes`: the ops it arrived last at, its waits
    in ms), from which control/training/straggler_report.attribute_steps names each
    step as `ltp train -j` does; `nic_late`: per op the lateness (s) of the
    worker `nic` names."""
    events = trace.get("traceEvents", [])
    rounds = [e for e in events if e.get("cat") == "round"]
    named: dict[str, int] = {}
    late: dict[str, list[float]] = {}
    per_op: dict[int, dict[int, int]] = {}
    op_late: dict[tuple[int, str], list[float]] = {}     # (op, worker) -> its lateness, ms
    waited: set[int] = set()       # ops a round of which its deadline or timeout cut
    for e in rounds:
        a = e.get("args", {})
        if a.get("kind") == "step" and a.get("straggler") is not None:
            k = str(a["straggler"])
            named[k] = named.get(k, 0) + 1
            op = per_op.setdefault(int(a["op"]), {})
            op[a["straggler"]] = op.get(a["straggler"], 0) + 1
        if a.get("kind") == "step" and a.get("reason") in WAITED_REASONS:
            waited.add(int(a["op"]))      # cut by its deadline: the step waited (as -j reads)
        for w, v in (a.get("lateness_ms") or {}).items():
            late.setdefault(w, []).append(v)
            if a.get("kind") == "step" and v is not None:
                op_late.setdefault((int(a["op"]), w), []).append(v)
    steps = sorted({int(e["args"]["op"]) for e in rounds if e.get("args", {}).get("kind") == "step"})
    notes: dict[int, dict] = {}
    for e in events:
        if e.get("cat") == "barrier" and int(e["args"]["op"]) in steps:
            a, op = e["args"], int(e["args"]["op"])
            n = notes.setdefault(e["pid"] - WORKER_PID,
                                 {"last": [], "waited_ms": {}, "own_ms": {}, "aside": []})
            if a["last"]:
                n["last"].append(op)
            else:       # as the worker's notes have it (Arrival.wait_s), else the slice
                n["waited_ms"][str(op)] = a.get("wait_ms", e["dur"] / 1e3)
            if "own_ms" in a:
                n["own_ms"][str(op)] = a["own_ms"]
            if a.get("aside"):
                n["aside"].append(op)
    spans = [e["ts"] for e in rounds if e.get("args", {}).get("kind") == "step"]
    step_s = (max(spans) - min(spans)) / 1e6 / max(1, len(steps) - 1) if len(spans) > 1 else 0.0

    def pct(v, q):
        return round(float(np.percentile(v, q)), 3) if v else None
    workers = sorted(set(named) | set(late) | {str(w) for w in notes}, key=int)
    # the worker named in most of the op's rounds, ties to the larger summed
    # lateness (as StepStragglers.straggler)
    nic = {op: max(c, key=lambda w, c=c, op=op: (c[w], sum(op_late.get((op, str(w)), [])),
                                                  -int(w)))
           for op, c in per_op.items()}
    # the named worker's lateness in its step: the mean over the step's rounds (as a report's)
    # (a round cut by its deadline waited for it: past any margin)
    nic_late = {op: float("inf") if op in waited else float(np.mean(op_late[op, str(w)])) / 1e3
                for op, w in nic.items() if op in waited or (op, str(w)) in op_late}
    return {"rounds": len(rounds), "steps": steps, "step_s": step_s,
            "workers": {w: {"nic_rounds": named.get(w, 0), "lateness_p50_ms": pct(late.get(w), 50),
                            "lateness_p99_ms": pct(late.get(w), 99)} for w in workers},
            "nic": nic, "nic_late": nic_late, "notes": notes}


def problems(trace: dict) -> list[str]:
    """What keeps a trace from being a well-formed trace-event file (empty:
    none): every event has ph, ts, pid, tid and name; an X slice a duration;
    timestamps never go back on a track; B/E pairs match per track; a flow's
    start and finish come in pairs."""
    out, last, open_b, flows = [], {}, {}, {}
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return ["no traceEvents list"]
    for i, e in enumerate(events):
        miss = [k for k in ("ph", "ts", "pid", "tid", "name") if k not in e]
        if miss:
            out.append(f"event {i} lacks {', '.join(miss)}")
            continue
        track = (e["pid"], e["tid"])
        if e["ts"] < last.get(track, float("-inf")):
            out.append(f"event {i} ({e['name']}) goes back in time on track {track}")
        last[track] = e["ts"]
        ph = e["ph"]
        if ph == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
            out.append(f"event {i} ({e['name']}): an X slice without a duration")
        elif ph == "B":
            open_b[track] = open_b.get(track, 0) + 1
        elif ph == "E":
            open_b[track] = open_b.get(track, 0) - 1
            if open_b[track] < 0:
                out.append(f"event {i}: E without its B on track {track}")
        elif ph in ("s", "f"):
            flows.setdefault(e.get("id"), []).append(ph)
    out += [f"track {t}: {n} B without E" for t, n in open_b.items() if n > 0]
    out += [f"flow {k}: {v}" for k, v in flows.items() if sorted(v) != ["f", "s"]]
    return out
