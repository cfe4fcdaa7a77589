# SPDX-License-Identifier: Apache-2.0
"""`ltp bench`: benchmarks that print numbers (and JSON with -j).

  ltp bench xdp [-j] [--packets N]   ns per packet: XDP DATA path vs its copy floor, by stage; ACK
                                     path, ACK clock; a socket loop
  ltp bench xdp --against DIR        A/B: bpf/ against DIR/ (DATA, ACK, clock), alternating blocks
  ltp bench incast [...]             LTP vs TCP cubic/BBR vs the line-rate limit
  ltp bench paths [-j] [--trials 10] two jobs over a leaf-spine: ECMP vs pinned paths
  ltp bench soak --minutes M [-j]    ltp train for M minutes: do RSS, fds, BPF objects stay flat?
  ltp bench agg [-j]                 the server's summing vs memcpy and streaming-add floors
"""
from __future__ import annotations

import sys
from pathlib import Path

from . import cmd_bench_agg, cmd_bench_loss
from .common import (UsageError, add_command, add_json, emit, need_bcc, need_root, parse_size,
                     wants_json)
from .flags import (MAX_WORKERS, add_buffer, add_loss, add_rate, add_size, add_workers,
                    check_bytes, check_loss, check_rate)

PATHS_MAX_WORKERS = 16    # mirrors LeafSpineConfig: workers per job 1..16 (import-free for --help)

INCAST_EPILOG = """examples:
  ltp bench incast
  ltp bench incast --workers 8 --rounds 20 --loss 0.01 -j
  ltp bench incast --sweep-workers 4,8,16,32 --plot incast.png
  ltp bench incast --transports ltp,tcp-cubic --size 1MiB
  ltp bench incast --transports ltp-xdp,ltp-socket,tcp-cubic --rounds 20
  ltp bench incast --workers 1 --rate 32gbit --buffer 4mb --size 16MiB \\
      --transports ltp-xdp,ltp-xdp:credit=0,tcp-cubic

Builds one fresh rig per configuration (every worker pushes SIZE bytes to the PS
through a TBF bottleneck toward the PS); transports take turns in blocks of
--block rounds, each block after warm-up rounds that are not counted (the first
block of each LTP sender on a rig after 8 more: a rig's first rounds are slow).
--workers 1 is a single-flow measurement (e.g. --workers 1 --rate 32gbit --buffer
4mb --size 16MiB). LTP's senders: ltp-socket (the paced socket) and ltp-xdp (the ACK clock)
A/B both in one run on the same endpoints; plain ltp uses --sender's. An LTP
transport may carry knobs, each variant its own label in the same run:
:credit=N caps the PS's credit at N frames (0: no cap; default 256, a receive
ring); :poll=N has the ACK clock poll every N us (0: adaptive, the default);
:rto=N makes the ACK clock's RTO N round trips (0: a fixed 2 ms; default 2).

JSON keys: config, limit_s, results (per transport: median_s, p99_s, max_s,
median_over_limit, p99_over_limit, delivered, rounds, goodput_bps: payload bits
delivered / round time, cpu_s_per_round: the machine's busy CPU seconds from
/proc/stat per counted round, reasons: rounds per close reason, path_drops:
packets the rig dropped during its blocks (TBF queues, veths, injector);
LTP's also sender, sent, clock_share: DATA the ACK clock made / DATA sent,
pushes: counted pushes per sender that made them (xdp, socket), sender_whys:
pushes per why (auto sends toward a path losing over 6 % by the socket),
credit_frames: the PS's credit, all flows together, missing_chunks: chunks
missing at close, cut_worst: per round closed with chunks missing, the most
one flow missed), ratios (per LTP
transport, per other transport: median, p99, goodput, cpu_s_per_round, this
over that), schedule ([transport, rounds] per block, in the order run),
early_close (LTP's rule; with --early-close progress,capacity every LTP
transport runs under both, labelled e.g. ltp-socket@capacity),
speedup and ltp_over (the first LTP transport's: each other's median over
its; its goodput and cpu_s_per_round over each other's).
"""

PATHS_EPILOG = """examples:
  ltp bench paths
  ltp bench paths -j --trials 10 --rounds 5

JSON keys: ecmp and pinned, each with job_round_median_s (per job),
shared_link_fraction, collision_trial_fraction, link_bytes, trials; plus
isolated_round_median_s (job 0 alone). See docs/paths.md.
"""


def register(sub) -> None:
    p = add_command(sub, "bench", "benchmarks (print numbers; -j for JSON)",
                    epilog="examples:\n  ltp bench xdp\n  ltp bench xdp -j --packets 50000\n"
                           "  ltp bench incast --workers 16 --rounds 30\n"
                           "  ltp bench loss --loss 0,0.1,0.2\n"
                           "  ltp bench agg -j\n")
    bsub = p.add_subparsers(dest="bench", metavar="BENCH")
    x = add_command(bsub, "xdp", "ns per packet of the XDP DATA path vs a Python socket loop",
                    epilog="examples:\n  ltp bench xdp -j\n"
                           "  ltp bench xdp --against /tmp/old-bpf --packets 200000 --blocks 20\n"
                           "\nJSON keys: xdp_ns_per_packet, copy_floor_ns_per_packet, "
                           "over_floor (DATA path / floor), published_floor_ns_per_packet "
                           "(the copy and its done bit), over_published_floor, stage_ns "
                           "(where the rest goes), "
                           "xdp_capture_ns_per_packet (while `ltp capture` records every "
                           "frame), capture_over_floor, capture_over_published_floor, "
                           "ack_ns_per_packet, "
                           "clock_ns_per_packet (an ACK grown into the next DATA), arms, "
                           "socket_ns_per_packet, speedup (and the raw figures); "
                           "with --against, per path (data, capture, csum, ack, clock): this, against_arm "
                           "(ns_per_packet, median_ns, block_ns), ratio (this / against), "
                           "median_ratio, block_ratios\n")
    x.add_argument("--packets", type=int, default=20000,
                   help="packets to time per arm (default 20000)")
    x.add_argument("--against", metavar="DIR",
                   help="A/B: time bpf/ against DIR/ (another version of the program, same "
                        "maps; e.g. `git show REV:bpf/FILE` of each file into DIR) in "
                        "alternating blocks of one run")
    x.add_argument("--blocks", type=int, default=10,
                   help="blocks the arms alternate in (default 10)")
    add_json(x)
    x.set_defaults(func=cmd_xdp)
    _register_incast(bsub)
    _register_paths(bsub)
    _register_soak(bsub)
    cmd_bench_loss.register(bsub)
    cmd_bench_agg.register(bsub)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])


def _register_incast(bsub) -> None:
    i = add_command(bsub, "incast", "LTP vs TCP cubic and BBR vs the line-rate limit under incast",
                    epilog=INCAST_EPILOG)
    add_workers(i, 16)
    add_rate(i)
    add_buffer(i)
    add_size(i, "256KiB")
    i.add_argument("--rounds", type=int, default=30, help="counted rounds per transport (30)")
    add_loss(i)
    i.add_argument("--transports", default="ltp,tcp-cubic,tcp-bbr",
                   help="comma list of ltp, ltp-socket, ltp-xdp, ltp-auto (the default sender, "
                   "choosing per push), tcp-cubic, tcp-bbr, run in this order in each turn")
    i.add_argument("--block", type=int, default=10,
                   help="counted rounds per block before the next transport's turn (10)")
    i.add_argument("--sweep-workers", default="", metavar="N,N,...",
                   help="repeat over these worker counts and report the scaling")
    i.add_argument("--mtu", type=int, default=1500, help="rig MTU (1280..3500, default 1500)")
    i.add_argument("--sender", default=None, metavar="auto|socket|xdp",
                   help="how plain ltp's pushes leave: xdp (the ACK clock), socket (paced) or "
                   "auto (the default): xdp where `ltp doctor`'s grow check passes, else socket, "
                   "and socket toward a worker whose path loses more than 6 %% of the packets "
                   "(the JSON's config says which and why); to A/B them: --transports "
                   "ltp-auto,ltp-xdp,ltp-socket,...")
    i.add_argument("--early-close", default="progress", metavar="RULE[,RULE]",
                   help="Early Close deadline rule(s) of LTP: progress (default) or capacity "
                   "(the fixed-capacity rule, kept for A/B); two run every LTP transport under each, "
                   "labelled TRANSPORT@RULE, in alternating blocks")
    i.add_argument("--plot", metavar="FILE.png", help="write a CDF (and scaling) plot")
    i.add_argument("--name", default="bench", help="name of the rig it builds (default bench; "
                   "must not exist)")
    add_json(i)
    i.set_defaults(func=cmd_incast)


def _register_paths(bsub) -> None:
    pa = add_command(bsub, "paths", "two jobs over 2 spines: plain ECMP vs pinned paths vs one "
                     "job alone", epilog=PATHS_EPILOG)
    pa.add_argument("--trials", type=int, default=10, help="trials per policy (default 10; "
                    "ECMP draws new source ports each trial)")
    pa.add_argument("--rounds", type=int, default=5, help="rounds per job per trial (default 5)")
    add_size(pa, "512KiB")
    add_workers(pa, 2, most=PATHS_MAX_WORKERS, note="per job")
    add_rate(pa, "100mbit", note="every leaf-spine link; low enough that the shared CPU is not "
             "the bottleneck")
    add_buffer(pa, "60kb", note="per leaf-spine link")
    add_json(pa)
    pa.set_defaults(func=cmd_paths)


SOAK_EPILOG = """examples:
  sudo ltp bench soak --minutes 10
  sudo ltp bench soak --minutes 2 --workers 2 --sample-s 5 -j
  sudo ltp bench soak --minutes 30 --loss 0.01 --warmup-s 120

Runs `ltp train` (LTP, --loss on every rig port, far more iterations than it
can run) on a rig of its own for M minutes and stops it with SIGTERM; every
SAMPLE_S seconds reads each of its processes (ltp train and every rank) for
RSS and open fds, the BPF programs and maps the job holds and the machine
has, and the LTP records. Exit 0 when flat: RSS growth <= 5 % per process
from the first sample after warm-up to the end, fds and the job's BPF objects
constant, and nothing of the job left after it (BPF objects, records, rig,
processes); exit 1 naming what grew. A line per sample on stderr. JSON keys:
flat, grew, notes, processes, rss_kb, fds, bpf, records, leftovers, job,
config, series.
"""


def _register_soak(bsub) -> None:
    s = add_command(bsub, "soak", "ltp train for M minutes: RSS, fds, BPF objects and records "
                    "stay flat?", epilog=SOAK_EPILOG)
    s.add_argument("--minutes", type=float, default=10.0, help="length of the soak (default 10)")
    add_workers(s, 4)
    add_loss(s, "0.05")
    s.add_argument("--sample-s", type=float, default=10.0,
                   help="seconds between samples (default 10)")
    s.add_argument("--warmup-s", type=float, default=None,
                   help="seconds after every rank is up before judging starts (default: 10 %% "
                   "of the soak, at most 60)")
    s.add_argument("--name", default=None, help="name of the rig the job builds (default "
                   "soak<pid>; must not exist)")
    add_json(s)
    s.set_defaults(func=cmd_soak)


def cmd_soak(args) -> int:
    if not (0 < args.minutes <= 24 * 60):
        raise UsageError(f"--minutes: must be in (0, 1440], got {args.minutes:g}")
    if not (0.5 <= args.sample_s <= args.minutes * 60):
        raise UsageError(f"--sample-s: must be in 0.5..the soak's {args.minutes * 60:g} s, "
                         f"got {args.sample_s:g}")
    if args.warmup_s is not None and not 0 <= args.warmup_s < args.minutes * 60:
        raise UsageError(f"--warmup-s: must be in [0, the soak's {args.minutes * 60:g} s), "
                         f"got {args.warmup_s:g}")
    if not 1 <= args.workers <= MAX_WORKERS:
        raise UsageError(f"--workers: must be in 1..{MAX_WORKERS}, got {args.workers}")
    from ..dataplane.rig.base import NAME_RE
    if args.name is not None and not NAME_RE.match(args.name):
        raise UsageError(f"--name: a-z 0-9 _ up to 12 characters, got {args.name!r}")
    loss = check_loss(args.loss)
    need_root("ltp bench soak")
    need_bcc()
    from ..control.bench import soak, soak_report
    cfg = soak.SoakConfig(minutes=args.minutes, workers=args.workers, loss=loss,
                          sample_s=args.sample_s, warmup_s=args.warmup_s, name=args.name or "")
    res = soak.run(cfg, progress=lambda m: print(m, file=sys.stderr, flush=True))
    emit(args, res, soak_report.table)
    if not res["flat"] and wants_json(args):
        print(f"ltp: soak not flat: {'; '.join(res['grew'])}", file=sys.stderr)
    return 0 if res["flat"] else 1


def cmd_paths(args) -> None:
    size = parse_size(args.size, "--size")
    if size % 4 or size < 4:
        raise UsageError("--size must be a positive multiple of 4 bytes (float32 elements)")
    if args.trials < 1 or args.rounds < 1 or not 1 <= args.workers <= PATHS_MAX_WORKERS:
        raise UsageError(f"--trials and --rounds must be >= 1, --workers in "
                         f"1..{PATHS_MAX_WORKERS}")
    rate, buf = check_rate(args.rate), check_bytes(args.buffer, "--buffer")
    need_root("ltp bench paths")
    need_bcc()
    from ..control.bench import paths as bench_paths
    res = bench_paths.run(trials=args.trials, rounds=args.rounds, nelems=size // 4,
                          rate_bps=rate, buffer_bytes=buf, workers=args.workers,
                          progress=_progress(args))
    emit(args, res, bench_paths.table)


def cmd_xdp(args) -> None:
    if args.packets < 100:
        raise UsageError("--packets must be at least 100")
    need_root("ltp bench xdp")
    need_bcc()
    from ..control.bench import xdp as xdpbench
    if not 1 <= args.blocks <= args.packets // 100:
        raise UsageError("--blocks must be at least 1 and leave 100 packets a block")
    if args.against is not None:
        _xdp_ab(args, xdpbench)
        return
    res = xdpbench.run(args.packets, args.blocks, progress=_progress(args))
    emit(args, res, _xdp_text)


def _xdp_text(r: dict) -> str:
    stages = ", ".join(f"{k} {v:.0f}" for k, v in r["stage_ns"].items())
    return (f"XDP DATA path   {r['xdp_ns_per_packet']:10.1f} ns/packet  "
            f"(raw {r['xdp_raw_ns_per_packet']:.0f} - harness {r['harness_ns']:.0f})\n"
            f"copy floor      {r['copy_floor_ns_per_packet']:10.1f} ns/packet  "
            f"(DATA path {r['over_floor']:.2f} x the floor)\n"
            f"published floor {r['published_floor_ns_per_packet']:10.1f} ns/packet  "
            f"(the copy and its done bit; DATA path {r['over_published_floor']:.2f} x)\n"
            f"  over the floor, stage by stage: {stages} ns\n"
            f"... capturing   {r['xdp_capture_ns_per_packet']:10.1f} ns/packet  "
            f"(ltp capture recording every frame in full; {r['capture_over_floor']:.2f} x, "
            f"{r['capture_over_published_floor']:.2f} x published)\n"
            f"ACK path        {r['ack_ns_per_packet']:10.1f} ns/packet  (sender, recorded)\n"
            f"ACK clock       {r['clock_ns_per_packet']:10.1f} ns/packet  "
            f"(an ACK grown into the next DATA)\n"
            f"socket loop     {r['socket_ns_per_packet']:10.1f} ns/packet  "
            f"({r['socket_packets']} packets)\n"
            f"speed-up        {r['speedup']:10.1f} x\n"
            f"{r['blocks']} alternating blocks, {r['xdp_packets']} packets an arm")


def _xdp_ab(args, xdpbench) -> None:
    """`ltp bench xdp --against DIR`: both programs, alternating blocks."""
    if not (Path(args.against) / "ltp_xdp.c").is_file():
        raise UsageError(f"--against {args.against}: no ltp_xdp.c there (put the other "
                         "version's bpf/ files in one folder)")
    res = xdpbench.bench_ab(Path(args.against), args.packets, args.blocks,
                            progress=_progress(args))

    def arm(name: str, r: dict) -> str:
        b = r["block_ns"]
        return (f"  {name:<22}{r['ns_per_packet']:8.1f} ns/packet  (median {r['median_ns']:.0f}; "
                f"blocks {min(b):.0f}..{max(b):.0f})")

    def path(name: str, p: dict) -> str:
        return (f"{name}\n" + arm("bpf/ (this)", p["this"]) + "\n" +
                arm(res["against"], p["against_arm"]) + "\n"
                f"  {'ratio this / against':<22}{p['ratio']:8.3f}    (per block "
                f"{p['block_ratio_min']:.3f}..{p['block_ratio_max']:.3f}; medians "
                f"{p['median_ratio']:.3f})")
    emit(args, res, lambda r: (
        path("DATA path", r["data"]) + "\n" + path("... capturing", r["capture"]) + "\n" +
        path("... verifying UDP checksums (where the program can)", r["csum"]) + "\n" +
        (path("ACK path", r["ack"]) + "\n" + path("ACK clock", r["clock"]) + "\n"
         if "ack" in r else f"not timed: {r['skipped']}\n") +
        f"{r['blocks']} alternating blocks, {r['packets_per_arm']} packets an arm; ns: the "
        f"middle 80 % of packets' mean less an empty program's on the same frames "
        f"({r['harness_ns']:.0f} ns; ACKs {r['ack_harness_ns']:.0f})"))


def cmd_incast(args) -> None:
    from ..control.bench.incast import check_transports, labels
    rate = check_rate(args.rate)
    buf = check_bytes(args.buffer, "--buffer")
    size = parse_size(args.size, "--size")
    if size % 4:
        raise UsageError("--size must be a multiple of 4 bytes (whole float32 elements)")
    loss = check_loss(args.loss)
    if args.rounds < 1:
        raise UsageError("--rounds must be at least 1")
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    try:
        check_transports(transports)
    except ValueError as e:
        raise UsageError(f"--transports: {e}") from None
    sender = _check_sender(args.sender, transports)
    if sender == "socket" and any(t.startswith("ltp:") for t in transports):
        raise UsageError("--transports: knobs are the ACK clock's: plain ltp takes them with "
                         "--sender xdp (or name ltp-xdp)")
    rules = [r.strip() for r in args.early_close.split(",") if r.strip()]
    try:
        labels(transports, rules)
    except ValueError as e:
        raise UsageError(f"--early-close: {e}") from None
    if args.block < 1:
        raise UsageError(f"--block must be at least 1, got {args.block}")
    try:
        counts = [int(x) for x in args.sweep_workers.split(",") if x.strip()] or [args.workers]
    except ValueError:
        raise UsageError(f"--sweep-workers: expected numbers like 4,8,16, "
                         f"got {args.sweep_workers!r}") from None
    if any(not 1 <= n <= MAX_WORKERS for n in counts):
        raise UsageError(f"--workers/--sweep-workers: each count must be in 1..{MAX_WORKERS}")
    if not 1280 <= args.mtu <= 3500:
        raise UsageError("--mtu must be in 1280..3500")
    from ..dataplane.rig.base import NAME_RE
    if not NAME_RE.match(args.name):
        raise UsageError(f"--name: a-z 0-9 _ up to 12 characters, got {args.name!r}")
    need_root("ltp bench incast")
    need_bcc()
    sender, sender_why = _choose_sender(sender, transports)
    if sender == "socket" and any(t.startswith("ltp:") for t in transports):
        raise UsageError(f"--transports: knobs are the ACK clock's, and plain ltp's sender is "
                         f"{sender_why}: name ltp-xdp instead")
    from ..control.bench import incast as bench_incast
    from rich.progress import Progress
    results = []
    with Progress(transient=True, disable=False, console=_stderr_console()) as prog:
        for n in counts:
            task = prog.add_task(f"{n} workers",
                                 total=args.rounds * len(labels(transports, rules)))

            def tick(t, done, total, task=task, n=n):
                prog.update(task, completed=done, description=f"{n} workers: {t}")

            results.append(bench_incast.run_config(
                workers=n, rate_bps=rate, buffer_bytes=buf, size=size, rounds=args.rounds,
                loss=loss, transports=transports, mtu=args.mtu, name=args.name,
                sender=sender, block=args.block, rules=rules, progress=tick))
    if args.plot:
        bench_incast.plot(results, args.plot)
    for r in results:
        r["config"]["sender_why"] = sender_why
    out = results[0] if len(results) == 1 else {"sweep": results}
    emit(args, out, lambda o: "\n\n".join(bench_incast.table(r) for r in results) +
         (f"\nplot: {args.plot}" if args.plot else ""))


def _choose_sender(sender: str | None, transports: list[str]) -> tuple[str, str]:
    """Plain ltp's sender and why: socket or xdp as asked; auto (asked, or
    None: the endpoints' default) the grow check's answer for the run
    (options.choose_sender): auto, choosing per push as an endpoint does,
    where it passes, else socket; socket and "" when no plain ltp runs."""
    if sender not in (None, "auto"):
        return sender, f"{sender}: asked for"
    if "ltp" not in [t.partition(":")[0] for t in transports]:
        return "socket", ""
    from ..control.transport.options import AUTO, choose_sender
    from ..dataplane.doctor.growcheck import grow_verdict
    c = choose_sender(AUTO, lambda: grow_verdict("native"), where="ltp bench incast")
    if c.sender != "xdp":
        return c.sender, c.why
    return AUTO, f"auto, {c.why}; per push, socket toward a worker losing more than 6 %"


def _check_sender(sender: str | None, transports: list[str]) -> str | None:
    """Plain ltp's sender as asked (None: not asked, _choose_sender's). One
    of auto, socket and xdp; a list is the transports' job, and so is a sender for
    ltp-socket/ltp-xdp."""
    if sender is None:
        return None
    if "," in sender:
        raise UsageError(f"--sender takes one sender, got {sender!r}; to A/B the senders in one "
                         "run name them as transports: --transports ltp-xdp,ltp-socket,tcp-cubic")
    if sender not in ("auto", "socket", "xdp"):
        raise UsageError(f"--sender: auto, socket or xdp, got {sender!r}")
    if "ltp" not in [t.partition(":")[0] for t in transports]:
        raise UsageError(f"--sender applies to the transport ltp only, not in --transports "
                         f"{','.join(transports)} (ltp-socket and ltp-xdp name their sender)")
    return sender


def _progress(args):
    """Progress lines on stderr, none under -j (the JSON is the output)."""
    return None if wants_json(args) else (lambda m: print(f"... {m}", file=sys.stderr))


def _stderr_console():
    from rich.console import Console
    return Console(stderr=True)
