#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Where the CPU goes in a DDP job on the rig: system-wide `perf record` for a
# window in the middle of an `ltp launch` of scripts/ddp_width.py, then the
# samples by process name (comm) and by process and library (dso). Root, the
# venv and perf:
#   sudo bash scripts/perf_launch.sh [--wait S] [--window S] ARM [-- ddp_width.py flags]
#   sudo bash scripts/perf_launch.sh "ltp --colocate --share-nic" -- --hidden 2048 --steps 40
#   sudo bash scripts/perf_launch.sh --wait 45 "gloo" -- --hidden 2048 --steps 90
# An arm is as in scripts/launch_ab.sh: a backend (ltp | gloo; gloo runs with
# --servers 0) and `ltp launch` flags. --wait (default 55 s) is how long
# after the launch the window opens (the rig built and torch imported; the
# job must still be stepping when the --window, default 15 s, closes: give
# it steps enough). Trainers show as ltp-rank<k>, a co-located trainer's
# server process as python, the kernel's deferred network work as ksoftirqd.
set -euo pipefail
WAIT=55; WINDOW=15
while [ $# -gt 0 ]; do
    case "$1" in
        --wait) WAIT=$2; shift 2 ;;
        --window) WINDOW=$2; shift 2 ;;
        *) break ;;
    esac
done
[ $# -ge 1 ] || { sed -n 3,15p "$0" >&2; exit 2; }
ARM=$1; shift
[ "${1:-}" = "--" ] && shift
command -v perf >/dev/null || { echo "perf is not installed (linux-tools)" >&2; exit 1; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$ROOT/.venv/bin/python
read -r backend rest <<<"$ARM"
case "$backend" in ltp|gloo) ;; *) echo "an arm starts with ltp or gloo: '$ARM'" >&2; exit 2 ;; esac
read -ra flags <<<"$rest"
[ "$backend" = gloo ] && flags+=(--servers 0)
OUT=$(mktemp -d /tmp/ltp-perf.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
(cd "$ROOT" && timeout 900 "$PY" -m ltpx.tools.cli launch --workers 4 "${flags[@]}" -j -- \
    python scripts/ddp_width.py --backend "$backend" "$@" >"$OUT/launch.json" 2>"$OUT/launch.err") &
job=$!
sleep "$WAIT"
kill -0 "$job" 2>/dev/null || { echo "the job ended before the window: give it more steps" >&2; exit 1; }
perf record -a -F 299 -o "$OUT/perf.data" -- sleep "$WINDOW" >/dev/null 2>&1
wait "$job" || { echo "the launch failed:" >&2; tail -5 "$OUT/launch.err" >&2; exit 1; }
"$PY" - "$OUT/launch.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
steps = [r["last_json"]["step_med_s"] for r in s["ranks"] if r["role"] == "worker"]
print(json.dumps({"step_med_s": steps}))
PY
for key in comm comm,dso; do
    echo "== samples by $key"
    perf report -i "$OUT/perf.data" --no-children --sort "$key" --stdio 2>/dev/null \
        | grep -v '^#' | grep -v '^$' | head -16
done
