# SPDX-License-Identifier: Apache-2.0
"""One rank of a job whose worker 1 SIGKILLs itself once (test_launch_restart.py):
`python launch_restart_job.py MARKER DIE_AT STEPS WAIT [WHO]`.

A small MLP on the same synthetic batches on every worker (a step's batch is
drawn from the step number, so a rejoined worker draws what the others do).
Worker 1 kills itself (SIGKILL) at step DIE_AT unless the file MARKER exists,
which it creates first: only its first process dies. MARKER "always": worker
1 exits 3 instead, at step DIE_AT and, restarted, before it rejoins (a rank
that keeps failing; the others go on for LIMIT steps). A process that finds
the job running rejoins it (elastic.joining/rejoin) and every worker hands
its state on after each step (elastic.donate), as a script must for `ltp
launch --max-restarts` to bring a worker back. With WAIT=1 the workers go on
past STEPS until worker 1 has been admitted back (every member sees the same
admissions, so they all stop at the same step), so the test needs no pacing.
WHO "s0": the server rank (LTP_RANK 0) SIGKILLs itself once instead, before
lt.init() (the launcher then restarts every rank).
Each worker prints one JSON line: {"event": "result", "worker", "steps",
"rejoined" (this process came back into a running job), "admitted" (the
workers admitted back, as this worker saw it), "digest", "finished"}.
"""
import json
import os
import signal
import sys

import torch
import torch.nn.functional as F

import ltpx.torch as lt
from ltpx.control.torchapi import elastic
from ltpx.control.torchapi.coord import Excluded
from ltpx.control.torchapi.job import current

MARKER, DIE_AT, STEPS, WAIT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
WHO = sys.argv[5] if len(sys.argv) > 5 else "w1"
LIMIT = 4000            # never loop for ever: the test's assertions fail instead
D, B = 12, 24

if WHO == "s0" and os.environ["LTP_RANK"] == "0" and not os.path.exists(MARKER):
    open(MARKER, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)
lt.init()               # a server rank serves inside and exits
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(D, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
opt = lt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                              named_parameters=model.named_parameters())
ex = current().exchange


def result(finished: bool, rejoined: bool) -> None:
    print(json.dumps({"event": "result", "worker": lt.rank(), "steps": opt.steps,
                      "rejoined": rejoined, "admitted": sorted(ex.rejoined),
                      "digest": lt.digest(model), "finished": finished}), flush=True)
    lt.shutdown()
    sys.exit(0)


def maybe_die() -> None:
    if lt.rank() != 1 or WHO != "w1":
        return
    if MARKER == "always" and (opt.steps >= DIE_AT or elastic.joining()):
        os._exit(3)
    if opt.steps == DIE_AT and not os.path.exists(MARKER):
        open(MARKER, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


rejoined = elastic.joining()
maybe_die()
if rejoined:
    if elastic.rejoin(opt) is None:      # the job ended before this worker was admitted
        result(False, True)
else:
    lt.broadcast_parameters(model.state_dict(), root_rank=0)

while (opt.steps < STEPS or WAIT and 1 not in ex.rejoined) and opt.steps < LIMIT:
    maybe_die()
    g = torch.Generator().manual_seed(opt.steps)
    x = torch.randn(B, D, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    opt.zero_grad()
    F.cross_entropy(model(x[lt.rank()::lt.size()]), y[lt.rank()::lt.size()]).backward()
    try:
        opt.step()
    except Excluded:                     # the job went on without this worker: come back
        if elastic.rejoin(opt) is None:
            result(False, rejoined)
        continue
    elastic.donate(opt)

result(True, rejoined)
