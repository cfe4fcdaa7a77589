#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A/B settings of the `ltp` backend's TCP transport on this host's loopback
(no rig, no root), arms taking turns (the machine drifts), gloo beside them:

    .venv/bin/python scripts/ab_loopback.py "ENV_A" "ENV_B" [--blocks N]
        [--workers W] [--hidden H] [--steps S] [--dtype D] [--job lm [-- LM_ARGS]]

Each arm is a space-separated list of VAR=value ("" for none). The job is
scripts/ddp_width.py: DDP over an MLP 256-H-H-10 (H=4096: 17.9M parameters,
a 72 MB gradient), 4 MB buckets, batch 8, S steps; or with --job lm,
scripts/ddp_lm.py (a transformer LM, bf16 autocast on CUDA: the GPU goal's
job), given the arguments after `--`. Its median step is the figure. One
JSON line per run: arm, block, median step (s), digest (and with --job lm
the worker's and servers' breakdowns).
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from ddp_local import run_local  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("arms", nargs="+")
p.add_argument("--blocks", type=int, default=3)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--hidden", type=int, default=4096)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--no-gloo", action="store_true", help="the arms only")
p.add_argument("--job", choices=("mlp", "lm"), default="mlp")
p.add_argument("--dtype", default="float32", help="the MLP's parameters (e.g. bfloat16)")
argv = sys.argv[1:]
extra = argv[argv.index("--") + 1:] if "--" in argv else []
a = p.parse_args(argv[:len(argv) - len(extra) - (1 if "--" in argv else 0)])
script = ROOT / "scripts" / ("ddp_lm.py" if a.job == "lm" else "ddp_width.py")
job_args = (["--steps", str(a.steps), *extra] if a.job == "lm"
            else ["--hidden", str(a.hidden), "--steps", str(a.steps), "--dtype", a.dtype])
arms = [(arm, "ltp") for arm in a.arms] + ([] if a.no_gloo else [("gloo", "gloo")])
for b in range(1, a.blocks + 1):
    for arm, backend in arms:
        env = dict(kv.split("=", 1) for kv in arm.split()) if backend == "ltp" else {}
        r = run_local(a.workers, *job_args, backend=backend, script=script, env_extra=env,
                      timeout=600)
        res = r["results"]
        row = {"arm": arm, "block": b, "step_s": max(x["step_med_s"] for x in res),
               "digests": sorted({x["digest"] for x in res}),
               "params": res[0]["params"], "wall_s": r["wall_s"]}
        if a.job == "lm":
            row.update(breakdown=res[0].get("breakdown"),
                       server_breakdown=res[0].get("server_breakdown"),
                       loss_last=res[0].get("loss_last"), reduce=res[0].get("reduce"))
        print(json.dumps(row), flush=True)
