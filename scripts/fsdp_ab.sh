#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# FSDP2 over the `ltp` backend against FSDP2 over gloo, on the rig (root, the venv):
#   sudo bash scripts/fsdp_ab.sh [REPEATS] [LOSS] [WORKERS] [-- fsdp2.py flags...]
#   sudo bash scripts/fsdp_ab.sh 3 0.01 4 -- --hidden 2048,2048 --iterations 100
# docs/examples/fsdp2.py under `ltp launch`, ltp and gloo taking turns (the
# machine drifts), each launch its own rig at LOSS (default 0.01) with WORKERS
# trainers (default 4). One JSON line per run (rank 0's iterations/s of the
# training loop, accuracy, whether every rank's parameters are the same, how
# the `ltp` group's calls went), then the medians and their ratio.
# LAUNCH_FLAGS: more `ltp launch` flags for the ltp runs, e.g. the co-located
# shape with no server ranks:
#   sudo LAUNCH_FLAGS="--colocate --share-nic" bash scripts/fsdp_ab.sh 2 0.01 4
set -euo pipefail
REPEATS=${1:-3}
LOSS=${2:-0.01}
WORKERS=${3:-4}
shift $(( $# < 3 ? $# : 3 ))
[ "${1:-}" = "--" ] && shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$ROOT/.venv/bin/python
OUT=$(mktemp /tmp/ltp-fsdp-ab.XXXXXX)
trap 'rm -f "$OUT" "$OUT.err" "$OUT.all"' EXIT
read -ra LTP_FLAGS <<<"${LAUNCH_FLAGS:-}"
for r in $(seq 1 "$REPEATS"); do
    for backend in ltp gloo; do
        servers=("${LTP_FLAGS[@]}"); [ "$backend" = gloo ] && servers=(--servers 0)
        (cd "$ROOT" && timeout 900 "$PY" -m ltpx.tools.cli launch --workers "$WORKERS" \
            --loss "$LOSS" "${servers[@]}" -j -- python docs/examples/fsdp2.py \
            --backend "$backend" "$@" >"$OUT" 2>"$OUT.err") \
            || { echo "$backend run $r failed:" >&2; tail -5 "$OUT.err" >&2; continue; }
        RUN="$r" "$PY" - "$OUT" <<'PY' | tee -a "$OUT.all"
import json, os, sys
s = json.load(open(sys.argv[1]))
res = [r["last_json"] for r in s["ranks"] if r["role"] == "worker"]
r0 = min(res, key=lambda r: r["rank"])
print(json.dumps({"backend": r0["backend"], "run": int(os.environ["RUN"]),
                  "it_s": round(r0["iterations_per_s"], 3), "accuracy": round(r0["accuracy"], 4),
                  "replicas_identical": len({r["digest"] for r in res}) == 1,
                  "routes": r0.get("routes", {})}))
PY
    done
done
"$PY" - "$OUT.all" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
med = {b: statistics.median([r["it_s"] for r in runs if r["backend"] == b] or [0])
       for b in ("ltp", "gloo")}
acc = {b: statistics.median([r["accuracy"] for r in runs if r["backend"] == b] or [0])
       for b in ("ltp", "gloo")}
print(json.dumps({"median_it_s": med, "median_accuracy": acc,
                  "ltp_over_gloo": round(med["ltp"] / med["gloo"], 3) if med["gloo"] else None}))
PY
