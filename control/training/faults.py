# SPDX-License-Identifier: Apache-2.0
"""Fault injection and restart policies for jobs on a rig: `ltp train --kill
ROLE:ID@ITER --restart`, `ltp launch --max-restarts N`.

`--kill worker:2@10` kills worker 2's process (SIGKILL: no unwinding, as a
crash or an OOM kill would) once the lead reports iteration 10;
`--kill server:0@20` kills the server rank. Repeatable; each fires once.

What the launcher does about a rank that died (killed here or not), with a
limit of N restarts (`RestartPolicy`: `ltp train --restart` is N =
MAX_RESTARTS, `ltp launch --max-restarts N`):
  worker, restarts left  start it again in its namespace with the same
                      environment (at most N times per rank): it finds the
                      job running and rejoins (torchapi/elastic.py)
  worker, killed here, none left  the job goes on without it (the server
                      drops it after --max-missed steps)
  server, restarts left  the whole job is started again (the server's death
                      ends every rank's job; at most N times per job); a
                      script that resumes from a checkpoint (--checkpoint-dir)
                      goes on from there
  any rank, whole_job (sharded jobs: a worker cannot rejoin one), restarts
                      left   the whole job is started again, as for a server
  otherwise           the job fails
A worker that fails after a server rank exited 0 (the job is over) is a
failure: there is no job left to rejoin.
"""
from __future__ import annotations

import re
import signal
import time
from dataclasses import dataclass, field
from collections.abc import Callable

MAX_RESTARTS = 3        # `ltp train --restart`: per rank, and of the whole job
KILL_RE = re.compile(r"^(worker|server):(\d+)@(\d+)$")


class RestartJob(Exception):
    """Every rank must start again (a server died, or any rank of a sharded
    job), and a restart was left."""


@dataclass
class Kill:
    role: str        # worker | server
    id: int          # worker id, or server index
    at: int          # iteration (the lead's count) at which it fires
    fired_at: float | None = None

    def to_dict(self) -> dict:
        return {"role": self.role, "id": self.id, "at": self.at,
                "fired": self.fired_at is not None}


def parse_kills(items: list[str] | None, workers: int, servers: int = 1) -> list[Kill]:
    """['worker:2@10', 'server:0@20'] -> Kills; ValueError names the bad item."""
    out = []
    for item in items or []:
        m = KILL_RE.match(item.strip())
        if not m:
            raise ValueError(f"--kill: {item!r} is not ROLE:ID@ITER (worker:2@10, server:0@20)")
        role, ident, at = m.group(1), int(m.group(2)), int(m.group(3))
        limit = workers if role == "worker" else servers
        if ident >= limit:
            raise ValueError(f"--kill: {item!r}: no {role} {ident} (0..{limit - 1})")
        if at < 1:
            raise ValueError(f"--kill: {item!r}: the iteration must be at least 1")
        out.append(Kill(role, ident, at))
    return out


def describe_exit(code: int) -> str:
    """A rank's exit status for a line: 1 -> '1', -9 -> '-9 (killed)'."""
    if code >= 0:
        return str(code)
    try:
        name = signal.strsignal(-code)
    except ValueError:
        name = None
    return f"{code} ({name.lower()})" if name else str(code)


@dataclass
class RestartPolicy:
    """What happens to a rank that died (see the module docstring). `say`
    gets one line per decision (a restart, or none left); `expected` holds
    ranks killed on purpose, which the job may go on without."""

    limit: int = 0                  # restarts per worker rank, and of the whole job
    whole_job: bool = False         # any rank's death restarts every rank (sharded jobs)
    say: Callable[[str], None] | None = None
    restarts: dict[int, int] = field(default_factory=dict)   # rank -> times restarted
    job_restarts: int = 0
    expected: set[int] = field(default_factory=set)

    def settle(self, job) -> list:
        """Deal with the ranks of `job` (a launch.RigJob) that died since the
        last look: restart them (job.respawn), let them go (`settled`), or
        return them: the failures of the job (the caller fails it).
        RestartJob when every rank must start again."""
        failed = []
        over = any(r.role == "server" and r.code == 0 for r in job.ranks)
        for r in job.ranks:
            if r.code is None or r.code == 0 or r.killed or r.settled:
                continue
            ours = r.rank in self.expected
            self.expected.discard(r.rank)
            what = f"{r.role} {r.index} exited {describe_exit(r.code)}"
            if over:   # a server finished the job: nothing is started again
                if ours:
                    r.settled = True
                else:
                    self.note_spent(what, "", True)
                    failed.append(r)
            elif r.role == "server" or self.whole_job:
                if self.job_restarts < self.limit:
                    self.job_restarts += 1
                    self.note(f"{what}; restarting every rank ({self.job_restarts} of "
                              f"{self.limit})")
                    raise RestartJob()
                self.note_spent(what, "job ")
                failed.append(r)
            elif self.restarts.get(r.rank, 0) < self.limit:
                n = self.restarts[r.rank] = self.restarts.get(r.rank, 0) + 1
                self.note(f"{what}; restarting ({n} of {self.limit})")
                job.respawn(r)
            elif ours:
                r.settled = True      # killed on purpose: the job goes on without it
            else:
                self.note_spent(what, "")
                failed.append(r)
        return failed

    def note(self, text: str) -> None:
        if self.say is not None:
            self.say(text)

    def note_spent(self, what: str, kind: str, over: bool = False) -> None:
        if self.limit:
            self.note(f"{what}; not restarting (" + (
                "the job is over" if over else f"all {self.limit} {kind}restarts used") + ")")

    def report(self) -> dict:
        return {"max_restarts": self.limit,
                "restarts": {str(k): v for k, v in sorted(self.restarts.items())},
                "job_restarts": self.job_restarts}


@dataclass
class Faults:
    """The kills to fire and the restart policy, for one `ltp train` run."""

    kills: list[Kill]
    restart: bool = False
    servers: int = 1
    policy: RestartPolicy = field(init=False)

    def __post_init__(self) -> None:
        # a worker cannot rejoin a sharded job: any death there restarts every rank
        self.policy = RestartPolicy(MAX_RESTARTS if self.restart else 0,
                                    whole_job=self.servers > 1)

    def rank_of(self, k: Kill) -> int:
        return k.id if k.role == "server" else self.servers + k.id

    def on_event(self, job, ev: dict) -> None:
        """The lead's event: fire the kills due at its iteration."""
        if ev.get("event") != "iter":
            return
        for k in self.kills:
            if k.fired_at is None and ev.get("t", 0) >= k.at:
                r = job.ranks[self.rank_of(k)]
                if r.proc is not None and r.proc.poll() is None:
                    r.proc.kill()
                    self.policy.expected.add(r.rank)
                k.fired_at = time.monotonic()

    def settle(self, job) -> list:
        """RestartPolicy.settle: the ranks that died since the last look."""
        return self.policy.settle(job)

    def report(self) -> dict:
        """The kills, and the restarts keyed by worker id, as `workers_lost`
        and `rejoined_at` are (server ranks are restarted only as a job)."""
        return {"kills": [k.to_dict() for k in self.kills], "restart": self.restart,
                "worker_restarts": {str(r - self.servers): n
                                    for r, n in sorted(self.policy.restarts.items())
                                    if r >= self.servers},
                "job_restarts": self.policy.job_restarts}


def fault_lines(label: str, res: dict) -> list[str]:
    """What happened to the job's members, for `ltp train`'s text output:
    the kills fired, who was lost and at which step, who rejoined, the
    restarts. Empty for a run where nothing happened."""
    f = res.get("faults") or {}
    out = [f"killed {k['role']} {k['id']} at iteration {k['at']}"
           for k in f.get("kills", []) if k.get("fired")]
    lost, back = res.get("lost_at") or {}, res.get("rejoined_at") or {}
    dropped = res.get("dropped_at") or {}
    for w in sorted({*lost, *dropped, *back}, key=int):
        what = [f"lost at step {lost[w]}"] if w in lost else []
        what += [f"dropped at step {dropped[w]}"] if w in dropped else []
        what += [f"rejoined at step {back[w]}"] if w in back else ["did not rejoin"]
        out.append(f"worker {w} " + ", ".join(what))
    for w, n in (f.get("worker_restarts") or {}).items():
        out.append(f"worker {w} restarted {n} time{'s' if n != 1 else ''}")
    if f.get("job_restarts"):
        out.append(f"every rank restarted {f['job_restarts']} time(s)")
    return [f"{label}: {line}" for line in out]
