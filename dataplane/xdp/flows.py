# SPDX-License-Identifier: Apache-2.0
"""Per-flow counters of a loaded ltp_xdp program, read from its pinned maps.

One row per peer slot (a worker on a PS; the host's own id on a worker):
what XDP counted (ltp_stats), what the control plane recorded about closed
rounds (ltp_rounds), and the progress of the newest bank. Drop classes that
have no slot (malformed, foreign job, bad magic...) are program-wide
(ltp_counters) and go in `totals`; so does `stale_owner` (DATA a hung
receiver did not ACK: its heartbeat was stale). `rates` turns two snapshots into per-second
rates for `ltp top`.

A sharded job's server s of S (a program with bank stride S,
docs/transport.md, "One device for a sharded worker") takes round r as
r·S + s on the wire: its rows show the op's round r, with `wire_round` and
`last_wire_round` beside (elsewhere equal to the round). A sharded worker's
program (2S banks, stride 1) holds every server's rounds and shows the
wire's.

Loss estimate of a slot: filled / (delivered + filled) over the rounds the
control plane recorded, i.e. 1 - delivered / (delivered + missing), since
Bubble Filling fills every chunk that did not arrive. `loss_last` is the same
for the latest recorded round. Both are None until a round is recorded.
"""
from __future__ import annotations

import time
from typing import Any

from .maps import BANK_STATES, LATE_BOUNDS_S, ROUND_REASONS

#: ltp_stats fields a row shows, under the row's names
_STATS = {"packets": "rx_packets", "bytes": "rx_bytes", "acks": "acks_tx", "dup": "dup",
          "late": "late", "stale": "stale", "future": "future", "out_of_range": "out_of_range",
          "delivered": "delivered", "acks_rx": "acks_rx", "acks_stale": "acks_stale"}
#: program-wide drop classes shown in the totals line
PROGRAM_DROPS = ("malformed", "foreign_job", "bad_magic", "bad_version", "unknown_worker",
                 "ack_fail", "bad_token", "stale_owner")
#: row fields that `rates` turns into per-second values
RATE_FIELDS = ("packets", "bytes", "acks", "dup", "late", "out_of_range", "delivered", "acks_rx")


def _frac(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def hist_quantile(hist: list[int], bounds: tuple[float, ...], q: float) -> float | None:
    """The q-quantile of a histogram (counts per bucket of `bounds`, the last
    bucket open-ended) as its bucket's upper bound in seconds: an upper bound
    of the quantile (past the last bound: twice it). None if empty."""
    total = sum(hist)
    if not total:
        return None
    need, seen = q * total, 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= need:
            return bounds[i] if i < len(bounds) else 2 * bounds[-1]
    return 2 * bounds[-1]


def snapshot(rec, maps) -> dict[str, Any]:
    """Everything `ltp flows` shows for one program (rec: registry.Record,
    maps: LtpMaps over its pins)."""
    g = rec.geometry
    banks = [maps.banks.get(b) for b in range(g.banks)]
    live = None
    if any(b.state for b in banks):
        # the bank holding the newest round
        bi = max((i for i, b in enumerate(banks) if b.state), key=lambda i: banks[i].round)
        b = banks[bi]
        live = {"bank": bi, "round": int(b.round) // g.stride, "wire_round": int(b.round),
                "state": BANK_STATES.get(b.state, "?"), "nchunks": int(b.nchunks)}
    rows = []
    for worker, slot in sorted(rec.peers.items(), key=lambda kv: (kv[1], kv[0])):
        st = maps.slot_stats(slot)
        rs = maps.round_stats(slot)
        row: dict[str, Any] = {"worker": worker, "slot": slot}
        row.update({k: st[v] for k, v in _STATS.items()})
        row["rounds"] = {r: rs[r] for r in ROUND_REASONS}
        row["chunks_delivered"] = rs["delivered"]     # over recorded rounds
        row["chunks_filled"] = rs["filled"]
        seen = any(rs[r] for r in ROUND_REASONS)
        row["last_round"] = rs["last_round"] // g.stride if seen else None
        row["last_wire_round"] = rs["last_round"] if seen else None
        row["last_delivered"] = rs["last_delivered"]
        row["last_filled"] = rs["last_filled"]
        row["loss"] = _frac(rs["filled"], rs["delivered"] + rs["filled"])
        row["loss_last"] = _frac(rs["last_filled"], rs["last_delivered"] + rs["last_filled"])
        # the loss policy's Early Close budget for that round (0: none)
        row["loss_budget_last"] = rs["last_budget_ppm"] / 1e6 if row["last_round"] is not None \
            else None
        # who the rounds waited for (control/transport/straggler.py): the rounds
        # that named this worker, and its lateness's p50/p99 (upper bounds, ms)
        row["straggler_rounds"] = rs["straggler"]
        for q in (50, 99):
            v = hist_quantile(rs["late_hist"], LATE_BOUNDS_S, q / 100)
            row[f"lateness_p{q}_ms"] = None if v is None else round(v * 1e3, 3)
        if live is not None:
            p = maps.progress[live["bank"], slot]
            row["round_chunks"] = int(p["chunks"])     # newest bank, live
            row["round_retx"] = int(p["retx"])
        else:
            row["round_chunks"] = row["round_retx"] = None
        rows.append(row)
    counters = maps.counters()
    totals: dict[str, Any] = {k: sum(r[k] for r in rows) for k in _STATS}
    totals["rounds"] = {r: sum(row["rounds"][r] for row in rows) for r in ROUND_REASONS}
    totals.update({k: counters.get(k, 0) for k in PROGRAM_DROPS})  # an older build: fewer
    return {"netns": rec.to_dict()["netns"], "dev": rec.dev, "seat_port": rec.port or None,
            "role": rec.role, "label": rec.label or None, "job": rec.job,
            "mode": rec.mode, "prog_id": rec.prog_id, "slots": g.slots, "round_now": live,
            "sender": rec.sender or None, "sender_why": rec.sender_why or None,
            "time": time.time(), "monotonic": time.monotonic(), "flows": rows,
            "totals": totals, "counters": counters}


def rates(prev: dict[str, Any] | None, cur: dict[str, Any]) -> dict[tuple[int, int], dict]:
    """Per-second rates of RATE_FIELDS per (worker, slot) between two
    snapshots of the same program; empty when there is no earlier one."""
    if prev is None:
        return {}
    dt = cur["monotonic"] - prev["monotonic"]
    if dt <= 0:
        return {}
    before = {(r["worker"], r["slot"]): r for r in prev["flows"]}
    out = {}
    for r in cur["flows"]:
        p = before.get((r["worker"], r["slot"]))
        if p is None:
            continue
        out[(r["worker"], r["slot"])] = {k: max(0, r[k] - p[k]) / dt for k in RATE_FIELDS}
    return out
