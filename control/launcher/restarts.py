# SPDX-License-Identifier: Apache-2.0
"""What the launcher does about a rank that died: `RestartPolicy`, the one
restart policy of `ltp launch --max-restarts N` and `ltp train --restart`.

With a limit of N restarts (`ltp train --restart` is N = MAX_RESTARTS,
control/training/faults.py; `ltp launch --max-restarts N`):
  worker, restarts left  start it again in its namespace with the same
                      environment (at most N times per rank): it finds the
                      job running and rejoins (torchapi/elastic.py)
  worker, killed on purpose (`expected`: `ltp train --kill`), none left
                      the job goes on without it (the server drops it
                      after --max-missed steps)
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

import signal
from dataclasses import dataclass, field
from collections.abc import Callable


class RestartJob(Exception):
    """Every rank must start again (a server died, or any rank of a sharded
    job), and a restart was left."""


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
