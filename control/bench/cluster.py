# SPDX-License-Identifier: Apache-2.0
"""LTP rounds on a rig: the PS in this process, one process per worker.

Each worker process (control/bench/worker_proc.py) runs inside its host's network
namespace with its own Endpoint (XDP program on its veth). This process talks
to them over pipes (JSON lines), so coordination never crosses the network
being measured: a "push" command is the round's barrier, and the PS times a
round from the moment it is opened (just before the commands go out) to the
moment Early Close shuts it.

Worker tensors are generated from (seed, worker, round) on both sides, so a
test can check what arrived bit for bit.
"""
from __future__ import annotations

import gc
import json
import os
import select
import subprocess
import sys
from collections.abc import Iterable

import numpy as np

from ...dataplane import netns
from ...dataplane.rig.star import BROADCAST
from ...dataplane.xdp import wire as W
from ...errors import BenchError
from ..transport.early_close import EarlyCloseConfig
from ..transport.endpoint import CHECKSUMS, Endpoint, Peer, PushReport, RoundResult
from ..transport.rate import CREDIT_RTT_S, quiet_gc
from ..trust import jobkey
from .cpustat import busy_s


def worker_tensor(seed: int, worker: int, round_: int, nelems: int) -> np.ndarray:
    """The gradient a worker pushes in a cluster round (deterministic)."""
    return np.random.default_rng([seed, worker, round_]).standard_normal(nelems).astype(np.float32)


class WorkerProc:
    """A worker process and its pipe."""

    def __init__(self, host, worker_id: int, args: list[str], secret_file: str | None = None):
        self.host, self.worker = host, worker_id
        # the job key by file (LTP_SECRET_FILE), never on the argv
        env = dict(os.environ, **{jobkey.ENV: secret_file} if secret_file else {})
        self.proc = netns.popen(host.netns, [sys.executable, "-m", "ltpx.control.bench.worker_proc",
                                             *args], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, bufsize=1, env=env)

    def send(self, msg: dict) -> None:
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float = 60.0) -> dict:
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            raise TimeoutError(f"worker {self.worker} did not answer within {timeout:g}s")
        line = self.proc.stdout.readline()
        if not line:
            raise BenchError(f"worker {self.worker} exited (code {self.proc.poll()})")
        msg = json.loads(line)
        if "error" in msg:
            raise BenchError(f"worker {self.worker}: {msg['error']}")
        return msg

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"cmd": "quit"})
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()


class LtpCluster:
    """PS endpoint + worker processes on a rig (dataplane.rig.Rig).
    checksums: auto, on or off, every endpoint's Endpoint(verify_csum=)."""

    def __init__(self, rig, max_elems: int, *, job: int = 0x17, capacity_bps: float | None = None,
                 bubble: str = "mean", early_close: EarlyCloseConfig | None = None,
                 workers: Iterable[int] | None = None, mode: str | None = None,
                 chunk_bytes: int | None = None, warmup: bool = True, sender: str = "socket",
                 checksums: str = "auto"):
        self.rig = rig
        cfg = rig.config
        self.mode = mode or cfg.mode
        self.capacity = capacity_bps or cfg.rate_bps
        hosts = rig.workers if workers is None else [rig.workers[i] for i in workers]
        self.hosts = hosts
        self.ids = [h.index for h in hosts]
        self.max_elems = max_elems
        self.last_cpu_s = 0.0
        self.last_rebuilt: dict[int, int] = {}  # the last coded downlink: per worker
        self.round_no = 0  # the last round a caller numbered (callers that take turns go on from it)
        # The largest chunk a frame of the rig's MTU carries (whole float64 pairs).
        self.chunk_bytes = chunk_bytes or (cfg.mtu - 20 - 8 - W.HDR_LEN) // 8 * 8
        # a fresh job key per cluster; each worker gets its own member key
        # file (0600): its rounds carry tokens, as training's do
        self.keyfile = jobkey.KeyFile()
        self.secret = jobkey.token_secret(self.keyfile.key)
        self.credit_bytes = cfg.buffer_bytes + self.capacity * CREDIT_RTT_S / 8  # buffer + BDP
        try:
            self.ps = Endpoint(rig.ps.ifname, rig.ps.ip, {w: i for i, w in enumerate(self.ids)},
                               max_elems, ns=rig.ps.netns, mode=self.mode, job=job,
                               capacity_bps=self.capacity, bubble_strategy=bubble,
                               early_close=early_close, chunk_bytes=self.chunk_bytes,
                               secret=self.secret, sender=sender,
                               credit_bytes=self.credit_bytes,
                               verify_csum=CHECKSUMS[checksums])
        except BaseException:
            self.keyfile.close()
            raise
        self.sender = sender  # how every push leaves: "socket" or "xdp" (the ACK clock)
        self.procs: list[WorkerProc] = []
        try:
            for h in hosts:
                self.procs.append(WorkerProc(h, h.index, [
                    "--dev", h.ifname, "--netns", h.netns, "--ip", h.ip, "--id", str(h.index),
                    "--job", str(job),
                    "--max-elems", str(max_elems), "--mode", self.mode,
                    "--capacity", str(self.capacity), "--ps-ip", rig.ps.ip,
                    "--workers", str(len(hosts)), "--chunk-bytes", str(self.chunk_bytes),
                    "--sender", sender, "--checksums", checksums],
                    secret_file=self.keyfile.member_path(h.index)))
            for p in self.procs:
                p.recv(timeout=120)  # "ready": program compiled and attached
            self.keyfile.close()     # every worker has read it
            if warmup:  # round 0, not reported: first-touch and first-call costs
                self.run_round(0, max_elems)
            quiet_gc()
        except BaseException:
            self.close()
            raise

    def run_round(self, round_: int, nelems: int, seed: int = 0, *, critical=None,
                  silent: Iterable[int] = (), reliable_ok: bool = False,
                  sender: str | None = None, poll_us: int | None = None,
                  rto_rtts: int | None = None, forget_windows: bool = False
                  ) -> tuple[RoundResult, dict[int, PushReport | None]]:
        """One barrier-synchronised push round. Workers in `silent` send nothing.
        `last_cpu_s` is then the machine's busy CPU seconds from opening the
        round to the last worker's report (the gradients are made before).
        sender: "socket" or "xdp" plans this round's pushes (and the workers'
        later ones) with that sender; None keeps the one they have. poll_us:
        the ACK clock's fixed poll period from now on (0: adaptive, the
        default; None keeps the one they have). rto_rtts: the clock's RTO in
        round trips from now on (PushOptions.rto_rtts; 0: a fixed 2 ms; None
        keeps the one they have). forget_windows: the workers drop the
        credits and ACK gaps they learned (what a clocked push is primed
        with, and its first RTO), so a variant's block does not start from
        another's."""
        silent = set(silent)
        crit = None if critical is None else np.asarray(critical, dtype=bool).tolist()
        pushing = [p for p in self.procs if p.worker not in silent]
        for p in pushing:  # gradients ready before the barrier, as after backward()
            p.send({"cmd": "prepare", "round": round_, "nelems": nelems, "seed": seed,
                    "critical": crit, "sender": sender,
                    **({} if poll_us is None else {"poll_us": poll_us}),
                    **({} if rto_rtts is None else {"rto_rtts": rto_rtts}),
                    **({"forget_windows": True} if forget_windows else {})})
        for p in pushing:
            p.recv()
        busy0 = busy_s()
        self.ps.open_round(round_, nelems, self.ids, critical=critical)
        for p in pushing:
            p.send({"cmd": "push", "round": round_})
        res = self.ps.wait_round(round_)
        reports: dict[int, PushReport | None] = {}
        for p in self.procs:
            if p.worker in silent:
                reports[p.worker] = None
                continue
            reports[p.worker] = PushReport(**p.recv()["report"])
        self.last_cpu_s = busy_s() - busy0
        return res, reports

    def downlink(self, round_: int, params: np.ndarray, timeout_s: float = 20.0,
                 group: bool = False, coded: bool = False,
                 tolerant_from: int | None = None,
                 memo: dict | None = None) -> tuple[PushReport, dict[int, str]]:
        """Reliable PS -> all workers; returns the push report and each
        worker's sha256 of what it received (`last_rebuilt`: the chunks each
        rebuilt from parity). group: the first pass goes once, to the rig's
        broadcast address, instead of once per worker; coded: erasure-coded
        (Endpoint.push_reliable); tolerant_from: a tolerant answer whose
        elements from there on are critical (Endpoint.push_deferred, with
        `memo`; `last_deferred`: the chunks each worker's verdict deferred)."""
        for p in self.procs:
            p.send({"cmd": "expect", "round": round_, "nelems": int(params.size),
                    "timeout": timeout_s, "coded": coded,
                    "deferred": tolerant_from is not None})
        for p in self.procs:
            p.recv()
        peers = [Peer(h.index, h.ip) for h in self.hosts]
        grp = (BROADCAST, W.PORT) if group else None
        if tolerant_from is None:
            rep = self.ps.push_reliable(round_, params, peers, timeout_s=timeout_s, group=grp,
                                        coded=coded)
        else:
            rep = self.ps.push_deferred(round_, params, peers, critical_from=tolerant_from,
                                        timeout_s=timeout_s, group=grp, memo=memo)
        got = {p.worker: p.recv(timeout=timeout_s + 5) for p in self.procs}
        self.last_rebuilt = {w: g["rebuilt"] for w, g in got.items()}
        self.last_deferred = {w: g.get("deferred") for w, g in got.items()}
        # per worker: (checksums verified, frames that failed them so far)
        self.last_csum = {w: (g["verify_csum"], g["bad_csum"]) for w, g in got.items()}
        return rep, {w: g["sha256"] for w, g in got.items()}

    def close(self) -> None:
        for p in self.procs:
            p.stop()
        self.procs = []
        if self.ps is not None:
            self.ps.close()
            self.ps = None
        self.keyfile.close()
        gc.unfreeze()  # this process (a CLI, a test run) lives on: collect as usual again

    def __enter__(self) -> LtpCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
