#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# A/B settings of one tree on `ltp train`, arms taking turns (the machine drifts):
#   sudo bash scripts/ab_env.sh "ARM_A" "ARM_B" [...] [--blocks N] [-- train flags]
# Each arm is a space-separated list of VAR=value settings and `ltp train`
# flags of its own (--flag=value), "" for none, e.g.
#   sudo bash scripts/ab_env.sh LTP_STREAM_SHARE=0 LTP_STREAM_SHARE=0.5 --blocks 3 -- \
#        --transport ddp-ltp --workers 4 --iterations 30 --hidden 2048,2048
#   sudo bash scripts/ab_env.sh --mtu=1500 --mtu=3500 --blocks 2 -- --transport ddp-ltp \
#        --compare gloo --workers 4 --iterations 20 --hidden 2048,2048
# One JSON line per run: arm, block, it/s (and each --compare run's: transport,
# cc, it/s), final
# accuracy, delivered fraction, whether the replicas are identical, and the
# step breakdown's medians (the median worker's wall, push and pull; the
# server's gather, summing and send), seconds. Needs the venv (`bash scripts/setup.sh`) and root.
set -euo pipefail
ARMS=(); BLOCKS=3
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    if [ "$1" = "--blocks" ]; then BLOCKS=$2; shift 2; else ARMS+=("$1"); shift; fi
done
[ "${1:-}" = "--" ] && shift
[ ${#ARMS[@]} -ge 2 ] || { sed -n 3,14p "$0" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$ROOT/.venv/bin/python
OUT=$(mktemp /tmp/ltp-ab-env.XXXXXX)
trap 'rm -f "$OUT" "$OUT.err"' EXIT
for b in $(seq 1 "$BLOCKS"); do
    for arm in "${ARMS[@]}"; do
        SETS=(); FLAGS=()
        read -ra WORDS <<<"$arm"
        for w in "${WORDS[@]}"; do
            case "$w" in --*) FLAGS+=("$w") ;; *) SETS+=("$w") ;; esac
        done
        (cd "$ROOT" && env "${SETS[@]}" timeout 900 "$PY" -m ltpx.tools.cli train -j "$@" "${FLAGS[@]}" \
            >"$OUT" 2>"$OUT.err") \
            || { echo "arm '$arm' block $b failed:" >&2; tail -5 "$OUT.err" >&2; continue; }
        ARM="$arm" BLOCK="$b" "$PY" - "$OUT" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1]))
b = d.get("breakdown") or {}
w, s = (b.get("worker") or {}).get("median", {}), (b.get("server") or {}).get("median", {})
print(json.dumps({"arm": os.environ["ARM"], "block": int(os.environ["BLOCK"]),
                  "it_per_s": round(d.get("iterations_per_s") or 0, 3),
                  **({"compare": [[c.get("transport"), c.get("cc"),
                                   round(c.get("iterations_per_s") or 0, 3)]
                                  for c in d["compare"]]} if d.get("compare") else {}),
                  "final_accuracy": d.get("final_accuracy"),
                  "delivered": d.get("delivered_fraction"),
                  "identical": d.get("replicas_identical"),
                  "step": {k: w.get(k) for k in ("wall", "push", "pull")},
                  "server": {k: s.get(k) for k in ("gather", "aggregate", "send", "idle")}}))
PY
    done
done
