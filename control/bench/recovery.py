# SPDX-License-Identifier: Apache-2.0
"""A/B of the ACK clock's loss recovery on one rig, in alternating blocks.

Arm `xdp`: the XDP program re-sends what it sent and finds lost (RACK over
its send log, re-sends before new chunks; `PushOptions.xdp_recovery`), the
control plane only its own socket sends and the RTO. Arm `python`: the
control plane finds every loss by polling (every 0.25 ms) and re-sends from
the socket. Optionally the socket sender as a third arm, for
reference.

    python -m ltpx.control.bench.recovery [--workers 4] [--kib 256] [--loss 0.05]
        [--blocks 4] [--block 5] [--warmup 2] [--complete] [--socket] [-j]

Each round: the PS (this process) opens it, every worker process pushes at
once, the PS waits for it to close (Early Close as configured; --complete:
only when complete). Blocks of `--block` rounds per arm alternate (ABBA...),
after `--warmup` rounds of each. The rig (star, `hfrec`, 1 Gbit/s toward
the PS with a 30 kB buffer, loss on every port both ways) is built and
removed by the run. Per arm: the PS's round time (open to close), the
slowest push, the machine's busy CPU per round (cpustat: neighbours
included, so only alternating arms compare), what arrived, and re-sends
from the socket (resent) and from XDP (xdp retx). Prints a table and,
with -j, JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time

import numpy as np

from ...dataplane import netns
from ...dataplane.rig.star import Rig, RigConfig
from ...errors import BenchError
from ..transport.early_close import EarlyCloseConfig
from ..trust import jobkey
from ..transport.endpoint import Endpoint, Peer
from ..transport.options import PushOptions
from ..transport.rate import CREDIT_RTT_S
from .cpustat import busy_s

ARMS = ("xdp", "python", "socket")
#: each arm's pushes: the clock recovering in XDP, the clock recovering in
#: Python alone, the paced socket sender
ARM_OPTIONS = {"xdp": PushOptions(sender="xdp"),
               "python": PushOptions(sender="xdp", xdp_recovery=False),
               "socket": PushOptions(sender="socket")}
MODULE = "ltpx.control.bench.recovery"


def _tensor(worker: int, round_: int, nelems: int) -> np.ndarray:
    return np.random.default_rng([7, worker, round_]).standard_normal(nelems).astype(np.float32)


# ------------------------------------------------------------------ worker side
def worker_main(argv: list[str]) -> int:
    """A worker process (inside its namespace): one endpoint; per command
    line {"round", "nelems", "arm"} it pushes and answers with its report."""
    dev, ip, wid, ps_ip, max_elems, cap = argv
    wid, cap = int(wid), float(cap)
    # its member key file (0600): LTP_SECRET_FILE names it, never on the argv
    ep = Endpoint(dev, ip, {wid: 0}, int(max_elems), capacity_bps=cap, sender="xdp",
                  initial_rate_bps=cap / 4, self_id=wid,
                  secret=jobkey.token_secret(jobkey.key_from_env()))
    print(json.dumps({"ready": True}), flush=True)
    try:
        for line in sys.stdin:
            msg = json.loads(line)
            if msg.get("cmd") == "quit":
                break
            buf = _tensor(wid, msg["round"], msg["nelems"])
            t0 = time.perf_counter()
            rep = ep.push(msg["round"], buf, Peer(wid, ps_ip), timeout_s=10.0,
                          options=ARM_OPTIONS[msg["arm"]])
            out = rep.to_dict()
            out["push_s"] = time.perf_counter() - t0
            print(json.dumps(out), flush=True)
    finally:
        ep.close()
    return 0


class _Worker:
    def __init__(self, host, args: list[str], secret_file: str):
        self.proc = netns.popen(host.netns, [sys.executable, "-m", MODULE, "--worker", *args],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                bufsize=1, env=dict(os.environ, **{jobkey.ENV: secret_file}))

    def send(self, msg: dict) -> None:
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float = 120.0) -> dict:
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if r else ""
        if not line:
            raise BenchError(f"recovery worker did not answer (exit code {self.proc.poll()})")
        return json.loads(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"cmd": "quit"})
                self.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001  (a dead pipe: kill it)
                self.proc.kill()
                self.proc.wait()


# ------------------------------------------------------------------ the run
def _round(ps, workers, ids, r: int, nelems: int, arm: str) -> dict:
    busy0 = busy_s()
    ps.open_round(r, nelems, ids)
    for w in workers:
        w.send({"round": r, "nelems": nelems, "arm": arm})
    res = ps.wait_round(r)
    reps = [w.recv() for w in workers]
    return {"arm": arm, "round_s": res.duration_s, "cpu_s": busy_s() - busy0,
            "delivered": float(res.delivered_fraction),
            "reason": res.reason, "push_s": max(p["push_s"] for p in reps),
            "resent": sum(p["resent"] for p in reps),
            "clock_retx": sum(p.get("clock_retx", 0) for p in reps),
            "sent": sum(p["sent"] for p in reps)}


def _plan(arms: tuple[str, ...], blocks: int) -> list[str]:
    """Blocks of each arm in turn, the order reversed every other cycle (ABBA)."""
    out = []
    for b in range(blocks):
        out += list(arms if b % 2 == 0 else arms[::-1])
    return out


def run(workers: int = 4, kib: int = 256, loss: float = 0.05, blocks: int = 4, block: int = 5,
        warmup: int = 2, complete: bool = False, socket_arm: bool = False,
        name: str = "hfrec", credit_bytes: float | None = None) -> dict:
    nelems = kib * 1024 // 4
    arms = ARMS if socket_arm else ARMS[:2]
    cfg = RigConfig(name=name, workers=workers, rate_bps=10**9, buffer_bytes=30_000, loss=0.0,
                    loss_on="all")
    early = (EarlyCloseConfig(threshold_min=1.0, threshold_max=1.0, min_deadline_s=5.0,
                              hard_timeout_s=10.0) if complete else None)
    rounds: list[dict] = []
    with Rig(cfg) as rig, jobkey.KeyFile() as keyfile:
        cap = float(cfg.rate_bps)
        secret = jobkey.token_secret(keyfile.key)
        ids = [h.index for h in rig.workers]
        procs: list[_Worker] = []
        with Endpoint(rig.ps.ifname, rig.ps.ip, {w: i for i, w in enumerate(ids)}, nelems,
                      ns=rig.ps.netns, capacity_bps=cap, secret=secret, early_close=early,
                      credit_bytes=credit_bytes or cfg.buffer_bytes + cap * CREDIT_RTT_S / 8
                      ) as ps:
            try:
                for h in rig.workers:
                    procs.append(_Worker(h, [h.ifname, h.ip, str(h.index), rig.ps.ip,
                                             str(nelems), str(cap)],
                                         keyfile.member_path(h.index, group=False)))
                for p in procs:
                    p.recv()
                keyfile.close()      # every worker has read it
                rig.set_loss(loss)
                r = 1
                for arm in arms:  # warm-up, not counted
                    for _ in range(warmup):
                        _round(ps, procs, ids, r, nelems, arm)
                        r += 1
                for arm in _plan(arms, blocks):
                    for _ in range(block):
                        rounds.append(_round(ps, procs, ids, r, nelems, arm))
                        r += 1
            finally:
                for p in procs:
                    p.stop()
    return _summary(rounds, arms, dict(workers=workers, kib=kib, loss=loss, blocks=blocks,
                                       block=block, complete=complete, credit_bytes=credit_bytes))


def _summary(rounds: list[dict], arms: tuple[str, ...], config: dict) -> dict:
    out: dict = {"config": config, "arms": {}}
    for arm in arms:
        rs = [x for x in rounds if x["arm"] == arm]
        t = np.array([x["round_s"] for x in rs])
        p = np.array([x["push_s"] for x in rs])
        out["arms"][arm] = {
            "rounds": len(rs), "round_ms_median": 1e3 * float(np.median(t)),
            "round_ms_p90": 1e3 * float(np.percentile(t, 90)),
            "round_ms_min": 1e3 * float(t.min()), "round_ms_max": 1e3 * float(t.max()),
            "push_ms_median": 1e3 * float(np.median(p)),
            "cpu_ms_per_round": 1e3 * float(np.mean([x["cpu_s"] for x in rs])),
            "delivered_min": min(x["delivered"] for x in rs),
            "complete": sum(x["reason"] == "complete" for x in rs),
            "resent_per_round": float(np.mean([x["resent"] for x in rs])),
            "clock_retx_per_round": float(np.mean([x["clock_retx"] for x in rs]))}
    a, b = out["arms"]["xdp"], out["arms"]["python"]
    out["xdp_over_python"] = {k: a[k] / b[k] for k in ("round_ms_median", "round_ms_p90",
                                                      "push_ms_median", "cpu_ms_per_round")
                              if b[k]}
    out["rounds"] = rounds
    return out


def _table(s: dict) -> str:
    c = s["config"]
    lines = [f"{c['workers']} workers x {c['kib']} KiB, loss {c['loss']:.0%} both ways, "
             f"{'complete rounds' if c['complete'] else 'Early Close'}, "
             f"{c['blocks']} blocks of {c['block']} rounds per arm",
             f"{'arm':<8}{'rounds':>7}{'median ms':>11}{'p90 ms':>9}{'min..max ms':>15}"
             f"{'push ms':>9}{'cpu ms':>8}{'delivered':>10}{'resent':>8}{'xdp retx':>9}"]
    for arm, a in s["arms"].items():
        lines.append(f"{arm:<8}{a['rounds']:>7}{a['round_ms_median']:>11.1f}"
                     f"{a['round_ms_p90']:>9.1f}"
                     f"{a['round_ms_min']:>7.1f}..{a['round_ms_max']:<6.1f}"
                     f"{a['push_ms_median']:>9.1f}{a['cpu_ms_per_round']:>8.1f}"
                     f"{a['delivered_min']:>10.3f}"
                     f"{a['resent_per_round']:>8.1f}{a['clock_retx_per_round']:>9.1f}")
    lines.append("xdp / python: " + ", ".join(f"{k} {v:.2f}"
                                             for k, v in s["xdp_over_python"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker_main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m ltpx.control.bench.recovery",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--kib", type=int, default=256)
    ap.add_argument("--loss", type=float, default=0.05)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--block", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--complete", action="store_true", help="rounds close only when complete")
    ap.add_argument("--socket", action="store_true", help="the socket sender as a third arm")
    ap.add_argument("--name", default="hfrec", help="rig name")
    ap.add_argument("--credit-kib", type=float, default=None,
                    help="the PS's credit (default: the rig's buffer plus one BDP, as LtpCluster)")
    ap.add_argument("-j", "--json", action="store_true")
    a = ap.parse_args(argv)
    s = run(a.workers, a.kib, a.loss, a.blocks, a.block, a.warmup, a.complete, a.socket, a.name,
            a.credit_kib and a.credit_kib * 1024)
    print(json.dumps(s) if a.json else _table(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
