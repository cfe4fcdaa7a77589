"""Fault injection and restarts for jobs on a rig: `ltp train --kill ROLE:ID@ITER --restart`.

`--kill worker:2@10` kills worker 2's process (SIGKILL: no unwinding, as a
crash or an OOM kill would) once the lead reports iteration 10;
`--kill server:0@20` kills the server rank. Repeatable; each fires once.

What the launcher does about a rank that died (killed here or not):
  worker, --restart   start it again in its namespace with the same
                      environment (at most MAX_RESTARTS times per rank): it
                      finds the job running and rejoins (torchapi/elastic.py)
  worker, killed here, no --restart   the job goes on without it (the server
                      drops it after --max-missed steps)
  server, --restart   the whole job is started again (the server's death
                      ends every rank's job); with --checkpoint-every it
                      resumes from worker 0's newest checkpoint
  otherwise           the job fails, as before
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

MAX_RESTARTS = 3        # per rank, and of the whole job
KILL_RE = re.compile(r"^(worker|server):(\d+)@(\d+)$")


class RestartJob(Exception):
    """The server died and --restart was given: start every rank again."""


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


@dataclass
class Faults:
    """The kills to fire and the restart policy, for one `ltp train` run."""

    kills: list[Kill]
    restart: bool = False
    servers: int = 1
    restarts: dict[int, int] = field(default_factory=dict)   # rank -> times restarted
    job_restarts: int = 0
    expected: set[int] = field(default_factory=set)         # ranks killed here, not yet back

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
                    self.expected.add(r.rank)
                k.fired_at = time.monotonic()

    def settle(self, job) -> list:
        """Deal with the ranks that died since the last look; the ones that are
        failures of the job (the caller fails it). RestartJob when the whole
        job must start again."""
        failed = []
        for r in job.ranks:
            if r.code is None or r.code == 0 or r.killed or getattr(r, "settled", False):
                continue
            ours = r.rank in self.expected
            self.expected.discard(r.rank)
            if r.role == "server":
                if self.restart and self.job_restarts < MAX_RESTARTS:
                    self.job_restarts += 1
                    raise RestartJob()
                failed.append(r)
            elif self.restart and self.restarts.get(r.rank, 0) < MAX_RESTARTS:
                self.restarts[r.rank] = self.restarts.get(r.rank, 0) + 1
                job.respawn(r)
            elif ours:
                r.settled = True      # killed on purpose: the job goes on without it
            else:
                failed.append(r)
        return failed

    def report(self) -> dict:
        return {"kills": [k.to_dict() for k in self.kills], "restart": self.restart,
                "worker_restarts": {str(k): v for k, v in self.restarts.items()},
                "job_restarts": self.job_restarts}
