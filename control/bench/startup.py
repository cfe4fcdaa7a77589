# SPDX-License-Identifier: Apache-2.0
"""`python -m ltpx.control.bench.startup`: `ltp train`'s time to its first round, with and
without the fork server, in alternating runs.

Each run is one `ltp train --workers W --iterations I -j` command on a rig
of its own (built and removed by the command): the fork server on
(LTP_FORKSERVER=1) and off (0, every rank a new interpreter) take turns,
so a neighbour's load falls on both alike. Per run: the lead's first
"start" and "iter" events in seconds since the command started (the
result's "startup" entry, see control/training/onrig.py), the whole
command's wall time, and the CPU seconds of the command and everything it
started (RUSAGE_CHILDREN: the zygote waits for its children, the command
for the zygote). Prints one line per run, the medians, and JSON with -j.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from ..settings_table import TABLE

MODES = {"fork": "1", "exec": "0"}


def one_run(mode: str, workers: int, iterations: int, name: str) -> dict:
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ltp"), "train",
                          "--workers", str(workers), "--iterations", str(iterations),
                          "--name", name, "-j"], capture_output=True, text=True,
                         env={**os.environ, TABLE["forkserver"].env: MODES[mode]})
    wall = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"ltp train failed ({mode}): {out.stderr.strip()[-500:]}")
    res = json.loads(out.stdout)
    st = res.get("startup") or {}
    return {"mode": mode, "first_iter_s": st.get("first_iter_s"), "start_s": st.get("start_s"),
            "forked_ranks": st.get("forked_ranks"), "wall_s": round(wall, 3),
            "cpu_s": round(ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime, 2),
            "load1": round(os.getloadavg()[0], 2),
            "replicas_identical": res.get("replicas_identical")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ltpx.control.bench.startup",
                                description="ltp train's time to the first round, "
                                "fork server on and off, alternating")
    p.add_argument("--runs", type=int, default=3, help="runs of each mode (default 3)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--name", default=f"hst{os.getpid() % 100000}", help="rig name per run")
    p.add_argument("-j", "--json", action="store_true")
    a = p.parse_args(argv)
    runs = []
    for i in range(a.runs):
        for mode in (("fork", "exec") if i % 2 == 0 else ("exec", "fork")):
            r = one_run(mode, a.workers, a.iterations, a.name)
            runs.append(r)
            print(f"{mode:<5} first iter {r['first_iter_s']:6.2f} s  start {r['start_s']:6.2f} s"
                  f"  wall {r['wall_s']:6.2f} s  cpu {r['cpu_s']:6.2f} s  load {r['load1']}",
                  file=sys.stderr, flush=True)
    med = {m: {k: statistics.median(r[k] for r in runs if r["mode"] == m)
               for k in ("first_iter_s", "start_s", "wall_s", "cpu_s")} for m in MODES}
    ratio = {k: round(med["fork"][k] / med["exec"][k], 3) for k in med["fork"]}
    for m in MODES:
        print(f"median {m:<5} " + "  ".join(f"{k} {v:.2f}" for k, v in med[m].items()),
              file=sys.stderr)
    print("fork/exec " + "  ".join(f"{k} {v:.2f}x" for k, v in ratio.items()), file=sys.stderr)
    if a.json:
        print(json.dumps({"workers": a.workers, "iterations": a.iterations, "runs": runs,
                          "median": med, "fork_over_exec": ratio}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
