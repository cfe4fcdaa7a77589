# SPDX-License-Identifier: Apache-2.0
"""One training rank: `python -m ltpx.control.training [flags]`.

Ranks meet through torch.distributed's env:// conventions (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT; with TORCHELASTIC_USE_AGENT_STORE=True every rank
is a client of a store someone else hosts, as under torchrun). The store
carries only barriers and metadata; tensors go over the chosen transport.

Roles: with --transport ltp or tcp the rank runs the built-in job on the
public API (demo.py over ltpx.torch): rank 0 is the server, rank r >= 1
worker r - 1 (WORLD_SIZE = workers + 1), and worker 0 evaluates and
reports. With --transport gloo every rank is a DDP worker (WORLD_SIZE =
workers) and rank 0 also evaluates.

Output: JSON lines on stdout (the lead: start, iter, eval, then result;
another worker: worker_done). Exit 0 on success, 1 on a runtime error, 2 on
bad flags.

The network flags fall back to ltpx.torch's LTP_* environment variables
(what `ltp launch` and `ltp train` set), then to its defaults.
--store-netns NS makes the store connection from inside network namespace
NS (the rig passes the PS namespace, whose loopback then carries the
coordination, so it never crosses the bottleneck being measured; on real
hosts leave it out and the store goes over the management network).

The training flags are args.py's, shared with `ltp train`; the flags of this
rank's network are the settings table's RANK flags (control/settings_table.py).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from datetime import timedelta

from ...dataplane import netns
from ...errors import LtpError
from .. import settings_table
from ..settings_table import RANK, TABLE, TRAIN, add_flag
from ..transport.early_close import EarlyCloseConfig
from .args import add_train_flags, config_from_args
from .config import DDP_TRANSPORTS, TrainConfig
from .context import RankContext


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ltpx.control.training",
        description="One rank of parameter-server training over LTP (or TCP / gloo).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  under torchrun, on 9 hosts (rank 0 = the server):\n"
               "  torchrun --nnodes 9 --nproc-per-node 1 --node-rank R \\\n"
               "      --master-addr PS_HOST --master-port 29500 \\\n"
               "      -m ltpx.control.training --transport ltp --dev eth1 --capacity 10e9\n"
               "  the same on a rig, one command per host (ltp rig exec HOST -- ...)\n")
    add_train_flags(p)
    p.add_argument("--config", default=None, help=argparse.SUPPRESS)  # TrainConfig JSON
    net = p.add_argument_group("this rank's network (default: the LTP_* environment "
                               "variables, then ltpx.torch's defaults)")
    for s in TABLE.values():
        if RANK in s.flags:
            add_flag(net, s.name, RANK)
    net.add_argument("--early-close", default=None, metavar="JSON",
                     help='EarlyCloseConfig fields for the LTP server, e.g. '
                     '\'{"threshold_min": 1, "threshold_max": 1}\' (close only when complete)')
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
    if a.deadline_min is not None:
        early_close.setdefault("min_deadline_s", a.deadline_min)
    EarlyCloseConfig(**early_close)
    return cfg, early_close


def run_api(a: argparse.Namespace, cfg: TrainConfig, early_close: dict) -> dict:
    """--transport ltp|tcp: join the job through ltpx.torch (a server rank serves
    there and exits), then run the built-in job as one of its workers."""
    from ..torchapi import init  # noqa: PLC0415 (imports torch: see run_gloo_rank)
    from .demo import run_demo  # noqa: PLC0415 (imports torch)
    init(**ltp_options(a, cfg))
    return run_demo(cfg, early_close, emit)


def ltp_options(a: argparse.Namespace, cfg: TrainConfig) -> dict:
    """ltpx.torch.init()'s keywords from a rank's flags (the settings table's
    RANK flags; None: init() reads the variable) and the job's config (its
    TRAIN settings). One server leaves `servers` to LTP_SERVERS; the job's
    server ranks are its own (`--servers`, the documented torchrun command's
    rank 0), so init()'s co-location by default is said off, unless
    LTP_COLOCATE decides (`ltp launch --colocate --share-nic`)."""
    opts = {s.name: getattr(a, s.name) if RANK in s.flags else getattr(cfg, s.name)
            for s in TABLE.values() if s.flags & {RANK, TRAIN}}
    opts["transport"] = "tcp" if cfg.transport == "tcp" else "ltp"
    opts["servers"] = cfg.servers if cfg.servers > 1 else None
    if not os.environ.get(TABLE["colocate"].env):
        opts["colocate"] = False
    return opts


def run_gloo_rank(a: argparse.Namespace, cfg: TrainConfig) -> dict:
    """--transport gloo: the DDP baseline, every rank a worker (gloo.py);
    --transport ddp-ltp: the same DDP job over the `ltp` backend, after this
    rank joined the LTP job (a server rank serves there and exits)."""
    import torch.distributed as dist  # noqa: PLC0415 (torch after main() set TORCH_CPP_LOG_LEVEL; --help without it)
    from .gloo import run_gloo  # noqa: PLC0415 (imports torch: see above)
    timeout = a.timeout or TABLE["timeout"].default
    dev = a.dev or settings_table.env("dev")
    with netns.inside(a.store_netns or settings_table.env("store_netns")):
        store, rank, world = next(dist.rendezvous("env://", timeout=timedelta(seconds=timeout)))
    if dev:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", dev)
    if cfg.transport == "ddp-ltp":
        from ..torchapi.job import init  # noqa: PLC0415 (imports torch)
        init(**ltp_options(a, cfg))
    ctx = RankContext(rank=rank, world=world, store=store, cfg=cfg, dev=dev,
                      timeout_s=timeout, emit=emit)
    bad = [w for w in cfg.straggler if w >= ctx.workers]
    if bad:
        raise SystemExit(f"--straggler: worker {bad[0]} does not exist "
                         f"({ctx.workers} workers: 0..{ctx.workers - 1})")
    return run_gloo(ctx, backend="ltp" if cfg.transport == "ddp-ltp" else "gloo")


def emit(obj: dict) -> None:
    """One JSON line on stdout, flushed: the launcher follows the lead's."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _abandon() -> None:
    """A failing rank exits at once: no shutdown barrier at exit (ltpx.torch's
    goodbye would wait for a server that may be gone or going)."""
    from ..torchapi.job import abandon  # noqa: PLC0415 (imports torch)
    abandon()


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
        ddp = cfg.transport in DDP_TRANSPORTS
        emit(run_gloo_rank(a, cfg) if ddp else run_api(a, cfg, early_close))
        return 0
    except KeyboardInterrupt:   # SIGTERM: stop now, no goodbye to a server that is going too
        _abandon()
        return 130
    except LtpError as e:
        _flight_dump(e)
        _abandon()
        emit({"event": "error", "error": str(e)})
        print(str(e), file=sys.stderr)
        return e.exit_code
    except SystemExit as e:
        if isinstance(e.code, str):
            emit({"event": "error", "error": e.code})
            print(e.code, file=sys.stderr)
            return 1
        raise
    except Exception as e:  # one line for the launcher, the trace for the log
        _flight_dump(e)
        _abandon()
        traceback.print_exc()
        emit({"event": "error", "error": f"{type(e).__name__}: {e}"})
        return 1


def _flight_dump(e: BaseException) -> None:
    """The flight recorder's ring as the rank ends on an error (flight.py)."""
    if "ltpx.control.torchapi.flight" in sys.modules:
        sys.modules["ltpx.control.torchapi.flight"].trigger(type(e).__name__, str(e), now=True)


def exit_now(code: int) -> None:
    """End the rank's process with `code` once its output is out and its job
    closed, skipping the interpreter's teardown (torch's C++ teardown after
    the store's host has gone sometimes aborts a finished rank: exit -6)."""
    _abandon()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_main() -> None:
    """The entry point: main(), then exit_now (a server rank leaves main with
    SystemExit once the job is over)."""
    try:
        code = main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    exit_now(code)


if __name__ == "__main__":
    run_main()
