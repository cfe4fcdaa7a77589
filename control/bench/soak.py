# SPDX-License-Identifier: Apache-2.0
"""`ltp bench soak`: run a training job for minutes and check that what it
holds stays flat: memory, file descriptors, BPF objects, LTP records.

The job is `ltp train` at the asked loss, started as a command and read only
from outside (procscan: /proc and the kernel's BPF id spaces), so the soak
measures the training code without depending on its internals. It is given
far more iterations than it can run and is stopped with SIGTERM when the
minutes are over (no restarts: an early exit is an error naming its code),
so one job covers the whole soak and its own unwinding is part of what is
checked. Its processes are the `ltp train` process and its descendants; the
ranks are those with an LTP_RANK (or RANK) in their environment.

Every `sample_s` each process's RSS and open fds, the BPF programs and maps
the job holds (the ids its fds name, and the maps of those programs), the
machine's BPF program and map counts, and the LTP records (`registry.status`)
are read. The job is ready when every rank holds a BPF object; judging starts
at the first sample `warmup_s` after that ("start"). Flat means: no process
grew its RSS by more than 5 % from start to end, no fd count and none of the
job's BPF counts changed after start, and after the job ended nothing it held
is alive, its rig, records and processes are gone. The machine's counts are
reported; other engineers' jobs move them too, so a difference is judged by
who holds the objects (procscan.holders), not by the count alone.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ...dataplane import clib
from ...dataplane.rig import signals
from ...dataplane.rig.star import Rig
from ...dataplane.xdp import registry
from ...errors import BenchError
from . import procscan
from .soak_report import RSS_GROWTH_LIMIT_PCT, growth, judge, process_figures, progress_line, stats

STOP_GRACE_S = 60.0        # SIGTERM to SIGKILL: the job detaches its programs, removes its rig
SETTLE_S = 10.0            # the kernel frees a closed program or map a little later
ITERATIONS_PER_S_BOUND = 1000   # far above what the job runs: it never finishes on its own


@dataclass
class SoakConfig:
    minutes: float
    workers: int = 4
    loss: float = 0.05
    sample_s: float = 10.0
    warmup_s: float | None = None     # default: 10 % of the soak, at most 60 s
    name: str = ""

    def __post_init__(self) -> None:
        if self.warmup_s is None:
            self.warmup_s = min(60.0, self.minutes * 6.0)
        self.name = self.name or f"soak{os.getpid() % 100000}"

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0

    def train_argv(self) -> list[str]:
        iterations = max(100_000, int(self.seconds * ITERATIONS_PER_S_BOUND))
        return [sys.executable, "-m", "ltpx.tools.cli", "train", "--workers", str(self.workers),
                "--loss", repr(self.loss), "--iterations", str(iterations), "--name", self.name,
                "--timeout", str(int(self.seconds + STOP_GRACE_S + 600)), "-j"]


@dataclass
class Track:
    """One process of the job over the soak: (t, rss_kb, fds) per sample."""

    label: str
    pid: int
    rank: int | None
    start: int                      # its start time: a reused pid is another process
    points: list[tuple[float, int, int]] = field(default_factory=list)
    exit_s: float | None = None     # seconds from the job's SIGTERM to its exit


class Soak:
    """One soak: start the job, sample it, stop it, look at what is left."""

    def __init__(self, cfg: SoakConfig, say: Callable[[str], None] | None = None):
        self.cfg, self.say = cfg, say or (lambda m: None)
        self.prefix = f"ltp-{cfg.name}-"          # the rig's namespaces (star_plan)
        self.job: subprocess.Popen | None = None
        self.log = tempfile.TemporaryFile()
        self.tracks: dict[tuple[int, int], Track] = {}
        self.series: list[dict] = []
        self.ever_progs: set[int] = set()
        self.ever_maps: set[int] = set()
        self.ready_s: float | None = None
        self.stopped_by = None
        self.stop_s: float | None = None     # SIGTERM to the job's exit
        self.t0 = 0.0

    # ---- running
    def run(self) -> dict:
        if Rig.exists(self.cfg.name):
            raise BenchError(f"rig {self.cfg.name} exists: the soak builds its own rig so that "
                             f"what is left after the job can be counted; choose another "
                             f"--name or remove it (ltp rig down --name {self.cfg.name})")
        rest = self._machine()
        try:
            self._start()
            self._loop()
            self._stop()
        finally:
            with signals.deferred_signals():   # a second Ctrl-C must not stop the clean-up
                left = self._cleanup()
        after = self._settle()
        self.log.close()
        return self._report(rest, after, left)

    def _start(self) -> None:
        clib.libc()                        # loaded before the fork: preexec only calls it
        self.t0 = time.monotonic()
        self.job = subprocess.Popen(
            self.cfg.train_argv(), stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
            start_new_session=True,        # Ctrl-C reaches the soak, which stops the job
            preexec_fn=lambda: clib.set_parent_death_signal(signal.SIGTERM))
        self.say(f"ltp train started (pid {self.job.pid}, rig {self.cfg.name}, "
                 f"{self.cfg.workers} workers, loss {self.cfg.loss:g}): "
                 f"{self.cfg.minutes:g} min, a sample every {self.cfg.sample_s:g} s")

    def _loop(self) -> None:
        k, end = 0, self.t0 + self.cfg.seconds
        while True:
            if self.job.poll() is not None:
                raise BenchError(f"ltp train exited by itself with code {self.job.returncode} "
                                 f"after {time.monotonic() - self.t0:.0f} s: {self._tail()}")
            self._sample(time.monotonic() - self.t0)
            k += 1
            nxt = self.t0 + k * self.cfg.sample_s
            if nxt >= end:
                time.sleep(max(0.0, end - time.monotonic()))
                self._sample(time.monotonic() - self.t0)
                return
            time.sleep(max(0.0, nxt - time.monotonic()))

    def _sample(self, t: float) -> None:
        t = round(t, 2)            # as reported: a sample at ready + warm-up is judged
        procs = [s for s in map(procscan.sample, procscan.descendants(self.job.pid)) if s]
        for s in procs:
            tr = self.tracks.get(s.key)
            if tr is None:
                tr = self.tracks[s.key] = Track(_label(s, self.job.pid), s.pid, s.rank, s.start)
            tr.points.append((t, s.rss_kb, s.fds))
        progs = set().union(*(s.progs for s in procs))
        maps = set().union(*(s.maps for s in procs)) | procscan.maps_of(progs)
        self.ever_progs |= progs
        self.ever_maps |= maps
        m = self._machine()
        ranks = [s for s in procs if s.rank is not None]
        if self.ready_s is None and len(ranks) == self.cfg.workers + 1 \
                and all(s.progs or s.maps for s in ranks):
            self.ready_s = t
        phase = ("starting" if self.ready_s is None else
                 "warm-up" if t < self.ready_s + self.cfg.warmup_s else "soak")
        point = {"t": t, "phase": phase, "processes": len(procs), "ranks": len(ranks),
                 "rss_kb": sum(s.rss_kb for s in procs), "fds": sum(s.fds for s in procs),
                 "job_progs": len(progs), "job_maps": len(maps),
                 "job_records": sum(r["netns"].startswith(self.prefix) for r in m["rows"]),
                 "progs": len(m["progs"]), "maps": len(m["maps"]), "records": len(m["rows"])}
        self.series.append(point)
        self.say(progress_line(point, self.cfg.workers + 1))

    def _machine(self) -> dict:
        progs, maps = procscan.machine_ids()
        return {"progs": progs, "maps": maps, "rows": registry.status()}

    # ---- stopping and what is left
    def _stop(self) -> None:
        self.say(f"{self.cfg.minutes:g} min over: SIGTERM to ltp train")
        self._terminate()

    def _terminate(self) -> None:
        """SIGTERM, SIGKILL after STOP_GRACE_S; notes when each process of
        the job exits (a rank that does not unwind shows here)."""
        if self.job is None or self.job.poll() is not None:
            return
        live = [tr for tr in self.tracks.values() if procscan.running(tr.pid, tr.start)]
        t = time.monotonic()
        self.job.send_signal(signal.SIGTERM)
        self.stopped_by = "SIGTERM"
        while self.job.poll() is None and time.monotonic() < t + STOP_GRACE_S:
            for tr in [tr for tr in live if not procscan.running(tr.pid, tr.start)]:
                tr.exit_s = round(time.monotonic() - t, 2)
                live.remove(tr)
            time.sleep(0.05)
        if self.job.poll() is None:
            self.job.kill()
            self.job.wait()
            self.stopped_by = "SIGKILL"
        self.stop_s = round(time.monotonic() - t, 2)
        for tr in live:
            tr.exit_s = tr.exit_s or self.stop_s

    def _cleanup(self) -> dict:
        """Stop the job if it still runs (Ctrl-C, an error), then note and
        remove what it left: live processes of its tree, its rig."""
        self._terminate()
        procs = [tr for tr in self.tracks.values() if procscan.running(tr.pid, tr.start)]
        for tr in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(tr.pid, signal.SIGKILL)
        rig = Rig.exists(self.cfg.name)
        if rig:
            Rig.destroy(self.cfg.name)
        return {"processes": [f"{tr.label} (pid {tr.pid})" for tr in procs], "rig": rig}

    def _settle(self) -> dict:
        """The machine once the job's objects are freed (or SETTLE_S passed)."""
        end = time.monotonic() + SETTLE_S
        while True:
            m = self._machine()
            mine = (m["progs"] & self.ever_progs or m["maps"] & self.ever_maps
                    or any(r["netns"].startswith(self.prefix) for r in m["rows"]))
            if not mine or time.monotonic() > end:
                return m
            time.sleep(0.2)

    def _tail(self, lines: int = 3) -> str:
        """What the job said last: its -j error object's message if it printed
        one, else its last lines without the progress bar."""
        self.log.seek(0)
        text = [ln.strip() for ln in self.log.read().decode(errors="replace").splitlines()
                if ln.strip()]
        for ln in reversed(text):
            if ln.startswith("{"):
                try:
                    msg = json.loads(ln)
                except ValueError:
                    continue
                if isinstance(msg, dict) and "error" in msg:
                    return str(msg["error"])
        return " | ".join([ln for ln in text if "\u2501" not in ln][-lines:])[-400:] \
            or "(no output)"

    # ---- the report
    def _report(self, rest: dict, after: dict, left: dict) -> dict:
        cfg = self.cfg
        if self.ready_s is None:
            raise BenchError(f"the job's {cfg.workers + 1} ranks never all held their BPF "
                             f"programs in {cfg.minutes:g} min: {self._tail()}")
        b = next((i for i, p in enumerate(self.series) if p["phase"] == "soak"), None)
        if b is None or b == len(self.series) - 1:
            raise BenchError(f"the job was ready at {self.ready_s:.0f} s; with --warmup-s "
                             f"{cfg.warmup_s:g} too few samples were left to judge: give "
                             f"--minutes more than {(self.ready_s + cfg.warmup_s) / 60 * 1.5:.1f}")
        judged = self.series[b:]
        t_start = judged[0]["t"]
        procs = [process_figures(tr, t_start) for tr in self.tracks.values()]
        leftovers = {
            "progs": sorted(after["progs"] & self.ever_progs),
            "maps": sorted(after["maps"] & self.ever_maps),
            "records": [f"{r['netns']}/{r['dev']}" for r in after["rows"]
                        if r["netns"].startswith(self.prefix)],
            "log_dirs": sorted(glob.glob(os.path.join(tempfile.gettempdir(),
                                                      f"ltp-train-{cfg.name}-*"))),
            **left}
        out = {
            "config": {"minutes": cfg.minutes, "workers": cfg.workers, "loss": cfg.loss,
                       "sample_s": cfg.sample_s, "warmup_s": cfg.warmup_s, "rig": cfg.name,
                       "rss_growth_limit_pct": RSS_GROWTH_LIMIT_PCT},
            "job": {"argv": cfg.train_argv()[1:], "pid": self.job.pid,
                    "exit_code": self.job.returncode, "stopped_by": self.stopped_by,
                    "stop_s": self.stop_s,
                    "restarts": 0, "ready_s": self.ready_s, "start_s": t_start,
                    "end_s": judged[-1]["t"]},
            "samples": len(self.series), "samples_judged": len(judged),
            "processes": procs,
            "rss_kb": stats([p["rss_kb"] for p in judged]),
            "fds": stats([p["fds"] for p in judged]),
            "bpf": {k: stats([p[k] for p in judged]) for k in ("job_progs", "job_maps",
                                                               "progs", "maps")},
            "records": {k: stats([p[k] for p in judged]) for k in ("job_records", "records")},
            "leftovers": leftovers,
            "series": self.series,
        }
        for k in ("progs", "maps"):
            out["bpf"][k].update(rest=len(rest[k]), after=len(after[k]))
            out["bpf"][f"job_{k}"].update(rest=0, after=len(leftovers[k]))
        out["records"]["records"].update(rest=len(rest["rows"]), after=len(after["rows"]))
        out["records"]["job_records"].update(rest=0, after=len(leftovers["records"]))
        out["rss_kb"]["growth_pct"] = growth(out["rss_kb"])
        out["grew"], out["notes"] = judge(out, rest, after)
        out["flat"] = not out["grew"]
        return out


def _label(s: procscan.ProcSample, root: int) -> str:
    if s.pid == root:
        return "ltp train"
    if s.rank is not None:
        return f"rank {s.rank}" + (" (ps)" if s.rank == 0 else f" (w{s.rank - 1})")
    return f"{s.comm} {s.pid}"


def run(cfg: SoakConfig, progress: Callable[[str], None] | None = None) -> dict:
    """One soak; SIGTERM to this process unwinds it like Ctrl-C (the job is stopped)."""
    with signals.sigterm_as_exit():
        return Soak(cfg, progress).run()
