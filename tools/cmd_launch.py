# SPDX-License-Identifier: Apache-2.0
"""`ltp launch`: torchrun for rigs. Runs one command per rank inside a rig's namespaces.

Builds a rig (or uses the named one), hosts the rendezvous store on the PS
namespace's loopback, and starts COMMAND once per rank: the server rank(s)
on the PS host (--colocate: beside the workers), worker k on host w<k // R>
(--ranks-per-node R, 1 by default; over LTP each rank on a host of its own,
a rig with nodes: launcher/plan.py), each with torchrun's env:// variables
and the LTP_* settings `ltpx.torch.init()` reads (device, address, XDP mode,
capacity, MTU, group address). Every line a rank prints comes out prefixed
with its rank ([s0], [w0], ...); a JSON line {"event": "progress", "step",
"steps", ...} from worker 0 (lt.report_progress) drives a progress bar on a
terminal. When a rank fails the others are stopped (after --grace
seconds, 0 by default), unless --max-restarts N allows a restart (restarts.RestartPolicy): a
worker is started again in its namespace and rejoins the running job, a
server's death (or any rank's in a sharded job) starts every rank again;
each restart is a `[launch] ...` line on stderr. The rig is removed at the
end unless --keep (or it was there before). The exit code is the worst
rank's, and the summary says whose ("exit 2 (w1's own exit code)": a
script's 2 is not ltp's usage error); -j prints one JSON summary (exit_from:
the ranks the code is from; per rank: exit code, wall time, the last JSON
object it printed; the restarts; the merged trace under --trace; the hang
screens, control/launcher/hangs.py; root_cause, the first failure).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ..control.progress import Throttle, describe, metrics_text
from ..control import settings_table
from ..control.settings_table import DOWNLINKS, LAUNCH, add_flag, to_env
from ..control.training import RANK_MODULES
from .common import UsageError, add_command, add_json, need_bcc, need_root, wants_json
from .train_text import cause_lines, stall_lines
from .flags import MAX_WORKERS, add_buffer, add_loss, add_rate
from .cmd_launch_checks import check_args, check_kept_shape

EPILOG = """The command runs once per rank: `python` and a leading .py file mean this
interpreter (the one with torch and ltpx). In the script, `lt.init()` or
`dist.init_process_group("ltp")` finds everything it needs in the
environment (docs/training.md). RANK, WORLD_SIZE and LOCAL_RANK mean what
torchrun means (the trainers only); MASTER_ADDR:MASTER_PORT reaches the
store from every rank's namespace; a server rank has LTP_ROLE=server.

examples:
  sudo ltp launch --workers 4 -- python docs/examples/digits_cnn.py
  sudo ltp launch --workers 8 --loss 0.01 -j -- python docs/examples/big_model.py --epochs 1
  sudo ltp launch --workers 2 --transport tcp -- python my_train.py
  sudo ltp launch --workers 4 --downlink unicast -- python my_train.py
      (answers to each worker: no member holds a key to forge one for all)
  sudo ltp launch --workers 4 --rig myrig --keep -- python my_train.py     (the rig stays)
  sudo ltp launch --workers 8 --servers 2 -- python my_train.py   (2 servers, a slice each)
  sudo ltp launch --workers 4 --colocate -- python my_train.py
      (no server hosts: a server beside each worker, a quarter of every bucket each; over
      LTP each rank has a device of its own, a node's devices share one link)
  sudo ltp launch --workers 8 --ranks-per-node 2 --colocate --transport tcp -- python my_train.py
      (4 hosts of 2 trainers and 2 servers, each host's one device shared)
  sudo ltp launch --workers 8 --ranks-per-node 4 --share-nic -- python docs/examples/ddp_backend.py
      (2 hosts of 4 trainers over LTP, each host's one device shared by its 4 XDP
      programs through the mux, ports 7411-7414; the server on a host of its own)
  sudo ltp launch --workers 4 --colocate --share-nic -- python docs/examples/ddp_backend.py
      (no server ranks at all: each trainer starts its server, which sums a quarter of
      every bucket; the trainer's worker and server are seats of its host's one device,
      its own slice off the wire, by the server's Unix socket; LTP_COLOCATE=1)
  sudo ltp launch --workers 4 -- python docs/examples/ddp_backend.py
      (a stock DDP script over init_process_group("ltp"); RANK and WORLD_SIZE count
      the trainers, as under torchrun)
  sudo ltp launch --workers 4 --servers 0 -- python docs/examples/ddp_backend.py --backend gloo
      (no server rank: the same script over gloo)
  sudo ltp launch --workers 4 --trace /tmp/job.json -- python docs/examples/digits_cnn.py
      (every rank's rounds and ops in one Perfetto/chrome://tracing file;
      `ltp trace summary /tmp/job.json`)
  sudo ltp launch --workers 4 --max-restarts 2 -- python docs/examples/digits_cnn.py
      (a dead server: the job starts over, twice at most; digits_cnn.py does not
      rejoin, so a dead worker's restarts fail at their first op)

Keys: the server rank(s) get the job key file (LTP_SECRET_FILE's, else one
made for the job), each worker a member key file of its own (its keys only;
the group key unless --downlink or LTP_DOWNLINK is unicast), named in LTP_SECRET_FILE and
removed at the end (docs/operations.md, "Threat model").

A rank that waits on others past max(1.5 x its median op, 0.25 s), or gets
SIGUSR1 (`kill -USR1 PID`), writes its flight recorder's ring as JSON, and
the launcher prints one [hang] line per rank: the op and phase it is in,
whom it waits for, the last packet from each peer and its age, its process
state (docs/slow-or-stuck.md).

--max-restarts N: a worker that exits non-zero or dies by a signal is started
again (at most N times per rank) and rejoins the running job with a live
worker's state, if the script rejoins (ltpx.torch's elastic.joining/rejoin/
donate: docs/training.md, "Faults"); a script that does not fails again at its
first op. A dead server restarts every rank (at most N times per job): a
script that resumes from a checkpoint (--checkpoint-dir style flags) goes on
from there, any other starts over. With --servers > 1 (or --colocate with
more than one worker) any rank's death restarts every rank (a worker cannot
rejoin a sharded job).
"""


def register(sub) -> None:
    p = add_command(sub, "launch", "run a training script on every rank of a netns rig "
                    "(torchrun for rigs)",
                    description="Run COMMAND once per rank inside a network-namespace rig "
                    "(server rank(s) on the PS host or beside the workers, R workers per worker "
                    "host), with the "
                    "env:// rendezvous and the LTP settings ltpx.torch.init() reads.",
                    epilog=EPILOG)
    p.add_argument("--workers", type=int, default=2, help=f"worker ranks, 1..{MAX_WORKERS} "
                   "(default 2)")
    add_flag(p, "servers", LAUNCH, lo=0, help="; a new rig gets that many server hosts "
             "(`ltp rig up --servers S`); 0: a script that does not use LTP (gloo, nccl)")
    add_flag(p, "transport", LAUNCH, help=", on an skb-mode rig")
    p.add_argument("--ranks-per-node", type=int, default=1, metavar="R",
                   help="workers on each node (LOCAL_RANK 0..R-1; --workers counts them "
                   "all): over TCP, or a script without LTP (--servers 0), they share the "
                   "node's device; over LTP each has a device of its own and the node's "
                   "devices share one link (default 1)")
    p.add_argument("--share-nic", action="store_true",
                   help="over LTP, a node's workers share its one device: each rank's XDP "
                   "program takes a seat of the device's mux, found by its own UDP port "
                   "(LTP_SHARE_DEV, LTP_UDP_PORT), instead of a device of its own; answers to "
                   "a node's several workers go by unicast. With --colocate: no server "
                   "ranks, each trainer's server in its own process, a seat of the same "
                   "device (LTP_COLOCATE=1)")
    p.add_argument("--colocate", action="store_true",
                   help="no server hosts: a server beside every worker, on its node, each "
                   "summing 1/workers of every bucket (servers = workers)")
    add_rate(p)
    add_buffer(p)
    add_loss(p)
    p.add_argument("--mtu", type=int, default=1500, help="MTU of every rig link, 1280..3500 "
                   "(default 1500)")
    p.add_argument("--downlink", choices=DOWNLINKS, default=None,
                   help="LTP's parameter downlink, for every rank (LTP_DOWNLINK): group gives "
                   "workers the group key (any member could then forge a GROUP answer), "
                   "unicast binds every frame to its sender (default: LTP_DOWNLINK, else group)")
    p.add_argument("--rig", default=None, metavar="NAME",
                   help="use rig NAME (built if it does not exist; a rig that existed stays)")
    p.add_argument("--keep", action="store_true", help="leave the rig up afterwards")
    p.add_argument("--timeout", type=float, default=0.0,
                   help="stop every rank after this many seconds (default 0: no limit)")
    p.add_argument("--grace", type=float, default=0.0,
                   help="after a rank fails, seconds the others get before they are stopped "
                   "(default 0: at once, as torchrun does)")
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="restart a failed worker rank (at most N times per rank; it rejoins "
                   "the running job), or every rank after a server fails (at most N times); "
                   "default 0: a failed rank stops the others")
    p.add_argument("--trace", default=None, metavar="FILE.json",
                   help="write the job's Chrome trace-event file (Perfetto): every rank's "
                   "rounds and ops, merged at the end (docs/slow-or-stuck.md)")
    add_json(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command and its arguments")
    p.set_defaults(func=cmd_launch)


def cmd_launch(args) -> int:
    cmd = check_args(args)
    need_root("ltp launch")
    if args.transport == "ltp":
        need_bcc()
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")   # before torch is imported
    from ..control.launcher import forkserver
    from ..control.launcher.launch import python_argv
    if forkserver.plan(python_argv(cmd)):   # torch, ltpx.torch (and the built-in job's rank:
        forkserver.warm(RANK_MODULES)       # a COMMAND too) imported while the rig is built
    from ..dataplane.rig.signals import sigterm_as_exit
    from ..dataplane.rig.star import Rig
    import dataclasses
    kept = bool(args.rig and Rig.exists(args.rig))
    if kept:
        rig = Rig.attach(args.rig)
        if len(rig.workers) < args.workers // (1 if rig.config.nodes else args.ranks_per_node):
            raise UsageError(f"--workers: rig {args.rig} has only {len(rig.workers)} worker "
                             "hosts")
        check_kept_shape(args, rig)
        if args.servers > 1 and not args.colocate and len(rig.servers) < args.servers:
            raise UsageError(f"--servers: rig {args.rig} has {len(rig.servers)} server "
                             f"host(s); build it with `ltp rig up --servers {args.servers}`")
    else:
        name = args.rig or f"ln{os.getpid() % 1000000}"
        rig = Rig(dataclasses.replace(args.rig_config, name=name))
    out = Output(wants_json(args))
    if not kept:     # its name now: a launcher killed before its end leaves it to find
        c = rig.config
        out.note(f"building rig {c.name}" + (" (no rig of that name exists)" if args.rig else "")
                 + f": {c.workers} workers, {c.rate_bps / 1e9:g} Gbit/s, "
                 f"{c.buffer_bytes / 1000:g} kB queue, loss {c.loss:g}"
                 + ("; it stays (--keep)" if args.keep else "; removed at the end"))
    job: dict = {}          # the ranks and policy of the job running now, for a stop's report
    if args.trace:
        import tempfile
        args.trace_dir = tempfile.mkdtemp(prefix="ltp-trace-")
    with sigterm_as_exit():     # SIGTERM unwinds as Ctrl-C does: ranks stopped, rig removed
        try:
            if kept or args.keep:
                if not kept:
                    rig.up()
                ranks, timed_out, policy = _run(rig, args, python_argv(cmd), out, job)
            else:
                with rig:
                    ranks, timed_out, policy = _run(rig, args, python_argv(cmd), out, job)
        except (KeyboardInterrupt, SystemExit) as e:
            # Ctrl-C or SIGTERM: the ranks were stopped and the rig removed on the
            # way out; say who was stopped, as a failure's summary does
            if isinstance(e, SystemExit) and e.code != 143 or "ranks" not in job:
                raise
            out.close()
            return _report(args, rig, cmd, job["ranks"], False, kept or args.keep, job["policy"],
                           stopped_by="SIGINT" if isinstance(e, KeyboardInterrupt) else "SIGTERM",
                           running=job.get("running", []))
        finally:
            out.close()
    trace = _merge_trace(args, out)
    return _report(args, rig, cmd, ranks, timed_out, kept or args.keep, policy, trace=trace,
                   hangs=job.get("hangs"),
                   stalls=job["flight"].stall_summary() if "flight" in job else None)


def in_trainers(args) -> bool:
    """`--colocate --share-nic` over LTP: no server ranks to start; each
    trainer's server runs in its process, its worker and server seats of
    its host's device (LTP_COLOCATE=1; docs/deploy.md, Co-located servers)."""
    return args.colocate and args.share_nic and args.transport == "ltp"


def downlink(args, environ=None) -> str:
    """The job's downlink: --downlink, else LTP_DOWNLINK, else group."""
    return args.downlink or settings_table.env("downlink", environ)


def group_keys(args, environ=None) -> bool:
    """Whether workers get the group key in their member key files: on LTP,
    unless the downlink is unicast (the job never sends to the group: then
    no member can forge a GROUP answer; a script that still asks for group
    answers gets each worker's by unicast repair)."""
    return args.transport == "ltp" and downlink(args, environ) != "unicast"


def _downlink_env(args) -> dict:
    """--downlink: every rank's LTP_DOWNLINK (else what this environment has)."""
    return to_env({"downlink": args.downlink}) if args.downlink else {}


def _trace_env(args, r) -> dict:
    """--trace: each rank writes its own view into the launch's trace folder."""
    if not args.trace:
        return {}
    return to_env({"trace": os.path.join(args.trace_dir, f"rank{r.rank}.json"),
                   "trace_ranks": True})


def _merge_trace(args, out) -> dict | None:
    """--trace: the ranks' files merged into one (trace.merge_ranks); what the
    summary says of it."""
    import shutil
    if not args.trace:
        return None
    from ..control.torchapi.trace import merge_ranks, write  # noqa: PLC0415 (torch: after the job)
    paths = [os.path.join(args.trace_dir, n) for n in os.listdir(args.trace_dir)
             if n.startswith("rank") and ".json" in n and not n.endswith(".tmp")]
    t, skipped = merge_ranks(paths, {"job": "ltp launch", "files": len(paths)})
    write(args.trace, t)
    shutil.rmtree(args.trace_dir, ignore_errors=True)
    out.note(f"trace of {len(paths) - len(skipped)} rank file(s) in {args.trace}"
             + (f" ({len(skipped)} unreadable)" if skipped else ""))
    return {"file": args.trace, "rank_files": len(paths) - len(skipped),
            "events": len(t["traceEvents"])}


def _run(rig, args, argv: list[str], out: Output, now: dict):
    """Run the job to its end: again from the start after a RestartJob (every
    rank, a new store), as long as the policy allows. `now` holds the ranks
    and the policy of the job running (for the report when a signal stops it)."""
    from ..control.launcher import forkserver, restarts
    from ..control.launcher.launch import RigJob, follow, job_env
    from ..control.launcher.plan import plan_ranks
    from ..dataplane.rig.signals import deferred_signals
    inside = in_trainers(args)     # the servers start in the trainers' processes
    # a sharded job, or trainers that serve: any rank's death restarts them all
    policy = restarts.RestartPolicy(args.max_restarts, whole_job=args.servers > 1 or inside,
                                    say=out.note)
    servers = 0 if inside else args.servers
    t_end = time.monotonic() + args.timeout if args.timeout else None
    while True:
        try:
            ranks = plan_ranks(rig, args.workers, servers, args.colocate and not inside,
                               args.ranks_per_node)
        except ValueError as e:     # a kept rig of another shape; the message names the flag
            raise UsageError(f"--{e}") from None
        now.update(ranks=ranks, policy=policy)
        if policy.job_restarts and forkserver.plan(argv):
            forkserver.warm(RANK_MODULES)   # the last job's closed with it
        job = None
        try:
            job = RigJob(rig, ranks, group_keys=group_keys(args), preload=RANK_MODULES,
                         colocated=inside)
            now["hangs"] = job.flight.screens    # (a restarted job's go on in a new list)
            now["flight"] = job.flight
            job.on_hang = lambda lines: [out.note(f"[hang] {ln}") for ln in lines]
            job.start(lambda r: argv, lambda r, port=job.port, ranks=ranks: {**job_env(
                rig, r, len(ranks), port, servers=servers, transport=args.transport,
                share=args.share_nic, colocated=inside),
                **_trace_env(args, r), **_downlink_env(args)})
            timed_out = follow(job, out.line, policy, grace_s=args.grace, t_end=t_end)
            return ranks, timed_out, policy
        except restarts.RestartJob:
            continue
        except (KeyboardInterrupt, SystemExit):   # the ranks the signal found running
            now["running"] = [r.label for r in ranks if r.proc is not None and r.code is None]
            raise
        finally:
            if job is not None:
                with deferred_signals():      # a second signal does not cut the stop short
                    job.close()


class Output:
    """Each rank's lines, prefixed; worker 0's progress events as a bar on a
    terminal, as plain lines at most every 2 s otherwise (JSON under -j)."""

    def __init__(self, json_mode: bool):
        self.json_mode = json_mode
        self.bar = self.task = None
        self.throttle = Throttle()      # progress as plain lines off a terminal
        if not json_mode and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
            self.bar = Progress(TextColumn("step"), BarColumn(bar_width=30),
                                MofNCompleteColumn(), TextColumn("{task.fields[info]}"))

    def line(self, r, stream: str, text: str) -> None:
        r.heard(stream, text)
        msg = _json(text)
        if msg is not None and stream == "stdout":
            r.last_json = msg
        if msg is not None and msg.get("event") == "progress" and not self.json_mode:
            if self.bar is not None:
                self.progress(msg)
            elif self.throttle.due(msg.get("step", 0), msg.get("steps")):
                plain = {k: v for k, v in msg.items() if k not in ("event", "step", "steps")}
                print(f"[{r.label}] " + describe(msg.get("step", 0), msg.get("steps"), plain),
                      flush=True)
            return
        dest = sys.stderr if (self.json_mode or stream == "stderr") else sys.stdout
        line = f"[{r.label}] {text}"
        if self.bar is not None and self.task is not None:
            self.bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=dest, flush=True)

    def note(self, text: str) -> None:
        """The launcher's own line (a restart), on stderr."""
        line = f"[launch] {text}"
        if self.bar is not None and self.task is not None:
            self.bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def progress(self, msg: dict) -> None:
        info = metrics_text({k: v for k, v in msg.items() if k not in ("event", "step", "steps")})
        if self.task is None:
            self.bar.start()
            self.task = self.bar.add_task("step", total=msg.get("steps"), info=info)
        self.bar.update(self.task, completed=msg.get("step", 0), info=info)

    def close(self) -> None:
        if self.task is not None:
            self.bar.stop()


def _json(text: str) -> dict | None:
    """A line's JSON object, or None."""
    try:
        obj = json.loads(text) if text.lstrip().startswith("{") else None
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _report(args, rig, cmd: list[str], ranks, timed_out: bool, kept: bool, policy,
            stopped_by: str | None = None, running: list[str] | None = None,
            trace: dict | None = None, hangs: list | None = None,
            stalls: dict | None = None) -> int:
    """The summary (JSON under -j, else a line and a row per rank on stderr)
    and the launch's exit code: 0, the worst rank's, 124 on --timeout, 130
    or 143 when SIGINT or SIGTERM stopped the launch."""
    from ..control.launcher.launch import exit_code, first_failure
    own = sorted(((exit_code(r.code), r.label) for r in ranks if not r.killed), reverse=True)
    worst, source = own[0] if own else (0, None)
    if stopped_by:
        worst, source = (130 if stopped_by == "SIGINT" else 143), None
    elif timed_out:
        worst, source = 124, None
    elif worst == 0:
        source = None
        if any(r.killed for r in ranks):
            worst = 143
    # whose code the launch exits with: a rank's own (a script's 2 is no usage error of ltp's)
    whose = ([lb for code, lb in own if code == worst] if source else [])
    c = rig.config
    cause = first_failure(ranks)
    summary = {"exit_code": worst, "exit_from": whose, "timed_out": timed_out,
               "root_cause": cause,
               "stopped_by": stopped_by, "command": cmd, "colocated": args.colocate,
               "ranks_per_node": args.ranks_per_node, "share_nic": args.share_nic,
               **policy.report(), "trace": trace, "hangs": hangs or [], "stalls": stalls,
               "rig": {"name": rig.name, "kept": kept, "mode": c.mode, "rate_bps": c.rate_bps,
                       "buffer_bytes": c.buffer_bytes, "loss": c.loss, "mtu": c.mtu,
                       "servers": c.servers, "nodes": c.nodes},
               "ranks": [{"rank": r.rank, "torch_rank": r.torch_rank, "role": r.role,
                          "label": r.label, "host": r.host.name, "node": r.node,
                          "netns": r.host.netns, "exit_code": exit_code(r.code),
                          "killed": r.killed, "forked": r.forked,
                          "restarts": policy.restarts.get(r.rank, 0),
                          "wall_s": round(r.wall_s, 3) if r.wall_s is not None else None,
                          "last_json": r.last_json} for r in ranks]}
    if wants_json(args):
        print(json.dumps(summary))
    else:
        rows = [f"{r['label']:>4}  {r['torch_rank']:<9} {r['host']:<5} exit {r['exit_code']:<4}"
                f"{'(stopped) ' if r['killed'] else ''}{r['wall_s'] or 0:8.2f} s"
                f"{'  restarted %dx' % r['restarts'] if r['restarts'] else ''}" for r in
                summary["ranks"]]
        tail = f"rig {rig.name} kept" if kept else f"rig {rig.name} removed"
        again = f"; the job restarted {policy.job_restarts}x" if policy.job_restarts else ""
        src = (f" ({', '.join(whose)}'s own exit code)" if len(whose) == 1 else
               f" (the ranks' own exit code: {', '.join(whose)})") if whose else ""
        stop = ""
        if stopped_by:
            # the ranks the signal found running (a terminal's Ctrl-C reaches them
            # too, so they may have ended on their own before the stop)
            gone = running or [r["label"] for r in summary["ranks"] if r["killed"]]
            stop = (f"stopped by {stopped_by}" + (f" ({', '.join(gone)} stopped)" if gone else "")
                    + "; ")
        print("\n".join(["", "ltp launch: " + stop + ("timed out; " if timed_out else "") +
                         f"exit {worst}{src}{again}; {tail}", *rows, *stall_lines(stalls),
                          *cause_lines(cause)]), file=sys.stderr)
    return worst
