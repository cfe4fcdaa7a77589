# SPDX-License-Identifier: Apache-2.0
"""Benchmark: does pushing gradient buckets during backward pay? big_model.py on a rig,
iterations/s with overlap (4 MB buckets, each pushed as backward produces it)
against one bucket pushed in step(), the runs alternating.

    sudo .venv/bin/python docs/examples/bench_overlap.py                 # 8 workers, 3 runs each
    sudo .venv/bin/python docs/examples/bench_overlap.py --workers 4 --batch 4096 --runs 2 -j

Each run is `ltp launch -j -- python docs/examples/big_model.py --max-steps S`
on a fresh rig; a run's figure is worker 0's iterations/s (from the end of
its first step to its last: start-up excluded). Prints one line per run, the
medians and their ratio; -j prints one JSON object instead.
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LTP = Path(sys.executable).parent / "ltp"
MODES = {"overlap": [], "one bucket, no overlap": ["--no-overlap", "--bucket-mb", "1024"]}


def run(args, extra: list[str]) -> dict:
    argv = [str(LTP), "launch", "--workers", str(args.workers), "--rate", args.rate,
            "--loss", str(args.loss), "-j", "--", "python", str(HERE / "big_model.py"),
            "--max-steps", str(args.steps), "--batch", str(args.batch),
            "--samples", str(max(args.batch * (args.steps + 1), 4096)), *extra]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout)
    if out.returncode != 0 or not out.stdout.strip():
        raise SystemExit(f"ltp launch failed ({out.returncode}): {out.stderr[-2000:]}")
    ranks = json.loads(out.stdout)["ranks"]
    w0 = next(r["last_json"] for r in ranks if r["label"] == "w0")
    return {"iterations_per_s": w0["iterations_per_s"], "buckets": len(w0["buckets"]),
            "accuracy": w0["accuracy"], "times": w0["times"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--runs", type=int, default=3, help="runs of each mode (default 3)")
    p.add_argument("--steps", type=int, default=20, help="steps per run (default 20)")
    p.add_argument("--batch", type=int, default=256, help="global batch (default 256)")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--loss", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("-j", "--json", action="store_true", help="print JSON")
    a = p.parse_args()
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for i in range(a.runs):
        for mode, extra in MODES.items():
            r = run(a, extra)
            runs[mode].append(r)
            if not a.json:
                print(f"run {i + 1} {mode:<22} {r['iterations_per_s']:6.3f} it/s "
                      f"({r['buckets']} buckets, accuracy {r['accuracy']:.3f})", flush=True)
    med = {m: statistics.median(r["iterations_per_s"] for r in rs) for m, rs in runs.items()}
    ratio = med["overlap"] / med["one bucket, no overlap"]
    if a.json:
        print(json.dumps({"workers": a.workers, "batch": a.batch, "steps": a.steps,
                          "rate": a.rate, "loss": a.loss, "runs": runs,
                          "median_iterations_per_s": med, "overlap_speedup": ratio}))
    else:
        print(f"median: overlap {med['overlap']:.3f} it/s, one bucket "
              f"{med['one bucket, no overlap']:.3f} it/s: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
