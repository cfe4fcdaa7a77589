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

The training flags are args.py's, shared with `ltp train`; the flags of this
rank's network are declared here.
"""
from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import os
import signal
import socket
import struct
import sys
import traceback
from datetime import timedelta

from .args import add_train_flags, config_from_args
from .config import TrainConfig

SIOCGIFADDR, SIOCGIFBRDADDR = 0x8915, 0x8919


def _ifreq_ipv4(dev: str, request: int) -> str:
    """The IPv4 address an SIOCGIF* ioctl gives for `dev` (OSError if none)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        raw = fcntl.ioctl(s.fileno(), request, struct.pack("256s", dev.encode()[:15]))
    finally:
        s.close()
    return socket.inet_ntoa(raw[20:24])


def dev_ipv4(dev: str) -> str:
    """The IPv4 address of `dev` in this network namespace."""
    try:
        return _ifreq_ipv4(dev, SIOCGIFADDR)
    except OSError as e:
        raise SystemExit(f"--dev {dev}: no IPv4 address ({e.strerror}); pass --ip") from None


def dev_broadcast(dev: str) -> str | None:
    """The IPv4 broadcast address of `dev`'s address, or None if it has none."""
    try:
        addr = _ifreq_ipv4(dev, SIOCGIFBRDADDR)
    except OSError:
        return None
    return None if addr == "0.0.0.0" else addr


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ltpx.control.training",
        description="One rank of parameter-server training over LTP (or TCP / gloo).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="under torchrun, on 9 hosts (rank 0 = PS):\n"
               "  torchrun --nnodes 9 --nproc-per-node 1 --node-rank R \\\n"
               "      --master-addr PS_HOST --master-port 29500 \\\n"
               "      -m ltpx.control.training --transport ltp --dev eth1 --capacity 10e9\n")
    add_train_flags(p)
    p.add_argument("--config", default=None, help=argparse.SUPPRESS)  # TrainConfig JSON
    net = p.add_argument_group("this rank's network")
    net.add_argument("--dev", help="device for LTP (the XDP program attaches here) / gloo")
    net.add_argument("--ip", help="this rank's IPv4 address (default: --dev's address)")
    net.add_argument("--xdp-mode", choices=("native", "skb"), default="native")
    net.add_argument("--capacity", type=float, default=1e9,
                     help="bottleneck rate toward the PS in bit/s (LTP rate shares, Early Close)")
    net.add_argument("--mtu", type=int, default=1500)
    net.add_argument("--group", default=None, metavar="ADDR",
                     help="broadcast or multicast address every worker receives, for "
                     "--downlink group (read by the PS; default: --dev's broadcast address)")
    net.add_argument("--job", type=int, default=0x7472, help="LTP job cookie")
    net.add_argument("--tcp-port", type=int, default=0, help="PS listening port (tcp)")
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


def checked_config(a: argparse.Namespace) -> tuple[TrainConfig, dict]:
    """(TrainConfig, EarlyCloseConfig fields) from the flags; ValueError/TypeError
    for a bad value, before the rendezvous, so no other rank waits for this one."""
    if a.config:   # the launcher's: every rank of a job gets the same config
        cfg = TrainConfig.from_json(a.config)
        cfg.validate()
    else:
        cfg = config_from_args(a)
    early_close = json.loads(a.early_close) if a.early_close else {}
    from ..transport.early_close import EarlyCloseConfig
    EarlyCloseConfig(**early_close)
    return cfg, early_close


def rendezvous(store_netns: str | None, timeout_s: float):
    """(store, rank, world) from env://, the store socket made in store_netns."""
    import torch.distributed as dist
    from ...dataplane import netns
    with netns.inside(store_netns):
        store, rank, world = next(dist.rendezvous("env://", timeout=timedelta(seconds=timeout_s)))
    return store, rank, world


def downlink_group(a: argparse.Namespace, cfg: TrainConfig, rank: int
                   ) -> tuple[TrainConfig, str | None]:
    """The PS's group address for --downlink group: --group, else its device's
    broadcast address; with neither, the config falls back to unicast (only the
    PS sends the downlink, so only its config changes)."""
    if rank != 0 or cfg.transport != "ltp" or cfg.downlink != "group" or a.group:
        return cfg, a.group
    group = dev_broadcast(a.dev) if a.dev else None
    if group is None:
        print(f"note: --dev {a.dev} has no IPv4 broadcast address and no --group was given: "
              "the parameter downlink is unicast", file=sys.stderr)
        return dataclasses.replace(cfg, downlink="unicast"), None
    return cfg, group


def make_context(a, cfg: TrainConfig, early_close: dict, store, rank: int, world: int, emit):
    """This rank's RankContext; SystemExit with a message for what it lacks."""
    from .context import RankContext
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
    cfg, group = downlink_group(a, cfg, rank)
    ctx = RankContext(rank=rank, world=world, store=store, cfg=cfg, dev=a.dev, ip=ip,
                      xdp_mode=a.xdp_mode, capacity_bps=a.capacity, mtu=a.mtu, job=a.job,
                      tcp_port=a.tcp_port, timeout_s=a.timeout, deadline_min_s=a.deadline_min,
                      early_close=early_close, netns=a.netns, group=group, emit=emit)
    bad = [w for w in cfg.straggler if w >= ctx.workers]
    if bad:
        raise SystemExit(f"--straggler: worker {bad[0]} does not exist "
                         f"({ctx.workers} workers: 0..{ctx.workers - 1})")
    return ctx


def run_rank(ctx) -> dict:
    """This rank's loop: gloo's DDP worker, the parameter server, or a worker."""
    if ctx.cfg.transport == "gloo":
        from .gloo import run_gloo
        return run_gloo(ctx)
    if ctx.rank == 0:
        from .ps import run_ps
        return run_ps(ctx)
    from .worker import run_worker
    return run_worker(ctx)


def emit(obj: dict) -> None:
    """One JSON line on stdout, flushed: the launcher follows rank 0's."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    p = build_parser()
    a = p.parse_args(argv)
    try:
        cfg, early_close = checked_config(a)
    except (ValueError, TypeError) as e:
        p.error(str(e))
    pid = os.getpid()

    def on_sigterm(signum, frame):  # unwind, so endpoints detach their XDP programs
        if os.getpid() == pid:
            raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        store, rank, world = rendezvous(a.store_netns, a.timeout)
        emit(run_rank(make_context(a, cfg, early_close, store, rank, world, emit)))
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
