"""One training rank: `python -m ltpx.control.training [flags]`.

Ranks meet through torch.distributed's env:// conventions (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT; with TORCHELASTIC_USE_AGENT_STORE=True every rank
is a client of a store someone else hosts, as under torchrun). The store
carries only barriers and metadata (ids, addresses, devices, local-step
counts); tensors go over the chosen transport.

Roles: with --transport ltp or tcp, rank 0 is the parameter server and rank
r >= 1 is worker r - 1 (WORLD_SIZE = workers + 1). With --transport gloo
every rank is a worker (WORLD_SIZE = workers) and rank 0 also evaluates.

Output: JSON lines on stdout (rank 0: start, iter, eval, then result; a
worker: worker_done). Exit 0 on success, 1 on a runtime error, 2 on bad flags.

--store-netns NS makes the store connection from inside network namespace
NS (the rig passes the PS namespace, whose loopback then carries the
coordination, so it never crosses the bottleneck being measured; on real
hosts leave it out and the store goes over the management network).
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import socket
import struct
import sys
import traceback
from datetime import timedelta

SIOCGIFADDR = 0x8915


def dev_ipv4(dev: str) -> str:
    """The IPv4 address of `dev` in this network namespace."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", dev.encode()[:15]))
    except OSError as e:
        raise SystemExit(f"--dev {dev}: no IPv4 address ({e.strerror}); pass --ip") from None
    finally:
        s.close()
    return socket.inet_ntoa(raw[20:24])


def parse_straggler(items: list[str] | None) -> dict[int, float]:
    """['1:3', '2:1.5'] -> {1: 3.0, 2: 1.5}; ValueError names the bad item."""
    out: dict[int, float] = {}
    for item in items or []:
        w, sep, f = item.partition(":")
        try:
            if not sep:
                raise ValueError
            wid, factor = int(w), float(f)
        except ValueError:
            raise ValueError(f"--straggler: {item!r} is not WORKER:FACTOR (e.g. 1:3)") from None
        if wid < 0 or not factor >= 1.0:
            raise ValueError(f"--straggler: {item!r}: worker must be >= 0 and factor >= 1")
        out[wid] = factor
    return out


def build_parser() -> argparse.ArgumentParser:
    from .model import DEFAULT_HIDDEN
    from .runtime import SYNCS, TRANSPORTS
    p = argparse.ArgumentParser(
        prog="python -m ltpx.control.training",
        description="One rank of parameter-server training over LTP (or TCP / gloo).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="under torchrun, on 9 hosts (rank 0 = PS):\n"
               "  torchrun --nnodes 9 --nproc-per-node 1 --node-rank R \\\n"
               "      --master-addr PS_HOST --master-port 29500 \\\n"
               "      -m ltpx.control.training --transport ltp --dev eth1 --capacity 10e9\n")
    p.add_argument("--transport", choices=TRANSPORTS, default="ltp")
    p.add_argument("--sync", choices=SYNCS, default="bsp")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--iterations", type=int, default=None,
                   help="train this many iterations instead of --epochs")
    p.add_argument("--batch", type=int, default=32, help="examples per worker and local step")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", default=",".join(map(str, DEFAULT_HIDDEN)),
                   help="hidden layer widths (default %(default)s: a 0.94 MB gradient)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bubble", choices=("mean", "zero", "stale"), default="mean")
    p.add_argument("--straggler", action="append", metavar="WORKER:FACTOR",
                   help="slow WORKER's compute by FACTOR (repeatable)")
    p.add_argument("--eval-every", type=int, default=0,
                   help="evaluate every N iterations (default: at epoch ends)")
    p.add_argument("--target-accuracy", type=float, default=None,
                   help="report the training time until the test accuracy reaches this")
    p.add_argument("--cc", default="cubic", help="TCP congestion control (--transport tcp)")
    p.add_argument("--downlink", choices=("unicast", "group"), default="unicast",
                   help="LTP parameter downlink: unicast to each worker, or group: once to "
                   "--group's address, then what a worker lacks to it alone")
    p.add_argument("--verify-versions", action="store_true",
                   help="hash every parameter version on every rank (costs ~1 ms/MB each)")
    p.add_argument("--config", default=None, help=argparse.SUPPRESS)  # TrainConfig JSON
    net = p.add_argument_group("this rank's network")
    net.add_argument("--dev", help="device for LTP (the XDP program attaches here) / gloo")
    net.add_argument("--ip", help="this rank's IPv4 address (default: --dev's address)")
    net.add_argument("--xdp-mode", choices=("native", "skb"), default="native")
    net.add_argument("--capacity", type=float, default=1e9,
                     help="bottleneck rate toward the PS in bit/s (LTP rate shares, Early Close)")
    net.add_argument("--mtu", type=int, default=1500)
    net.add_argument("--group", default=None, metavar="ADDR",
                     help="broadcast or multicast address every worker receives: with "
                     "--downlink group in the config, the PS sends the parameters there once")
    net.add_argument("--job", type=int, default=0x7472, help="LTP job cookie")
    net.add_argument("--tcp-port", type=int, default=0, help="PS listening port (tcp)")
    net.add_argument("--deadline-min", type=float, default=None,
                     help="Early Close minimum deadline in seconds (LTP PS)")
    net.add_argument("--early-close", default=None, metavar="JSON",
                     help='EarlyCloseConfig fields for the LTP PS, e.g. '
                     '\'{"threshold_min": 1, "threshold_max": 1}\' (close only when complete)')
    net.add_argument("--netns", default=None,
                     help="the network namespace this rank runs in, if not the host's "
                     "(names the endpoint's pins for `ltp status`; the rig passes it)")
    net.add_argument("--timeout", type=float, default=300.0,
                     help="seconds any one wait may take before the rank gives up")
    net.add_argument("--store-netns", default=None,
                     help="open the store connection from inside this network namespace")
    return p


def config_from_args(a: argparse.Namespace):
    from .runtime import TrainConfig
    if a.config:
        cfg = TrainConfig.from_json(a.config)
    else:
        try:
            hidden = tuple(int(x) for x in a.hidden.split(",") if x)
        except ValueError:
            raise ValueError(f"--hidden: {a.hidden!r} is not a comma-separated list of widths") \
                from None
        cfg = TrainConfig(transport=a.transport, sync=a.sync, epochs=a.epochs,
                          iterations=a.iterations, batch=a.batch, lr=a.lr, momentum=a.momentum,
                          hidden=hidden, seed=a.seed, bubble=a.bubble,
                          straggler=parse_straggler(a.straggler), eval_every=a.eval_every,
                          target_accuracy=a.target_accuracy, cc=a.cc,
                          verify_versions=a.verify_versions, downlink=a.downlink)
    cfg.validate()
    return cfg


def rendezvous(store_netns: str | None, timeout_s: float):
    """(store, rank, world) from env://, the store socket made in store_netns."""
    import torch.distributed as dist
    from ...dataplane import netns
    with netns.inside(store_netns):
        store, rank, world = next(dist.rendezvous("env://", timeout=timedelta(seconds=timeout_s)))
    return store, rank, world


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    p = build_parser()
    a = p.parse_args(argv)
    try:
        cfg = config_from_args(a)
        early_close = json.loads(a.early_close) if a.early_close else {}
        from ..transport.early_close import EarlyCloseConfig
        EarlyCloseConfig(**early_close)
        if cfg.downlink == "group" and not a.group:  # before the rendezvous: no one waits
            raise ValueError("--downlink group needs --group ADDR (a broadcast or multicast "
                             "address every worker receives)")
    except (ValueError, TypeError) as e:
        p.error(str(e))

    def emit(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    from .runtime import RankContext, run_gloo, run_ps, run_worker
    pid = os.getpid()

    def on_sigterm(signum, frame):  # unwind, so endpoints detach their XDP programs
        if os.getpid() == pid:
            raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        store, rank, world = rendezvous(a.store_netns, a.timeout)
        need_net = cfg.transport == "ltp" or (cfg.transport == "tcp" and rank == 0)
        if need_net and not (a.dev or a.ip):
            raise SystemExit(f"rank {rank}: --dev is needed with --transport {cfg.transport}")
        ip = a.ip or (dev_ipv4(a.dev) if a.dev else None)
        if cfg.transport == "gloo" and a.dev:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", a.dev)
        lo = 1 if cfg.transport == "gloo" else 2
        if world < lo:
            raise SystemExit(f"WORLD_SIZE={world}: --transport {cfg.transport} needs at least "
                             f"{lo} ranks")
        ctx = RankContext(rank=rank, world=world, store=store, cfg=cfg, dev=a.dev, ip=ip,
                          xdp_mode=a.xdp_mode, capacity_bps=a.capacity, mtu=a.mtu, job=a.job,
                          tcp_port=a.tcp_port, timeout_s=a.timeout, deadline_min_s=a.deadline_min,
                          early_close=early_close, netns=a.netns, group=a.group,
                          emit=emit)
        bad = [w for w in cfg.straggler if w >= ctx.workers]
        if bad:
            raise SystemExit(f"--straggler: worker {bad[0]} does not exist "
                             f"({ctx.workers} workers: 0..{ctx.workers - 1})")
        if cfg.transport == "gloo":
            out = run_gloo(ctx)
        elif rank == 0:
            out = run_ps(ctx)
        else:
            out = run_worker(ctx)
        emit(out)
        return 0
    except KeyboardInterrupt:
        return 130
    except SystemExit as e:
        if isinstance(e.code, str):
            emit({"event": "error", "error": e.code})
            print(e.code, file=sys.stderr)
            return 1
        raise
    except Exception as e:  # one line for the launcher, the trace for the log
        traceback.print_exc()
        emit({"event": "error", "error": f"{type(e).__name__}: {e}"})
        return 1


if __name__ == "__main__":
    sys.exit(main())
