# SPDX-License-Identifier: Apache-2.0
"""Prometheus metrics of the loaded LTP programs, read from their maps at scrape time.

`LtpCollector` is a prometheus_client collector: each scrape lists what
`ltp status` lists (registry.status), opens each program's maps
(registry.find + registry.open_maps), takes the snapshot `ltp flows` shows
(flows.snapshot) and the round-time histogram from ltp_rounds, and closes
the maps again. Nothing polls between scrapes, so what a scrape returns is
what `ltp flows -j` would print at that moment.

Every series carries netns, dev and job (a program); per-flow series add
worker and slot. Counters are the programs' own (never reset while the
program lives), so Prometheus' rate() works on them as on any counter.
"""
from __future__ import annotations

import logging
import time
from typing import Any
from collections.abc import Iterator

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, InfoMetricFamily)
from prometheus_client.utils import floatToGoString

from ...errors import LtpError
from . import flows, registry
from .maps import COUNTERS, LATE_BOUNDS_S, ROUND_REASONS, ROUND_TIME_BOUNDS_S

log = logging.getLogger("ltpx.metrics")

PROGRAM = ["netns", "dev", "job"]
FLOW = PROGRAM + ["worker", "slot"]
#: the `le` labels of the round-time histogram (the last bucket takes the rest)
BUCKET_LABELS = [*map(floatToGoString, ROUND_TIME_BOUNDS_S), "+Inf"]
#: ... and of the lateness histogram's
LATE_LABELS = [*map(floatToGoString, LATE_BOUNDS_S), "+Inf"]

#: per-flow counters: the key of a `ltp flows -j` row -> help text; each is
#: served as ltp_flow_<key>_total
FLOW_COUNTERS = {
    "packets": "DATA packets that passed validation, duplicates included (ltp_stats rx_packets)",
    "bytes": "payload bytes of those packets (ltp_stats rx_bytes)",
    "acks": "ACKs sent with XDP_TX, re-ACKs and CLOSED ACKs included (ltp_stats acks_tx)",
    "dup": "duplicate chunks: not rewritten, re-ACKed",
    "late": "packets of closed rounds: not written, ACKed CLOSED",
    "stale": "packets of a round older than their bank holds: dropped",
    "future": "packets of a round not opened yet: dropped",
    "out_of_range": "chunk index or count disagreeing with the bank: dropped",
    "delivered": "chunks written into the reassembly memory",
    "acks_rx": "ACKs this host's sender recorded from the peer",
    "acks_stale": "ACKs for a round this host was not sending to the peer",
    "chunks_delivered": "chunks delivered, over the rounds the control plane recorded",
    "chunks_filled": "chunks Bubble-Filled (missing at close), over the recorded rounds",
}


def _job(job: int | None) -> str:
    return "" if job is None else f"{job:#x}"


class _Families:
    """The metric families of one scrape, filled program by program."""

    def __init__(self) -> None:
        g, c = GaugeMetricFamily, CounterMetricFamily
        self.info = InfoMetricFamily("ltp_program", "a program `ltp status` lists (1), "
                                     "with its role, mode, program id and state",
                                     labels=PROGRAM)
        self.up = g("ltp_program_up", "1 if this scrape read the program's maps, else 0",
                     labels=PROGRAM)
        self.xdp = c("ltp_xdp_packets", "packets the XDP program counted, by class "
                     "(enum ltp_counter: every drop class, pass, data, acks...)",
                     labels=PROGRAM + ["class"])
        self.round = g("ltp_round_current", "round of the newest bank the program holds",
                       labels=PROGRAM)
        self.round_open = g("ltp_round_open", "1 while that round is open, else 0 "
                            "(closed, or its bank being cleared)", labels=PROGRAM)
        self.round_chunks = g("ltp_round_nchunks", "chunks per worker of that round",
                              labels=PROGRAM)
        self.delivered = g("ltp_delivered_ratio", "chunks delivered / (delivered + "
                           "filled) over every flow's recorded rounds", labels=PROGRAM)
        self.flow = {k: c(f"ltp_flow_{k}", h, labels=FLOW) for k, h in FLOW_COUNTERS.items()}
        self.rounds = c("ltp_flow_rounds", "rounds closed, by reason: complete, early "
                        "(Early Close), deadline, timeout", labels=FLOW + ["reason"])
        self.flow_delivered = g("ltp_flow_delivered_ratio", "chunks delivered / (delivered "
                                "+ filled) over the flow's recorded rounds", labels=FLOW)
        self.flow_last = g("ltp_flow_last_delivered_ratio", "the same for the flow's last "
                           "recorded round", labels=FLOW)
        self.last_round = g("ltp_flow_last_round", "round number of the flow's last "
                            "recorded round", labels=FLOW)
        self.budget = g("ltp_flow_loss_budget", "the loss budget Early Close had for the "
                        "flow's last recorded round (the loss policy's; 0: none)", labels=FLOW)
        self.live = g("ltp_flow_round_chunks", "chunks of the newest bank's round in so "
                      "far (live progress)", labels=FLOW)
        self.time = HistogramMetricFamily("ltp_flow_round_seconds", "round time, open to "
                                          "close, of the flow's recorded rounds",
                                          labels=FLOW)
        self.straggler = c("ltp_flow_straggler_rounds", "rounds that named the flow's "
                           "worker their straggler (its last chunk came last beyond the "
                           "margin, or the round waited for it; docs/slow-or-stuck.md)",
                           labels=FLOW)
        self.late = HistogramMetricFamily("ltp_flow_lateness_seconds", "the flow's lateness "
                                          "per round: its last chunk's arrival at the NIC "
                                          "minus the round's median last arrival (on time "
                                          "or early: the first bucket)", labels=FLOW)
        self.scrape = g("ltp_scrape_duration_seconds", "time this scrape took to read "
                        "every program")

    def all(self) -> list:
        return [self.info, self.up, self.xdp, self.round, self.round_open, self.round_chunks, self.delivered,
                *self.flow.values(), self.rounds, self.flow_delivered, self.flow_last,
                self.last_round, self.budget, self.live, self.time, self.straggler, self.late,
                self.scrape]

    def add_program(self, snap: dict[str, Any], hists: dict[int, dict]) -> None:
        """One program's snapshot (flows.snapshot) and its flows' round
        stats (LtpMaps.round_stats by slot)."""
        p = [snap["netns"], dev_label(snap), _job(snap["job"])]
        for name in COUNTERS:
            if name in snap["counters"]:        # an older build's program has fewer
                self.xdp.add_metric(p + [name], snap["counters"][name])
        rn = snap["round_now"]
        if rn is not None:
            self.round.add_metric(p, rn["round"])
            self.round_open.add_metric(p, int(rn["state"] == "open"))
            self.round_chunks.add_metric(p, rn["nchunks"])
        filled = sum(f["chunks_filled"] for f in snap["flows"])
        delivered = sum(f["chunks_delivered"] for f in snap["flows"])
        if delivered + filled:
            self.delivered.add_metric(p, delivered / (delivered + filled))
        for f in snap["flows"]:
            self._add_flow(p + [str(f["worker"]), str(f["slot"])], f, hists[f["slot"]])

    def _add_flow(self, labels: list[str], f: dict[str, Any], rs: dict) -> None:
        for key, fam in self.flow.items():
            fam.add_metric(labels, f[key])
        for reason in ROUND_REASONS:
            self.rounds.add_metric(labels + [reason], f["rounds"][reason])
        if f["loss"] is not None:
            self.flow_delivered.add_metric(labels, 1.0 - f["loss"])
        if f["loss_last"] is not None:
            self.flow_last.add_metric(labels, 1.0 - f["loss_last"])
        if f["last_round"] is not None:
            self.last_round.add_metric(labels, f["last_round"])
            self.budget.add_metric(labels, f["loss_budget_last"])
        if f["round_chunks"] is not None:
            self.live.add_metric(labels, f["round_chunks"])
        cumulative, buckets = 0, []
        for bound, n in zip(BUCKET_LABELS, rs["time_hist"]):
            cumulative += n
            buckets.append((bound, cumulative))
        self.time.add_metric(labels, buckets, rs["time_us"] / 1e6)
        self.straggler.add_metric(labels, rs["straggler"])
        cumulative, buckets = 0, []
        for bound, n in zip(LATE_LABELS, rs["late_hist"]):
            cumulative += n
            buckets.append((bound, cumulative))
        self.late.add_metric(labels, buckets, 0.0)   # no sum kept: lateness can be negative


class LtpCollector:
    """Every program `ltp status` lists (in namespace `ns` if given: None is
    the host's own, ... all), read when Prometheus scrapes."""

    def __init__(self, ns: Any = ...):
        self.ns = ns

    def describe(self) -> list:
        return []       # names are dynamic; registering must not scrape (needs root)

    def collect(self) -> Iterator:
        t0 = time.perf_counter()
        fam = _Families()
        rows = registry.status(self.ns)
        for row in rows:
            p = [row["netns"], dev_label(row), _job(row["job"])]
            fam.info.add_metric(p, {"role": row["role"] or "", "mode": row["mode"] or "",
                                    "prog_id": str(row["prog_id"] or ""), "state": row["state"]})
            try:
                snap, hists = read_program(row["dev"], registry.ns_arg(row["netns"]),
                                           row.get("seat_port") or 0)
            except (LtpError, OSError) as e:
                # a program `ltp status` already calls dead or gone is expected
                # to be unreadable: say so only with -v, not every scrape
                (log.warning if row["state"] == "ok" else log.info)(
                    "%s in %s (%s): %s", row["dev"], row["netns"], row["state"],
                    getattr(e, "strerror", None) or e)
                fam.up.add_metric(p, 0)
                continue
            fam.up.add_metric(p, 1)
            fam.add_program(snap, hists)
        fam.scrape.add_metric([], time.perf_counter() - t0)
        log.info("scrape: %d programs in %.1f ms", len(rows), 1e3 * (time.perf_counter() - t0))
        yield from fam.all()


def dev_label(row: dict[str, Any]) -> str:
    """The `dev` label of a program: its device, `DEV:PORT` for one in a
    seat of the device's mux (as `ltp status` shows it)."""
    return f"{row['dev']}:{row['seat_port']}" if row.get("seat_port") else row["dev"]


def read_program(dev: str, ns: str | None, port: int = 0) -> tuple[dict[str, Any],
                                                                 dict[int, dict]]:
    """The flows snapshot of `dev` in `ns` (port: of the program in the seat
    of its mux taking that port) and each slot's round stats, from its maps,
    which are closed again before this returns."""
    rec = registry.read_record(dev, ns, port) if port else registry.find(dev, ns)
    if rec is None:
        raise LtpError(f"no seat on {registry.where(dev, ns)} takes port {port}")
    maps = registry.open_maps(rec)
    try:
        snap = flows.snapshot(rec, maps)
        return snap, {s: maps.round_stats(s) for s in sorted(set(rec.peers.values()))}
    finally:
        maps.close()
