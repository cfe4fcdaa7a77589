# SPDX-License-Identifier: Apache-2.0
"""A transformer LM under DDP for scripts/ab_loopback.py --job lm (the GPU
goal's job: issue 40): a pre-norm causal transformer (--dim, --layers,
--heads, --vocab; the defaults about 118M parameters), random tokens, AdamW,
bf16 autocast on CUDA, DDP's default 25 MB buckets. Prints one JSON line
per trainer: median step (after --warmup steps), the worker's breakdown,
the servers' (read from the job's summary), a digest of the parameters.

--sample DIR: every process (servers too) samples its threads' stacks
(scripts/stacksample.py) and writes DIR/<role><rank>-<backend>-s<LTP_SERVERS>-<pid>.json
at its end."""
import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ltpx.torch  # noqa: F401  (registers the `ltp` backend)
from ltpx.control.torchapi import backend as ltp_backend, breakdown
from ltpx.control.torchapi.job import placed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stacksample import Sampler  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--backend", default="ltp")
p.add_argument("--dim", type=int, default=768)
p.add_argument("--layers", type=int, default=12)
p.add_argument("--heads", type=int, default=12)
p.add_argument("--vocab", type=int, default=32000)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--warmup", type=int, default=3, help="steps left out of the median")
p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
p.add_argument("--param-dtype", default="float32", choices=("float32", "bfloat16"))
p.add_argument("--bucket-mb", type=float, default=25.0)
p.add_argument("--sample", metavar="DIR", help="sample every thread's stack; reports in DIR")
a = p.parse_args()
if a.steps <= a.warmup:
    p.error(f"--steps ({a.steps}) must be more than --warmup ({a.warmup})")
role = os.environ.get("LTP_ROLE", "worker")
sampler = Sampler().start() if a.sample else None


def dump(name: str) -> None:
    if sampler:
        sampler.stop()
        Path(a.sample).mkdir(parents=True, exist_ok=True)
        tag = f"{a.backend}-s{os.environ.get('LTP_SERVERS', '1')}-{os.getpid()}"
        Path(a.sample, f"{name}-{tag}.json").write_text(json.dumps(sampler.report(30)))


if role == "server":          # a server rank serves inside init_process_group, then exits
    serve = ltp_backend.serve_here

    def serve_and_dump() -> None:
        code = serve()
        dump(f"server{os.environ.get('LTP_RANK', '0')}")
        sys.stdout.flush()
        os._exit(code)
    ltp_backend.serve_and_exit = serve_and_dump

dist.init_process_group(a.backend)
rank = dist.get_rank()
dev = torch.device(a.device if a.device == "cpu" else f"cuda:{rank % torch.cuda.device_count()}")
if dev.type == "cuda":
    torch.cuda.set_device(dev)
torch.manual_seed(0)


class LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(a.vocab, a.dim)
        self.pos = torch.nn.Parameter(torch.zeros(a.seq, a.dim))
        layer = torch.nn.TransformerEncoderLayer(a.dim, a.heads, 4 * a.dim, dropout=0.0,
                                                 batch_first=True, norm_first=True)
        self.body = torch.nn.TransformerEncoder(layer, a.layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(a.dim)
        self.head = torch.nn.Linear(a.dim, a.vocab, bias=False)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(a.seq))

    def forward(self, x):
        h = self.body(self.emb(x) + self.pos, mask=self.mask, is_causal=True)
        return self.head(self.norm(h))


net = LM().to(dev, getattr(torch, a.param_dtype))
model = DDP(net, bucket_cap_mb=a.bucket_mb)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
g = torch.Generator().manual_seed(1 + rank)
x = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g).to(dev)
inp, tgt = x[:, :-1], x[:, 1:]
amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
times, losses = [], []
phases = breakdown.worker()
phases.discard()
for _ in range(a.steps):
    t0 = time.perf_counter()
    phases.start_step()
    opt.zero_grad(set_to_none=True)
    with amp:
        loss = torch.nn.functional.cross_entropy(model(inp).float().flatten(0, 1), tgt.flatten())
    loss.backward()
    opt.step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    phases.end_step()
    times.append(time.perf_counter() - t0)
    losses.append(loss.item())
s = sorted(times[a.warmup:])
h = hashlib.sha256(b"".join(q.detach().cpu().view(-1).view(torch.uint8).numpy().tobytes()
                            for q in net.parameters()))
bd = breakdown.worker_summary() if a.backend == "ltp" else None
tolerant = placed().tolerant if a.backend == "ltp" else None
reduce_stats = tolerant.stats() if tolerant is not None else None
del model
dist.destroy_process_group()
summary = placed().summary if a.backend == "ltp" else None
servers = [summary] if isinstance(summary, dict) and "breakdown" in summary else \
    (summary or {}).get("servers", []) if isinstance(summary, dict) else []
dump(f"worker{rank}")
res = json.dumps({"event": "result", "rank": rank, "backend": a.backend, "device": str(dev),
                  "params": sum(q.numel() for q in net.parameters()),
                  "step_med_s": round(s[len(s) // 2], 4), "step_min_s": round(s[0], 4),
                  "loss_last": round(losses[-1], 4), "reduce": reduce_stats,
                  "breakdown": bd and {"median": bd["median"], "comm": bd["comm"]["median"]},
                  "server_breakdown": [x.get("breakdown") and x["breakdown"]["median"]
                                       for x in servers if isinstance(x, dict)],
                  "digest": h.hexdigest()[:16]})
# one write (torchrun runs its ranks unbuffered on one stdout: print's
# two writes, text and newline, interleave with a neighbour's)
sys.stdout.write(res + "\n")
sys.stdout.flush()
