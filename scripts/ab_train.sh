#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# A/B two versions of LTP on `ltp train`, alternating (the machine drifts):
#   sudo bash scripts/ab_train.sh REV_A REV_B [LOSS] [PAIRS] [-- more train flags]
# e.g. sudo bash scripts/ab_train.sh 01a7270 HEAD 0 3
# Each revision is checked out in a worktree of its own (removed at the end),
# imported as `ltpx` through a folder holding a link to it, and runs
# `ltp train --workers 4 --iterations 150 --loss LOSS -j` in turn, PAIRS
# times. One line per run: revision, pair, it/s, final accuracy, the server's
# times. Needs the venv (`bash scripts/setup.sh`) and root.
set -euo pipefail
[ $# -ge 2 ] || { sed -n 3,10p "$0" >&2; exit 2; }
A=$1; B=$2; LOSS=${3:-0}; PAIRS=${4:-2}
shift $(( $# < 4 ? $# : 4 )); [ "${1:-}" = "--" ] && shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$ROOT/.venv/bin/python
TMP=$(mktemp -d /tmp/ltp-ab.XXXXXX)
cleanup() {
    for arm in a b; do git -C "$ROOT" worktree remove --force "$TMP/$arm" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT
for arm in a b; do
    rev=$([ $arm = a ] && echo "$A" || echo "$B")
    git -C "$ROOT" worktree add -q --detach "$TMP/$arm" "$rev"
    mkdir -p "$TMP/${arm}p" && ln -s "$TMP/$arm" "$TMP/${arm}p/ltpx"
done
for i in $(seq 1 "$PAIRS"); do
    for arm in a b; do
        rev=$([ $arm = a ] && echo "$A" || echo "$B")
        out=$TMP/run.json
        (cd "$TMP/$arm" && PYTHONPATH=$TMP/${arm}p timeout 900 "$PY" -m ltpx.tools.cli train \
            --workers 4 --iterations 150 --loss "$LOSS" -j "$@" >"$out" 2>"$TMP/run.err") \
            || { echo "$rev pair $i failed:" >&2; tail -5 "$TMP/run.err" >&2; continue; }
        "$PY" -c "import json,sys; d=json.load(open('$out')); print(json.dumps({'rev': '$rev', \
'pair': $i, 'loss': $LOSS, 'it_per_s': round(d.get('iterations_per_s', 0), 2), \
'final_accuracy': d.get('final_accuracy'), 'ps_times': d.get('ps_times')}))"
    done
done
