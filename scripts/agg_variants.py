# SPDX-License-Identifier: Apache-2.0
"""Ways to sum a step's round of rows, against the in-place add floor, in
alternating blocks on one thread: the variants docs/benchmarks.md ("`ltp
bench agg`", "Where a block's time goes") keeps the figures of. Prints GB/s
of input read (the median of the blocks) and each as a fraction of the
floor, and with -j the JSON.

    .venv/bin/python scripts/agg_variants.py --params 234122,4349962,25380010
"""
import argparse
import json
import time

import numpy as np
import torch

from ltpx.control.transport.aggregate import BLOCK, aggregate_into

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--params", default="4349962", help="comma-separated row lengths")
p.add_argument("--rows", type=int, default=4, help="rows summed, 2 or more (default 4)")
p.add_argument("--blocks", type=int, default=5)
p.add_argument("-j", "--json", action="store_true")
args = p.parse_args()
if args.rows < 2:
    p.error("--rows: 2 or more")


def arms(v: np.ndarray) -> dict:
    k, n = v.shape
    out, zeros, inv = np.empty(n, np.float32), np.zeros(BLOCK, np.float32), np.float32(1 / k)
    half = v.size // 2
    flat = v.reshape(-1).copy()
    a, b = flat[:half], flat[half:2 * half]

    def blocked(body):
        def run():
            for lo in range(0, n, BLOCK):
                hi = min(n, lo + BLOCK)
                body(lo, hi, out[lo:hi])
        return run

    def answer_as_acc(lo, hi, o):        # the answer's block accumulates, no scratch
        np.add(v[0, lo:hi], v[1, lo:hi], out=o)
        for i in range(2, k):
            np.add(o, v[i, lo:hi], out=o)
        np.multiply(o, inv, out=o)
        np.dot(o, zeros[:hi - lo])        # NaN or Inf anywhere makes the dot NaN

    def copy_then_inplace(lo, hi, o):
        np.copyto(o, v[0, lo:hi])
        for i in range(1, k):
            np.add(o, v[i, lo:hi], out=o)
        np.multiply(o, inv, out=o)
        np.dot(o, zeros[:hi - lo])

    first = v[0].copy()                  # the arm's own first row: it sums into it

    def into_first_row(lo, hi, o):       # the answer would be sent from the first row
        r = first[lo:hi]
        for i in range(1, k):
            np.add(r, v[i, lo:hi], out=r)
        np.multiply(r, inv, out=r)
        np.dot(r, zeros[:hi - lo])
    tv, to = torch.from_numpy(v), torch.from_numpy(out)
    return {"floor_add_inplace": lambda: np.add(a, b, out=a),
            "now_aggregate_into": lambda: aggregate_into(out, v, None, check=True, threads=1),
            "answer_as_acc": blocked(answer_as_acc),
            "copy_then_inplace": blocked(copy_then_inplace),
            "into_first_row": blocked(into_first_row),
            "torch_sum_no_div_no_check": lambda: torch.sum(tv, 0, out=to)}


def measure(n: int) -> dict:
    torch.set_num_threads(1)
    v = np.random.default_rng(0).standard_normal((args.rows, n), dtype=np.float32)
    fs = arms(v)
    reps = max(3, int(1e8 / v.nbytes))
    for f in fs.values():
        f()
    per = {name: [] for name in fs}
    names = list(fs)
    for blk in range(args.blocks):
        for name in names[blk % len(names):] + names[:blk % len(names)]:
            t0 = time.perf_counter()
            for _ in range(reps):
                fs[name]()
            per[name].append(v.nbytes * reps / (time.perf_counter() - t0) / 1e9)
    med = {name: float(np.median(x)) for name, x in per.items()}
    return {"params": n, "gbps": med,
            "of_floor": {name: g / med["floor_add_inplace"] for name, g in med.items()}}


res = [measure(int(x)) for x in args.params.split(",")]
if args.json:
    print(json.dumps(res, indent=1))
else:
    for r in res:
        print(f"{args.rows} rows x {r['params']:,}: GB/s of input, one thread (of the floor)")
        for name, g in r["gbps"].items():
            print(f"  {name:28}{g:8.2f}  ({r['of_floor'][name]:.2f})")
