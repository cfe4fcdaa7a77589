# SPDX-License-Identifier: Apache-2.0
"""A cluster worker: an LTP endpoint in its namespace, driven over stdin/stdout.

Started by control/bench/cluster.py inside the worker's network namespace. Reads one
JSON command per line and answers one JSON line:
  prepare {"round", "nelems", "seed", "critical", "sender"[, "poll_us", "rto_rtts"]}
                                                   -> {"ready": true}
          (sender, when not null: socket or xdp plans this push and later ones;
          poll_us: the ACK clock's fixed poll period from now on, 0: adaptive;
          rto_rtts: its RTO in round trips from now on, 0: a fixed RTO_MIN;
          forget_windows: drop the credits learned so far, a block starts afresh)
  push    {"round"}                                -> {"report": PushReport}
  expect  {"round", "nelems", "timeout"[, "coded", "deferred"]} -> {"ready": true}, then
          after the reliable round completes       -> {"sha256": hex, "rebuilt": n,
                                                       "deferred": chunks or null}
  quit
This worker's member key file (0600, control/trust/jobkey.py: its own keys, not
the job key) comes named by LTP_SECRET_FILE, never on the argv; the
endpoint's round tokens derive from it.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys

from .. import settings_table
from ..trust import jobkey
from ...dataplane.xdp.wire import CHUNK_BYTES
from ..transport.endpoint import CHECKSUMS, Endpoint, Peer
from ..transport.options import PushOptions
from ..transport.rate import quiet_gc
from .cluster import worker_tensor


def arm(options: PushOptions, msg: dict) -> PushOptions:
    """The push options a `prepare` message asks for from now on (a bench
    taking turns between senders, poll periods or RTO rules); what it does
    not name stays as `options` has it."""
    change: dict = {}
    if msg.get("sender"):
        change["sender"] = msg["sender"]
    if "poll_us" in msg:
        change["poll_s"] = msg["poll_us"] / 1e6 if msg["poll_us"] else None
    if "rto_rtts" in msg:
        change["rto_rtts"] = msg["rto_rtts"]
    return dataclasses.replace(options, **change)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ltpx.control.bench.worker_proc")
    ap.add_argument("--dev", required=True)
    ap.add_argument("--ip", required=True)
    ap.add_argument("--netns", default=None, help="the namespace this process runs in")
    ap.add_argument("--id", type=int, required=True)
    ap.add_argument("--job", type=int, default=0)
    ap.add_argument("--max-elems", type=int, required=True)
    ap.add_argument("--mode", default="native")
    ap.add_argument("--capacity", type=float, default=1e9)
    ap.add_argument("--ps-ip", required=True)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--chunk-bytes", type=int, default=CHUNK_BYTES)
    ap.add_argument("--sender", default="socket", help="socket, or xdp (the ACK clock)")
    ap.add_argument("--checksums", default="auto", choices=CHECKSUMS,
                    help="verify each DATA frame's UDP checksum (auto: where frames carry them)")
    a = ap.parse_args(argv)

    out = sys.stdout

    def reply(obj) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    try:
        ep = Endpoint(a.dev, a.ip, {a.id: 0}, a.max_elems, ns=a.netns, mode=a.mode, job=a.job,
                      capacity_bps=a.capacity, initial_rate_bps=a.capacity / a.workers,
                      chunk_bytes=a.chunk_bytes, self_id=a.id,
                      secret=jobkey.token_secret(jobkey.key_from_env()), sender=a.sender,
                      verify_csum=CHECKSUMS[a.checksums])
    except Exception as e:  # report, then exit
        reply({"error": f"endpoint: {e}"})
        return 1
    ps = Peer(a.id, a.ps_ip)
    options = PushOptions(sender=a.sender)  # this worker's arm, changed by `prepare`
    quiet_gc()
    prepared: dict[int, tuple] = {}
    reply({"ready": True})
    try:
        for line in sys.stdin:
            msg = json.loads(line)
            cmd = msg.get("cmd")
            try:
                if cmd == "quit":
                    break
                if cmd == "prepare":  # the gradient and the push, ready before the barrier
                    options = arm(options, msg)
                    if msg.get("forget_windows"):  # a variant's block starts afresh
                        ep.sender.forget()
                    g = worker_tensor(msg["seed"], a.id, msg["round"], msg["nelems"])
                    prepared[msg["round"]] = ep.prepare_push(msg["round"], g, ps,
                                                             critical=msg.get("critical"),
                                                             options=options)
                    reply({"ready": True})
                elif cmd == "push":
                    rep = ep.send(prepared.pop(msg["round"]))
                    reply({"report": rep.to_dict()})
                elif cmd == "expect":
                    plan = None
                    if msg.get("deferred"):
                        plan = ep.expect_deferred(msg["round"], msg["nelems"], a.id)
                    else:
                        ep.expect(msg["round"], msg["nelems"], a.id,
                                  coded=msg.get("coded", False))
                    reply({"ready": True})
                    res = ep.receive_round(msg["round"], timeout_s=msg.get("timeout", 20.0))
                    reply({"sha256": hashlib.sha256(res.values[0].tobytes()).hexdigest(),
                           "rebuilt": res.rebuilt,
                           "verify_csum": ep.verify_csum,
                           "bad_csum": ep.maps.counters()["bad_csum"],
                           "deferred": None if plan is None else
                           [int(c) for c in plan.deferred.nonzero()[0]]})
                else:
                    reply({"error": f"unknown command {cmd!r}"})
            except Exception as e:
                reply({"error": f"{type(e).__name__}: {e}"})
    finally:
        ep.close()
    return 0


if __name__ == "__main__":
    import os
    profile = settings_table.env("profile")   # developer aid: cProfile of one worker to a file
    if profile:
        import cProfile
        cProfile.run("rc = main()", f"{profile}.{os.getpid()}")
        sys.exit(0)
    sys.exit(main())
