#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The senders' A/B: the paced socket against the ACK clock (and, with
--arms, auto, the default, choosing per push), on this machine.

Runs, --reps times with the arms' order swapped each time, the commands
docs/benchmarks.md ("The ACK clock as the default sender") reports:
incast (`ltp bench incast --transports ltp-xdp,ltp-socket`, several worker
counts and sizes), one flow (`--workers 1 --rate 32gbit`, with tcp-cubic for
the goodput against TCP) and training (`ltp train --sender A`, then
`--sender B`, as two commands in turn, at loss 0, 0.01 and 0.1). Every
arm is named explicitly, so the result does not depend on the default
sender; a run past --run-timeout is stopped and noted with how far it
got. Each run's JSON goes to --out as one line of runs.jsonl, with the
load average before and after; the summary gives each arm's figure over
the socket's within each run (training: of the commands run one after the
other).

USAGE (root; from the repository root):
  sudo .venv/bin/python scripts/ab_sender.py                 # everything, 3 reps
  sudo .venv/bin/python scripts/ab_sender.py --reps 2 --only train
  sudo .venv/bin/python scripts/ab_sender.py --summary /tmp/ab-sender/runs.jsonl
  sudo .venv/bin/python scripts/ab_sender.py --arms ltp-auto,ltp-xdp,ltp-socket --reps 2
The `ltp` it runs is the ltpx this interpreter imports (PYTHONPATH first: a
worktree's copy measures that commit).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

LTP = [sys.executable, "-m", "ltpx.tools.cli"]   # the ltpx this interpreter imports
ARMS = ("ltp-xdp", "ltp-socket")
INCAST = {   # name: (workers, size, rounds, extra flags)
    "incast 16 x 256KiB": (16, "256KiB", 30, []),
    "incast 32 x 256KiB": (32, "256KiB", 20, []),
    "incast 4 x 1MiB": (4, "1MiB", 20, []),
    "incast 16 x 256KiB loss 0.01": (16, "256KiB", 30, ["--loss", "0.01"]),
    "incast 16 x 256KiB loss 0.1": (16, "256KiB", 10, ["--loss", "0.1"]),
}
FLOW = ["--workers", "1", "--rate", "32gbit", "--buffer", "4mb", "--size", "16MiB",
        "--rounds", "20"]
TRAIN = {"train loss 0": "0", "train loss 0.01": "0.01", "train loss 0.1": "0.1"}
TRAIN_FLAGS = ["--workers", "4", "--iterations", "150"]


def _load() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


RUN_TIMEOUT_S = 300.0   # a run that takes longer is stopped (SIGTERM: its rig goes) and noted


def _run(cmd: list[str]) -> dict:
    before = _load()
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        p.terminate()
        out, err = p.communicate()
        done = re.findall(r"(\d+)/(\d+) acc", err)   # `ltp train`'s progress bar
        where = f", {done[-1][0]}/{done[-1][1]} iterations done" if done else ""
        return {"cmd": cmd, "load_before": before, "load_after": _load(),
                "wall_s": round(time.monotonic() - t0, 1), "out": None,
                "error": f"{cmd[cmd.index('--sender') + 1] if '--sender' in cmd else ''} "
                         f"stopped after {RUN_TIMEOUT_S:g} s{where}"}
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{err[-3000:]}")
    return {"cmd": cmd, "load_before": before, "load_after": _load(),
            "wall_s": round(time.monotonic() - t0, 1), "out": json.loads(out)}


def incast_runs(rep: int, only: set[str]):
    arms = ARMS if rep % 2 == 0 else ARMS[::-1]
    for name, (workers, size, rounds, extra) in INCAST.items():
        if "incast" in only:
            yield name, _run(LTP + ["bench", "incast", "--workers", str(workers), "--size", size,
                                    "--rounds", str(rounds), "--transports", ",".join(arms),
                                    "--name", "absnd", "-j", *extra])
    if "flow" in only:
        yield "one flow 16MiB 32gbit", _run(
            LTP + ["bench", "incast", *FLOW, "--transports", ",".join(arms) + ",tcp-cubic",
                   "--name", "absnd", "-j"])


def train_runs(rep: int, only: set[str]):
    """Each arm its own `ltp train` (a run that stalls loses only its own
    figures), the arms' order alternating by rep."""
    arms = [a.removeprefix("ltp-") for a in (ARMS if rep % 2 == 0 else ARMS[::-1])]
    for name, loss in TRAIN.items():
        if "train" in only:
            runs = [_run(LTP + ["train", *TRAIN_FLAGS, "--loss", loss, "--sender", arm,
                                "--name", "absnd", "-j"]) for arm in arms]
            yield name, {**runs[0], "out": [r["out"] for r in runs], "arms": arms,
                         "error": "; ".join(f"{arm}: {r['error']}" for arm, r in zip(arms, runs)
                                            if r.get("error")) or None,
                         "load_after": runs[-1]["load_after"],
                         "wall_s": sum(r["wall_s"] for r in runs)}


def _incast_row(out: dict) -> dict:
    res = out["results"]
    row = {}
    for arm in ARMS:
        r = res[arm]
        row[arm] = {"median_over_limit": r["median_over_limit"],
                    "p99_over_limit": r["p99_over_limit"], "goodput_bps": r["goodput_bps"],
                    "cpu_s_per_round": r["cpu_s_per_round"], "delivered": r["delivered"],
                    "cut": sum(v for k, v in r["reasons"].items() if k != "complete"),
                    "rounds": r["rounds"], "clock_share": r.get("clock_share")}
    if "tcp-cubic" in res:
        row["tcp-cubic"] = {"goodput_bps": res["tcp-cubic"]["goodput_bps"]}
    return row


def _train_row(outs: list, arms: list[str]) -> dict:
    """Each arm's figures (keyed by the sender asked for: auto's report
    names what it chose)."""
    row = {}
    for arm, r in zip(arms, outs):
        if r and r.get("transport") == "ltp":
            row["ltp-" + arm] = {
                "it_per_s": r["iterations_per_s"], "final_accuracy": r["final_accuracy"],
                "wall_s": r["wall_s"], "cut": r["rounds_early_closed"],
                "delivered": r["delivered_fraction"], "clock_share": r.get("uplink_clock_share")}
    return row


def _line(row: dict, ratios: dict) -> str:
    """One run: each arm's figure, and its ratio to the socket's."""
    arms = [a for a in row if a.startswith("ltp-")]
    train = "it_per_s" in row[arms[0]]
    key = "it_per_s" if train else "median_over_limit"
    figs = " ".join(f"{a[4:]} {row[a][key]:.3f}" for a in arms)
    rat = ", ".join(f"{a[4:]}/socket {x:.3f}" for a, x in ratios.items())
    more = ("acc " + "/".join(f"{row[a]['final_accuracy']:.3f}" for a in arms) if train else
            "p99 " + "/".join(f"{row[a]['p99_over_limit']:.3f}" for a in arms) + "  cpu " +
            "/".join(f"{row[a]['cpu_s_per_round'] * 1e3:.0f}" for a in arms) + " ms")
    share = "/".join(f"{row[a]['clock_share'] or 0:.2f}" for a in arms)
    return (f"{'it/s' if train else 'median/limit'} {figs} ({rat})  {more}  cut "
            f"{'/'.join(str(row[a]['cut']) for a in arms)}  clock share {share}")


def summary(lines: list[dict]) -> str:
    by = {}
    for ln in lines:
        by.setdefault(ln["name"], []).append(ln)
    text = []
    for name, runs in by.items():
        text.append(f"{name}:")
        for ln in runs:
            if ln.get("error"):
                text.append(f"  rep {ln['rep']} first {ln['first']:<10} {ln['error'][:200]}")
            ratios = _ratios(ln["row"])
            if ratios:
                text.append(f"  rep {ln['rep']} first {ln['first']:<10} "
                            f"{_line(ln['row'], ratios)}  load {ln['load_before']:.1f}-"
                            f"{ln['load_after']:.1f}")
        for arm in dict.fromkeys(a for ln in runs for a in _ratios(ln["row"])):
            xs = [_ratios(ln["row"])[arm] for ln in runs if arm in _ratios(ln["row"])]
            text.append(f"  {arm[4:]}/socket ({'it/s, higher' if 'train' in name else 'median round, lower'} "
                        f"is better): median of runs {statistics.median(xs):.3f}, range "
                        f"{min(xs):.3f}-{max(xs):.3f}")
    return "\n".join(text)


def _ratios(row: dict) -> dict[str, float]:
    """Each arm's figure over the socket's (it/s in training, the median
    round in incast)."""
    s = row.get("ltp-socket")
    if not s:
        return {}
    key = "it_per_s" if "it_per_s" in s else "median_over_limit"
    return {a: r[key] / s[key] for a, r in row.items()
            if a.startswith("ltp-") and a != "ltp-socket" and r.get(key)}


def main() -> int:
    global RUN_TIMEOUT_S, ARMS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("USAGE", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="runs of each command (default 3)")
    p.add_argument("--first-rep", type=int, default=0,
                   help="number the reps from here (the arms' order alternates by it)")
    p.add_argument("--only", default="incast,flow,train",
                   help="comma list of incast, flow, train (default all)")
    p.add_argument("--out", default="/tmp/ab-sender", help="folder for runs.jsonl")
    p.add_argument("--summary", metavar="RUNS.jsonl", help="only summarise an earlier run")
    p.add_argument("--arms", default=",".join(ARMS),
                   help=f"the senders, as bench transports (default {','.join(ARMS)}; "
                   "ltp-auto: the default sender, choosing per push)")
    p.add_argument("--run-timeout", type=float, default=RUN_TIMEOUT_S,
                   help=f"seconds one command may take (default {RUN_TIMEOUT_S:g})")
    a = p.parse_args()
    if a.summary:
        with open(a.summary) as f:
            print(summary([json.loads(ln) for ln in f if ln.strip()]))
        return 0
    only = set(a.only.split(","))
    RUN_TIMEOUT_S = a.run_timeout
    ARMS = tuple(a.arms.split(","))
    if "ltp-socket" not in ARMS or not set(ARMS) <= {"ltp-xdp", "ltp-socket", "ltp-auto"}:
        p.error(f"--arms: ltp-socket and any of ltp-xdp, ltp-auto, got {a.arms!r}")
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "runs.jsonl")
    lines = []
    with open(path, "a") as f:
        for rep in range(a.first_rep, a.first_rep + a.reps):
            for kind, gen in (("bench", incast_runs), ("train", train_runs)):
                for name, run in gen(rep, only):
                    row = (_train_row(run["out"], run["arms"]) if kind == "train" else
                           {} if run["out"] is None else _incast_row(run["out"]))
                    first = (run["cmd"][run["cmd"].index("--sender") + 1] if kind == "train"
                             else run["cmd"][run["cmd"].index("--transports") + 1].split(",")[0])
                    ln = {"name": name, "rep": rep, "first": first, "row": row,
                          "error": run.get("error"),
                          **{k: run[k] for k in ("cmd", "load_before", "load_after", "wall_s")}}
                    f.write(json.dumps(ln) + "\n")
                    f.flush()
                    lines.append(ln)
                    print(summary([ln]), flush=True)
    print(f"\n{path}\n" + summary(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
