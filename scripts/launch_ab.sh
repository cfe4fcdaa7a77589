#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# A/B arms of a DDP job on the rig under `ltp launch`, arms taking turns (the
# machine drifts); root and the venv:
#   sudo bash scripts/launch_ab.sh [--blocks N] [--loss L] [--workers W] [--script S]
#        ARM... [-- the script's flags]
#   sudo bash scripts/launch_ab.sh --blocks 3 "ltp LTP_COMPRESS=none" "ltp" "gloo" -- \
#        --dtype bfloat16 --hidden 1024 --steps 30
#   sudo bash scripts/launch_ab.sh --script scripts/op_latency.py "ltp" "gloo"
# An arm is a backend (ltp | gloo), VAR=value settings for every rank and
# `ltp launch` flags (words that start with --, a value after =, e.g.
# "ltp --colocate --transport=tcp"); gloo runs with --servers 0. The job is
# scripts/ddp_width.py (an MLP 256-H-H-10, DDP's 4 MB buckets) or --script,
# which prints step_med_s. One JSON line per run (arm, block, the
# lowest-ranked trainer's median step and its result, whether every trainer
# ended with the same digest), then each arm's median step and the first
# arm's over it (above 1: faster than the first).
set -euo pipefail
BLOCKS=3; LOSS=0; WORKERS=4; SCRIPT=scripts/ddp_width.py; ARMS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case "$1" in
        --blocks) BLOCKS=$2; shift 2 ;;
        --loss) LOSS=$2; shift 2 ;;
        --workers) WORKERS=$2; shift 2 ;;
        --script) SCRIPT=$2; shift 2 ;;
        *) ARMS+=("$1"); shift ;;
    esac
done
[ "${1:-}" = "--" ] && shift
[ ${#ARMS[@]} -ge 1 ] || { sed -n 3,17p "$0" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$ROOT/.venv/bin/python
OUT=$(mktemp /tmp/ltp-launch-ab.XXXXXX)
trap 'rm -f "$OUT" "$OUT.err" "$OUT.all"' EXIT
for b in $(seq 1 "$BLOCKS"); do
    for arm in "${ARMS[@]}"; do
        read -r backend rest <<<"$arm"
        case "$backend" in ltp|gloo) ;; *) echo "an arm starts with ltp or gloo: '$arm'" >&2; exit 2 ;; esac
        servers=(); [ "$backend" = gloo ] && servers=(--servers 0)
        vars=(); flags=(); read -ra words <<<"$rest"
        for w in "${words[@]}"; do
            case "$w" in
                --*) flags+=("$w") ;;
                [A-Za-z_]*=*) vars+=("$w") ;;
                *) echo "arm '$arm': '$w' is neither VAR=value nor --flag[=value]" >&2; exit 2 ;;
            esac
        done
        (cd "$ROOT" && env "${vars[@]}" timeout 900 "$PY" -m ltpx.tools.cli launch --workers "$WORKERS" \
            --loss "$LOSS" "${servers[@]}" "${flags[@]}" -j -- python "$SCRIPT" \
            --backend "$backend" "$@" >"$OUT" 2>"$OUT.err") \
            || { keep="$OUT.fail-$b-${#ARMS[@]}-$RANDOM.err"; cp "$OUT.err" "$keep"
                 echo "arm '$arm' block $b failed (its stderr: $keep):" >&2
                 tail -5 "$OUT.err" >&2; continue; }
        ARM="$arm" BLOCK="$b" "$PY" - "$OUT" <<'PY' | tee -a "$OUT.all"
import json, os, sys
s = json.load(open(sys.argv[1]))
res = [r["last_json"] for r in s["ranks"] if r["role"] == "worker"]
r0 = min(res, key=lambda r: r["rank"])
print(json.dumps({"arm": os.environ["ARM"], "block": int(os.environ["BLOCK"]),
                  "step_med_s": r0["step_med_s"], "params": r0["params"],
                  **{k: r0[k] for k in ("ms", "per_op_ms") if k in r0},
                  "replicas_identical": len({r["digest"] for r in res}) == 1}))
PY
    done
done
"$PY" - "$OUT.all" "${ARMS[@]}" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
arms = sys.argv[2:]
med = {a: statistics.median([r["step_med_s"] for r in runs if r["arm"] == a] or [0]) for a in arms}
first = med[arms[0]]
print(json.dumps({"median_step_s": med,
                  "over_first": {a: round(first / m, 3) if m else None for a, m in med.items()}}))
PY
