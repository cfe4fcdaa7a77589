#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The GPU check of the LM goal (issues 40, 41): run on the GPU machine from the
# repo's root, the wheels its image lacks in .whl/ (docs/benchmarks.md, "The GPU
# path"). DDP over `ltp` (1 server, co-located, bf16 on the wire) against gloo
# on loopback, a ~118M-parameter transformer LM, 2 trainers sharing cuda:0, arms
# taking turns; then one sampled run; then the server's summing against the
# host's floors (AGG=0: not; SAMPLE=0: no sampled run; SAMPLE_ARM: the sampled
# run's settings, e.g. "LTP_SERVERS=2"), and one TCP stream's
# rate over loopback. Writes $OUT/lm.jsonl, $OUT/samples.json, $OUT/agg.json.
# An earlier tree to A/B against: its files in .abold/ltpx (git archive REV | tar -x
# -C .abold/ltpx), an arm "PYTHONPATH=/tmp/site:/tmp/oldpkg".
#   bash scripts/gpu_lm_check.sh [BLOCKS] [STEPS] [ARM ...]
# A dry run here: NO_WHEELS=1 AGG=0 PY=.venv/bin/python LM_ARGS="--dim 128 --layers 2
#   --heads 4 --vocab 1000 --seq 64 --batch 4" bash scripts/gpu_lm_check.sh 1 5
set -u
OUT=${OUT:-/tmp/gpu_lm_out}; mkdir -p "$OUT"
BLOCKS=${1:-2}; STEPS=${2:-10}; shift 2 2>/dev/null
ARMS=("$@"); [ ${#ARMS[@]} -gt 0 ] || ARMS=("" "LTP_SERVERS=2" "LTP_COMPRESS=bf16")
PY=${PY:-python3}
if [ -d .whl ] && [ -z "${NO_WHEELS:-}" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
fi
mkdir -p /tmp/pkg && ln -sfn "$PWD" /tmp/pkg/ltpx
[ -d .abold/ltpx ] && mkdir -p /tmp/oldpkg && ln -sfn "$PWD/.abold/ltpx" /tmp/oldpkg/ltpx
export PYTHONPATH=/tmp/site:/tmp/pkg PYTHONUNBUFFERED=1
[ -d .abold/ltpx ] && PYTHONPATH=/tmp/site:/tmp/oldpkg "$PY" -c "import ltpx; print(\"old tree:\", ltpx.__file__)"
nvidia-smi -L; nproc; "$PY" -c "import torch; print(torch.__version__)"
if [ "${AGG:-1}" != 0 ]; then
    "$PY" -m ltpx.tools.cli bench agg -j > "$OUT/agg.json" 2>&1 || echo "agg failed"
    tail -c 400 "$OUT/agg.json"; echo
fi
"$PY" -c "from ltpx.control.bench.floors import tcp_loopback as t; print('loopback', t(1.0))"
# LM_ARGS: the job's own flags (scripts/ddp_lm.py), e.g. a small model for a dry run
"$PY" scripts/ab_loopback.py "${ARMS[@]}" --blocks "$BLOCKS" --steps "$STEPS" --job lm \
    -- ${LM_ARGS:-} | tee "$OUT/lm.jsonl"
[ "${SAMPLE:-1}" = 0 ] && exit 0
"$PY" scripts/ab_loopback.py "${SAMPLE_ARM:-}" --no-gloo --blocks 1 --steps 8 --job lm -- \
    ${LM_ARGS:-} --sample /tmp/samples | tee -a "$OUT/lm.jsonl"
"$PY" - "$OUT/samples.json" <<'PY'
import json, pathlib, sys
d = {p.name: json.loads(p.read_text()) for p in pathlib.Path("/tmp/samples").glob("*.json")}
pathlib.Path(sys.argv[1]).write_text(json.dumps(d))
for name, r in sorted(d.items()):
    print(name, r["samples"])
    for row in [x for x in r["stack"] if "threading.py:wait" not in x["where"]][:10]:
        print("   ", row["thread"], row["s"], row["where"])
PY
