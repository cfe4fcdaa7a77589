# SPDX-License-Identifier: Apache-2.0
"""Fault injection for `ltp train` on a rig: `--kill ROLE:ID@ITER` and
`--restart`.

`--kill worker:2@10` kills worker 2's process (SIGKILL: no unwinding, as a
crash or an OOM kill would) once the lead reports iteration 10;
`--kill server:0@20` kills the server rank. Repeatable; each fires once.

What then happens to a rank that died (killed here or not) is the
launcher's one restart policy (control/launcher/restarts.py, shared with
`ltp launch --max-restarts N`): `--restart` gives it MAX_RESTARTS restarts,
and a rank killed here is one the job may go on without.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from ..launcher.restarts import RestartPolicy

MAX_RESTARTS = 3        # `ltp train --restart`: per rank, and of the whole job
KILL_RE = re.compile(r"^(worker|server):(\d+)@(\d+)$")


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
    policy: RestartPolicy = field(init=False)

    def __post_init__(self) -> None:
        # a worker cannot rejoin a sharded job: with --restart any death there
        # restarts every rank; without, the job goes on without a killed worker
        self.policy = RestartPolicy(MAX_RESTARTS if self.restart else 0,
                                    whole_job=self.servers > 1 and self.restart)

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
