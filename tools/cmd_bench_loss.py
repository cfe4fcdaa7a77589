# SPDX-License-Identifier: Apache-2.0
"""`ltp bench loss`: training speed and accuracy against the loss rate
(control/bench/loss_sweep.py)."""
from __future__ import annotations

import sys

from .common import (UsageError, add_command, add_json, emit, need_bcc, need_root,
                     parse_size)
from .flags import (add_buffer, add_rate, add_workers, check_loss, check_name, check_rate,
                    check_workers)

EPILOG = """examples:
  ltp bench loss
  ltp bench loss --loss 0,0.05,0.1,0.2,0.3 --variants ltp,ltp:budget=0.35,tcp -j
  ltp bench loss --variants ltp,ltp:code=rs,ltp:budget=0.35:code=rs --repeats 3 --plot loss.png
  ltp bench loss --loss 0,0.1,0.2,0.3 --variants ltp,ltp:loss=repair --repeats 3 -j
                                       the loss policy auto against repairing every loss
  ltp bench loss --loss 0,0.2,0.3 --variants ltp,ltp:warmup=40 --repeats 3
                                       its budget from the second step against a warm-up
  ltp bench loss --loss 0,0.1 --variants ltp,ltp:compress=none --repeats 5 -j
                                       the policy's bfloat16 wire against float32 always

Variants: ltp (LTP's defaults: the loss policy auto), ltp:loss=repair (the
paper's Early Close rule, every answer whole), ltp:loss=defer (tolerant
answers from the first step), ltp:budget=B (a fixed loss budget,
docs/transport.md), ltp:code=rs (coded answers), ltp:warmup=N (the loss
policy auto's warm-up of N steps, LTP_LOSS_WARMUP), ltp:compress=C (the
gradients' wire: none keeps float32 at any loss; auto, the default, lets the
loss policy choose bfloat16 under heavy loss), tcp (cubic); an ltp
variant's knobs combine with ':' (ltp:loss=defer:budget=0.7). Each trains the
same model from the same seed at every loss rate (on every port, both ways),
in an order that alternates between loss rates and repeats.

JSON keys: config, results (per variant, per loss rate: iterations_per_s,
final_accuracy, quarter_accuracy (at a quarter of the run: what a tolerance
costs early in training), delivered_fraction, rounds_early_closed, filled_error_mean,
replicas_identical, vs_lossless: its it/s over its own at loss 0,
accuracy_pp: its accuracy minus its own at loss 0, in percentage points),
runs (every run's figures, gather_s and broadcast_s included; a failed run's
error), failed (each failed run's variant, loss and error: it exits 1).
A run that fails or passes --run-timeout is kept as its error and the sweep
goes on.
"""


def register(bsub) -> None:
    p = add_command(bsub, "loss", "training it/s and accuracy against the loss rate, "
                    "LTP's rules and TCP", epilog=EPILOG)
    p.add_argument("--loss", default="0,0.1,0.2,0.3", metavar="P,P,...",
                   help="loss rates on every port (default 0,0.1,0.2,0.3; 0 first gives "
                   "each variant its lossless reference)")
    p.add_argument("--variants", default="ltp,ltp:budget=0.35,tcp",
                   help="comma list of ltp, ltp:loss=repair|defer|auto, ltp:budget=B, "
                   "ltp:code=rs, ltp:warmup=N, ltp:compress=none|auto|uint8|bf16|fp16, tcp; "
                   "an ltp variant's options combine, e.g. ltp:loss=defer:budget=0.7 "
                   "(default ltp,ltp:budget=0.35,tcp)")
    add_workers(p, 4)
    p.add_argument("--iterations", type=int, default=150,
                   help="training iterations per run (default 150)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per variant and loss rate (default 1; medians over them)")
    add_rate(p)
    add_buffer(p)
    p.add_argument("--run-timeout", type=float, default=900.0, metavar="S",
                   help="give a run up after S seconds, keep its error and go on (default "
                   "900; TCP at 20-30 %% loss takes seconds a step)")
    p.add_argument("--plot", metavar="FILE.png", help="draw it/s and accuracy against loss")
    p.add_argument("--name", default="lsweep", help="name of the rig it builds (default "
                   "lsweep; must not exist)")
    add_json(p)
    p.set_defaults(func=cmd_loss)


def cmd_loss(args) -> int:
    from ..control.bench import loss_sweep   # noqa: PLC0415 (torch-free --help)
    losses = []
    for text in args.loss.split(","):
        p = check_loss(text.strip())
        if p in losses:
            raise UsageError(f"--loss: {p:g} twice")
        losses.append(p)
    variants = loss_sweep.parse_variants(args.variants)
    check_workers(args.workers)
    check_name(args.name)
    if not 1 <= args.iterations <= 100_000:
        raise UsageError(f"--iterations: must be in 1..100000, got {args.iterations}")
    if not 1 <= args.repeats <= 20:
        raise UsageError(f"--repeats: must be in 1..20, got {args.repeats}")
    if not args.run_timeout > 0:
        raise UsageError(f"--run-timeout: must be positive seconds, got {args.run_timeout}")
    rate = check_rate(args.rate)
    buffer = parse_size(args.buffer, "--buffer")
    if args.plot:
        from ..control.training.curves import check_outputs   # noqa: PLC0415 (as above)
        check_outputs(None, args.plot)
    need_root("ltp bench loss")
    need_bcc()
    res = loss_sweep.run(losses=losses, variants=variants, workers=args.workers,
                         iterations=args.iterations, rate_bps=rate, buffer_bytes=buffer,
                         repeats=args.repeats, name=args.name,
                         progress=lambda m: print(m, file=sys.stderr, flush=True),
                         run_timeout_s=args.run_timeout)
    if args.plot:
        res["plot"] = loss_sweep.plot(res, args.plot)
    emit(args, res, loss_sweep.table)
    if res["failed"]:     # on stderr: stdout holds the one JSON document above
        print(f"ltp: error: {len(res['failed'])} run(s) failed (the others' figures are "
              "above): " + "; ".join(f"{f['variant']} at loss {f['loss']:g}: {f['error']}"
                                     for f in res["failed"]), file=sys.stderr)
        return 1
    return 0 if all(r["replicas_identical"] for per in res["results"].values()
                    for r in per.values()) else 1
