# SPDX-License-Identifier: Apache-2.0
"""The launcher's half of the flight recorder (control/torchapi/flight.py):
who is slow, who is hung, in one screen (docs/slow-or-stuck.md).

`FlightWatch` makes the job's flight folder (LTP_FLIGHT_DIR for every rank;
the launcher's own LTP_FLIGHT_DIR if set, else a temporary one, removed at
the end when nothing was dumped there) and, at each pump of the launcher's
loop, looks for new dumps. A rank's stall dump (it waited past its stall
threshold) is a stall, not yet a hang: if that rank moves on within
LTP_HANG_S (HANG_S) of the dump, the stall is only counted (`stalls`,
summed up once at the end: `stall_summary`), with no screen; if it is
still in the same wait then, it is a hang. A hang, or a SIGUSR1's,
FilledWarning's or DeadPeerError's dump, makes a screen (a crash's dump
makes none: its traceback says it; nor does anything once a rank failed):
a line saying what triggered it, then one line per rank from its `.now`
file, which a stopped or hung process still has: the op and phase it is in
and for how long,
whom it waits for (a worker: its server; a server: the workers not yet at
the op, from their own files), the last packet it got from each peer and
its age, and its process's state (/proc: a SIGSTOPped rank is "STOPPED").
One screen per hang (the ranks' positions), and one per other dump. The
folder is removed at the end unless a screen was made or the caller keeps
it (a failed rank): a healthy run with stalls leaves nothing behind.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

from .. import flightfile as flight
from .. import settings_table

POLL_S = 0.05
# the dumps that make a screen: an exception's (a crash) makes none, as its
# rank's own traceback says what happened
SCREENED = ("stall", "SIGUSR1", "FilledWarning", "DeadPeerError")
# a stalled wait still the same this long after its dump is a hang (LTP_HANG_S)
HANG_S = settings_table.TABLE["hang_s"].default
STATES = {"R": "running", "S": "sleeping", "D": "in the kernel (D)", "T": "STOPPED",
          "t": "STOPPED (traced)", "Z": "exited (zombie)", "X": "gone"}


def proc_state(pid: int) -> str:
    """A process's state as /proc says it (STOPPED for a SIGSTOPped one)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return STATES.get(f.read().rsplit(")", 1)[1].split()[0], "?")
    except (OSError, IndexError):
        return "gone"


def _label(now: dict) -> str:
    return f"{'s' if now['role'] == 'server' else 'w'}{now['index']}"


def _age(t_ns: int, now_ns: int) -> str:
    return f"{(now_ns - t_ns) / 1e9:.2f} s"


class FlightWatch:
    """The job's flight folder, and the screens its dumps make."""

    def __init__(self):
        given = settings_table.env("flight_dir")
        self.own = not given
        self.folder = given or tempfile.mkdtemp(prefix="ltp-flight-")
        os.makedirs(self.folder, exist_ok=True)
        self.seen: dict[str, int] = {}       # dump file -> its mtime (ns) when read
        self.reported: set = set()
        self.screens: list[list[str]] = []
        self.next_poll = 0.0
        self.hang_s = hang_limit()
        self.quiet = False      # set once a rank failed: the ending job's waits are no hangs
        self.waiting: dict[int, tuple[float, dict]] = {}   # rank -> (seen at, its stall dump)
        self.stalls: list[dict] = []          # stalls that resolved: rank, op, waited_s, whom

    def env(self) -> dict[str, str]:
        return {flight.ENV_DIR: self.folder}

    def nows(self) -> dict[int, dict]:
        """Every rank's .now file: rank -> its fields."""
        out = {}
        for name in os.listdir(self.folder):
            if name.startswith("rank") and name.endswith(".now"):
                d = flight.read_now(os.path.join(self.folder, name))
                if d is not None:
                    out[d["rank"]] = d
        return out

    def new_dumps(self) -> list[dict]:
        out = []
        for e in os.scandir(self.folder):
            if not (e.name.startswith("rank") and e.name.endswith(".json")):
                continue
            m = e.stat().st_mtime_ns
            if self.seen.get(e.path) == m:
                continue
            self.seen[e.path] = m
            try:
                with open(e.path) as f:
                    out.append(json.load(f))
            except (OSError, ValueError):
                self.seen.pop(e.path, None)     # half there: read it next time
        return out

    def poll(self) -> list[str] | None:
        """A screen if a new dump, or a stall that became a hang, calls for
        one (at most every POLL_S)."""
        t = time.monotonic()
        if t < self.next_poll:
            return None
        self.next_poll = t + POLL_S
        dumps = []
        for d in self.new_dumps():
            if self.quiet or d.get("reason") not in SCREENED:
                continue        # a crash names itself in its traceback; a failed job is ending
            if d.get("reason") == "stall" and isinstance(d.get("rank"), int):
                self.waiting.setdefault(d["rank"], (t, d))
            else:
                dumps.append(d)
        if self.quiet or not dumps and not self.waiting:
            return None
        nows = self.nows()
        dumps += self.hung(nows, t)
        if not dumps:
            return None
        where = tuple(sorted((r, d["seq"], d["phase"]) for r, d in nows.items()))
        keys = {("stall", where) if d.get("reason") == "stall" else
                (d.get("rank"), d.get("reason"), d.get("t_ns")) for d in dumps}
        if keys <= self.reported:
            return None
        self.reported |= keys
        lines = self.screen(dumps[0], nows)
        self.screens.append(lines)
        return lines

    def hung(self, nows: dict[int, dict], t: float) -> list[dict]:
        """The stall dumps whose rank is still in the wait it dumped in,
        HANG_S after: hangs. One whose rank moved on is a stall that
        resolved: counted in `stalls`."""
        out = []
        for rank, (since, d) in list(self.waiting.items()):
            now, was = nows.get(rank), d.get("now", {})
            waited = was.get("for_s", 0.0) + (t - since)
            if now is None or (now["seq"], now["phase"]) != (was.get("seq"), was.get("phase")):
                del self.waiting[rank]
                whom = self.whom(now, nows) if now is not None and now["waits"] else None
                self.stalls.append({"rank": rank, "label": _dump_label(d), "op": was.get("seq"),
                                    "phase": was.get("phase"), "waited_s": round(waited, 3),
                                    "waiting_for": whom or _waits_for(d)})
            elif t - since >= self.hang_s:
                del self.waiting[rank]
                out.append(dict(d, detail=f"{d.get('detail', '')}; still waiting "
                                f"{waited:.2f} s in all (LTP_HANG_S={self.hang_s:g})"))
        return out

    def stall_summary(self) -> dict | None:
        """The stalls that resolved, in one record (None: there were none):
        how many, the longest (its rank, op, phase, what it waited for)."""
        if not self.stalls:
            return None
        top = max(self.stalls, key=lambda s: s["waited_s"])
        return {"count": len(self.stalls), "longest_s": top["waited_s"], "rank": top["label"],
                "op": top["op"], "phase": top["phase"], "waiting_for": top["waiting_for"]}

    def screen(self, dump: dict, nows: dict[int, dict]) -> list[str]:
        t = time.perf_counter_ns()
        med = dump.get("median_op_s")
        head = (f"{_dump_label(dump)} ({_torch_rank(dump)}): {dump.get('reason')}"
                + (f", {dump['detail']}" if dump.get("detail") else "")
                + (f"; median op {med:.3f} s" if med else "")
                + f"; flight records in {self.folder}")
        return [head] + [self.rank_line(nows[r], nows, t) for r in sorted(nows)]

    def rank_line(self, d: dict, nows: dict[int, dict], t: int) -> str:
        state = proc_state(d["pid"])
        rnd = f" round {d['round']}" if d["round"] >= 0 else ""
        if d["phase"] == "end":
            doing = f"ended after op {d['seq']}"
        elif state.startswith("STOPPED") or state == "gone":
            doing = f"{state.lower()} in op {d['seq']} {d['phase']}{rnd} (in it for " \
                    f"{_age(d['since_ns'], t)})"
        elif d["waits"]:
            doing = (f"waits in op {d['seq']} {d['phase']}{rnd} for {self.whom(d, nows)} "
                     f"for {_age(d['since_ns'], t)}")
        else:
            doing = f"in {d['phase']} after op {d['seq']} for {_age(d['since_ns'], t)}"
        if d["role"] == "worker":
            heard = (f"last packet from its server {_age(d['peers'][0], t)} ago"
                     if 0 in d["peers"] else "no answer from its server yet")
            seen = [_age(s["peers"][d["index"]], t) for s in nows.values()
                    if s["role"] == "server" and d["index"] in s["peers"]]
            if seen:
                heard += f"; its last packet reached the server {seen[0]} ago"
        else:
            heard = "last packet: " + (", ".join(f"w{p} {_age(v, t)}" for p, v in
                                                 sorted(d["peers"].items())) or "none yet")
        return f"{_label(d)} ({_torch_rank(d)}, pid {d['pid']}, {state}): {doing}; {heard}"

    def whom(self, d: dict, nows: dict[int, dict]) -> str:
        """Whom a waiting rank waits for: a worker its server; a server the
        workers whose files say they are not yet in op d['seq'] (or past
        its barrier when it gathers)."""
        if d["role"] == "worker":
            theirs = [self.whom(s, nows) for s in nows.values()
                      if s["role"] == "server" and s["waits"]]
            return "its server" + (f" (which waits for {theirs[0]})" if theirs else "")
        behind = []
        for w in sorted(nows.values(), key=lambda w: w["index"]):
            if w["role"] != "worker" or w["phase"] == "end":
                continue
            arrived = w["seq"] > d["seq"] or w["seq"] == d["seq"] and w["phase"] != "compute"
            pushing = w["seq"] > d["seq"] or w["seq"] == d["seq"] and w["phase"] in ("push",
                                                                                    "answer")
            if not (pushing if d["phase"] == "gather" else arrived):
                behind.append(_label(w))
        return ", ".join(behind) if behind else "the workers"

    def close(self, keep: bool = False) -> str | None:
        """Remove the folder if it is this launcher's and nothing went wrong:
        no screen was made (a hang, a SIGUSR1, an error) and the caller does
        not `keep` it (a failed rank); else its path (the dumps stay for a
        look). A run whose stalls all resolved leaves nothing."""
        for rank, (_, d) in list(self.waiting.items()):     # the job ended meanwhile
            was = d.get("now", {})
            self.stalls.append({"rank": rank, "label": _dump_label(d), "op": was.get("seq"),
                                "phase": was.get("phase"), "waited_s": was.get("for_s", 0.0),
                                "waiting_for": _waits_for(d)})
        self.waiting = {}
        dumped = any(n.endswith(".json") for n in os.listdir(self.folder)) \
            if os.path.isdir(self.folder) else False
        if self.own and not (dumped and (keep or self.screens)):
            shutil.rmtree(self.folder, ignore_errors=True)
            return None
        return self.folder if dumped or not self.own else None


def hang_limit(environ=None) -> float:
    """LTP_HANG_S, else HANG_S: how long after its stall dump a wait that
    has not moved is reported as a hang (a bad one: a UsageError naming it)."""
    return settings_table.env("hang_s", environ)


def _torch_rank(d: dict) -> str:
    """A rank as its script knows it: a worker's torch rank, or the server's index."""
    return f"{'server' if d.get('role') == 'server' else 'rank'} {d.get('index')}"


def _dump_label(d: dict) -> str:
    return f"{'s' if d.get('role') == 'server' else 'w'}{d.get('index')}"


def _waits_for(d: dict) -> str:
    """What a stall dump's own rank waited for, as its role says."""
    return "its server" if d.get("role") == "worker" else "the workers"
