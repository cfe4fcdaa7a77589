# SPDX-License-Identifier: Apache-2.0
"""`ltp bench agg`: the server's summing against the host's memory floors
(control/bench/agg.py), no root and no rig needed."""
from __future__ import annotations

import sys

from .common import UsageError, add_command, add_json, emit, wants_json

SIZES = "234122,4349962,25380010"     # mirrors bench.agg.SIZES (import-free for --help)

EPILOG = """examples:
  ltp bench agg
  ltp bench agg -j --blocks 9
  ltp bench agg --params 4.35M --weights 3,1,2,2
  ltp bench agg --params 1M,100M --workers 8

Sums a step's round of WORKERS rows of float32 as the server does, at each
size, against the host's floors, every arm in each of --blocks blocks (the
arms' order turning by one a block), in one run: memcpy, a streaming add
in place (np.add(a, b, out=a): the floor of issue 40), the same add into a
third buffer, the server before issue 40 (its non-finite check and float64
mean, kept in control/bench/agg.py), and now (aggregate.sum_step: on the C
kernel where it builds, and on its numpy path); with one thread and with one
per CPU. GB/s: bytes of input read per second (the
rows; for the adds both operands), the median of the blocks. The default
sizes are `ltp train`'s MLPs: the default, --hidden 2048,2048 and --hidden
5000,5000 (25M parameters: about 2 GB of memory in all).

JSON keys: config (workers, weights, params, blocks, min_s, threads_all,
summing: what sums by default, {kernel: c or numpy, isa, path, why, cause, file}),
machine (cpus, loadavg_start, loadavg_end), sizes (per size: params,
input_bytes, gbps and block_gbps per arm: memcpy_1, memcpy_all, add_1,
add_all, add3_1, add3_all, old, new_1, new_all, numpy_1, numpy_all; reps;
new_over_add: new_all / add_all, new_over_add_1, new_over_add3,
new_over_old, numpy_over_add, numpy_over_add_1).
"""


def register(bsub) -> None:
    p = add_command(bsub, "agg", "the server's summing vs memcpy and streaming-add floors",
                    epilog=EPILOG)
    p.add_argument("--params", default=SIZES, metavar="N,N,...",
                   help=f"parameters per row, each size in turn; K and M suffixes "
                   f"(default {SIZES})")
    p.add_argument("--workers", type=int, default=4, help="rows per round (default 4)")
    p.add_argument("--weights", default=None, metavar="K,K,...",
                   help="each worker's k (wbsp: the gradients it averaged), one per worker "
                   "(default every k 1, bsp)")
    p.add_argument("--blocks", type=int, default=5,
                   help="alternating blocks per size (default 5)")
    p.add_argument("--min-s", type=float, default=0.05, metavar="S",
                   help="seconds each arm runs in a block, at least one call (default 0.05)")
    add_json(p)
    p.set_defaults(func=cmd_agg)


def parse_params(text: str) -> list[int]:
    out = []
    for word in text.split(","):
        w = word.strip().lower()
        scale = {"k": 10**3, "m": 10**6}.get(w[-1:], 1)
        try:
            n = round(float(w[:-1] if scale > 1 else w) * scale)
        except ValueError:
            raise UsageError(f"--params: cannot read {word!r} (e.g. 234122, 4.35M, 25M)") from None
        if not 1 <= n <= 10**9:
            raise UsageError(f"--params: each size in 1..1e9 parameters, got {word!r}")
        out.append(n)
    return out


def cmd_agg(args) -> None:
    params = parse_params(args.params)
    if not 1 <= args.workers <= 256:
        raise UsageError(f"--workers: must be in 1..256, got {args.workers}")
    weights = [1] * args.workers
    if args.weights is not None:
        try:
            weights = [int(x) for x in args.weights.split(",")]
        except ValueError:
            raise UsageError(f"--weights: whole numbers like 3,1,2,2, got {args.weights!r}") \
                from None
        if len(weights) != args.workers or min(weights) < 0 or not any(weights):
            raise UsageError(f"--weights: one k >= 0 per worker ({args.workers}), not all 0, "
                             f"got {args.weights!r}")
    if not 1 <= args.blocks <= 100:
        raise UsageError(f"--blocks: must be in 1..100, got {args.blocks}")
    if not 0 < args.min_s <= 60:
        raise UsageError(f"--min-s: must be in (0, 60] seconds, got {args.min_s:g}")
    from ..control.bench import agg   # noqa: PLC0415 (numpy only when it runs: --help stays fast)
    progress = None if wants_json(args) else (lambda m: print(f"... {m}", file=sys.stderr))
    res = agg.run(params, weights, args.blocks, args.min_s, progress=progress)
    emit(args, res, agg.table)
