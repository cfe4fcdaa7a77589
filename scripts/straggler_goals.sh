#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Straggler attribution against issue 43's goals, on the rig (root, the venv):
#   sudo bash scripts/straggler_goals.sh [REPEATS]        (default 3)
# The three cases take turns (the machine drifts); one JSON line per run:
#   steady   --workers 8 --iterations 100 --straggler 2:3   w2's share of the
#            steps after the first window (goal >= 0.9)
#   none     --workers 8 --iterations 100                   the most any worker
#            is named, as a share of the steps (goal <= 0.4)
#   big      --iterations 30 --straggler 1:5                 the worker named most (goal w1)
set -euo pipefail
REPEATS=${1:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$ROOT/.venv/bin/python
OUT=$(mktemp /tmp/ltp-straggler-goals.XXXXXX)
trap 'rm -f "$OUT" "$OUT.err"' EXIT
declare -A ARGS=([steady]="--workers 8 --iterations 100 --straggler 2:3"
                 [none]="--workers 8 --iterations 100" [big]="--iterations 30 --straggler 1:5")
for r in $(seq 1 "$REPEATS"); do
    for case in steady none big; do
        # shellcheck disable=SC2086  # the case's flags
        (cd "$ROOT" && timeout 900 "$PY" -m ltpx.tools.cli train -j ${ARGS[$case]} \
            >"$OUT" 2>"$OUT.err") \
            || { echo "$case run $r failed:" >&2; tail -5 "$OUT.err" >&2; continue; }
        CASE="$case" RUN="$r" "$PY" - "$OUT" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1]))
named, after = d["straggler_rounds"], d["after_window"]
top = max(named, key=named.get, default=None)
print(json.dumps({
    "case": os.environ["CASE"], "run": int(os.environ["RUN"]), "it_s": round(d["iterations_per_s"], 2),
    "steps": d["iterations"], "aside": d["steps_aside"], "attributed_by": d["attributed_by"],
    "top": top, "top_share": round(named[top] / d["iterations"], 3) if top else 0.0,
    "after_window_steps": after["steps"],
    "w2_after_window": round(after["named"].get("2", 0) / after["steps"], 3) if after["steps"] else None,
    "steady_lag_ms": d["steady_lag_ms"]}))
PY
    done
done
