# SPDX-License-Identifier: Apache-2.0
"""ltpx.torch: train your own PyTorch model over LTP, shaped like Horovod and BytePS.

A stock DDP script needs one changed string instead (backend.py):

    import ltpx.torch                            # registers the backend
    dist.init_process_group("ltp")               # was "gloo" or "nccl"
    model = DistributedDataParallel(Net())       # its buckets go over LTP

or, to choose the options, a comm hook (ddp.py):

    model.register_comm_hook(lt.ddp_state(bubble="zero"), lt.ddp_hook)

The Horovod-shaped API: the same script runs on every rank (started by `ltp launch` or torchrun):

    import ltpx.torch as lt
    lt.init()                      # env:// rendezvous; server ranks serve here and exit
    model = Net()
    lt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = lt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                  named_parameters=model.named_parameters())
    for x, y in loader:
        opt.zero_grad(); F.cross_entropy(model(x), y).backward(); opt.step()
    lt.shutdown()

Gradients go up in buckets over LTP's loss-tolerant class (Early Close,
Bubble Filling); the server sums them and sends the aggregate back over the
reliable class; each worker applies it with its own optimizer. Modules:

  settings     init()'s options (keywords, LTP_* environment variables)
  job          init, shutdown, rank, size, local_rank, is_server: a rank's place
  coord        barriers and metadata through the rendezvous store
  tickets      join tickets: a (re)started worker asking to be taken back
  storevalues  what each store value must hold (the parsers its reader gives Seal.read)
  storegc      the store's keys deleted once every rank has read them
  storeparts   a value over the store's 8 MiB limit (a joiner's state) in parts
  ops          the op sequence every rank runs, round numbers, the step report
  links, link_ltp, link_ltp_worker, link_tcp, link_tcp_worker   the transports under the
               server and the workers
  link_ltp_near  the LTP links' way to a rank on the same host (in memory, or by the
               server's Unix socket), whose frames never reach a NIC
  link_tcp_back  the TCP server's workers that die (their rows filled) and come back
               (read from a new connection once admitted again)
  localsock    the TCP transport's local hop: a Unix socket to a server on this host
  sockchannel  a worker and its LTP server on one host: the Unix socket's pieces up, answers down
  handoff      the TCP transport's hop inside one process: a co-located trainer's worker
               and server meet in memory
  colocate     co-located servers started by the trainers (no server ranks)
  childserver  a co-located trainer's server process
  waits        the line a long wait of a starting rank prints
  runqueue     a thread's waits for a CPU (schedstat): a rank's own time, shared host
  exchange     a worker's side of an op
  server       the server's loop (sums, answers; no model)
  losspolicy   the loss policy: per step, the loss budget and the wire from the loss the
               server measures
  carry        a worker's side of the policy's wire: each piece's rounding carried on
  trace        each rank's ring of its latest rounds/ops, and the job's trace-event file
  breakdown    where a step's time goes: seconds per phase and step, on each rank
  flight       the flight recorder: each rank's phase now and its latest ones in a mapped
               file, dumped as JSON on a stall, SIGUSR1 or an error
  buckets      gradient buckets: reverse registration order, copy in and out
  optimizer    DistributedOptimizer: a run-time subclass of the user's optimizer's class
  gradsync     what it does with a step's gradients (hooks, overlap, wbsp, report, warnings)
  collectives  broadcast_parameters, allreduce, allgather, barrier, digest
  backend      the torch.distributed backend `ltp` (tolerant gradients, exact rest)
  native       the backend's collectives over LTP (broadcast, all-reduce, all-gather,
               reduce-scatter, barrier); gloo for the rest, made at its first use
  ddp          DDP's comm hook and the tolerant bucket reduce, any device
  staging      a bucket's host copy and the answer back (pinned, queued on a GPU)
  host         device addresses; bpffs where `ip netns exec` hid it
  liveness     every rank beats a counter in the store; the others watch it
  elastic      workers that leave and come back, and who hands them the state
  checkpoint   worker 0's checkpoints, for a job whose server may die
  shards       sharded servers: each of S server ranks sums a slice of every piece
  shardplan    sharded servers' slices, and their reports and summaries merged
  codec        8-bit min-max compression, loss-tolerant per chunk
  threads      a daemon thread that runs calls in order (comm and shard threads)
  alias        holds only the `torch` package that makes this `ltpx.torch`

docs/training.md ("Your own model") has the details.
"""
from __future__ import annotations

from .backend import register as _register_backend
from .collectives import allreduce, broadcast_parameters, digest
from .ddp import ddp_hook, ddp_state
from .job import init, is_server, local_rank, rank, serve_here as serve, shutdown, size
from .ops import StepReport
from .. import progress
from .optimizer import DistributedOptimizer, FilledWarning


def report_progress(step: int, steps: int, **metrics) -> None:
    """On worker 0: under `ltp launch`, one JSON line its progress bar draws;
    run any other way, a plain line ("step 10/100  loss 0.31") at most every
    2 s, the first and last always (control/progress.py)."""
    if rank() == 0:
        progress.report(step, steps, metrics)


_register_backend()

__all__ = ["ddp_hook", "ddp_state", "init", "shutdown", "rank", "size", "local_rank", "is_server", "serve",
           "broadcast_parameters", "allreduce", "digest", "DistributedOptimizer",
           "StepReport", "FilledWarning", "report_progress"]
