# SPDX-License-Identifier: Apache-2.0
"""`ltp bench incast`: LTP against TCP cubic and BBR and the line-rate limit.

For each configuration one fresh rig is built. Every transport runs
barrier-synchronised rounds in which each worker pushes SIZE bytes to the PS;
the transports take turns in blocks of rounds (LTP, cubic, BBR, LTP, ...) so
that machine noise hits them alike, and each block starts with warm-up rounds
that are not counted. Round time is measured at the PS: for LTP from opening
the round (just before the workers are told to go) to Early Close; for TCP
from the "go" byte to the last byte (control/bench/tcp.py).

Each transport also gets `goodput_bps` (payload bits delivered over its
counted rounds / their time) and `cpu_s_per_round` (the machine's busy CPU
seconds, /proc/stat, over its counted rounds only: for LTP from opening the
round to the last worker's report, for TCP from "go" to the last byte; the
whole machine, so on a shared one the alternating blocks matter). With one
worker a configuration is a single-flow measurement: its goodput is the flow's.

LTP's senders can be A/B'd in one run: `ltp-socket` (the paced socket),
`ltp-xdp` (the ACK clock) and `ltp-auto` (the default: the clock, and the
socket toward a worker whose path loses much, chosen per push) take turns on
the same endpoints with the other transports (`--transports
ltp-auto,ltp-xdp,ltp-socket,tcp-cubic`), and `ratios` gives each one's
median, p99, goodput and CPU per round over every other transport's, all
from the same run. Plain `ltp` is LTP with the sender `--sender` picks (auto
by default, where the grow check passes).

The rig is built without XDP on the switch ports (mode "skb") so the hosts'
veths keep TSO for TCP as a real NIC would; LTP's endpoints run native XDP on
the hosts, and the switch ports that must deliver XDP_TX frames get an
XDP_PASS program: the PS's (ACKs) always, the workers' (the ACK clock's
DATA) during ACK-clock blocks only (control/bench/runners.py).
"""
from __future__ import annotations

import collections
import statistics
from collections.abc import Callable

import numpy as np

from ...dataplane.rig.star import Rig, RigConfig
from ...dataplane.tcp_cc import ensure_cc
from ..transport.early_close import RULES
from .cpustat import ncpu
from .runners import LTP_SENDERS, Rounds, is_ltp, make_runners, parse_label, variant

TRANSPORTS = ("ltp", "ltp-socket", "ltp-xdp", "ltp-auto", "tcp-cubic", "tcp-bbr")


def _pct(xs, q) -> float:
    return float(np.percentile(np.asarray(xs, dtype=float), q))


def check_transports(transports: list[str]) -> None:
    """ValueError naming what is wrong with a transport list (names, and
    an LTP label's :KNOB=N, runners.parse_label)."""
    parsed = [parse_label(t) for t in transports]
    bad = [t for t, (name, rule, _) in zip(transports, parsed)
           if name not in TRANSPORTS or rule is not None]  # rules come from --early-close
    if bad or not transports:
        raise ValueError(f"unknown transport(s) {bad}; choose from {', '.join(TRANSPORTS)} "
                         "(LTP's with :KNOB=N, e.g. ltp-xdp:credit=0)")
    knobbed = [t for t, (name, _, knobs) in zip(transports, parsed)
               if knobs and (not is_ltp(t) or name == "ltp-socket")]
    if knobbed:
        raise ValueError(f"{', '.join(knobbed)}: only the ACK clock's transports take knobs "
                         "(ltp-xdp, ltp-auto, or ltp unless --sender socket)")
    if len(set(transports)) != len(transports):
        raise ValueError(f"a transport is named twice in {','.join(transports)}")
    names = [name for name, _, _ in parsed]
    if "ltp" in names and any(n in LTP_SENDERS for n in names):
        raise ValueError("ltp (whose sender --sender picks) cannot be combined with "
                         f"{' or '.join(LTP_SENDERS)}: name each sender's transport instead, "
                         "e.g. ltp-xdp,ltp-socket,tcp-cubic")


def labels(transports: list[str], rules: list[str]) -> list[str]:
    """The run's transport labels: with more than one Early Close rule, every
    LTP transport once per rule (ltp-socket@progress, ltp-socket@capacity)."""
    bad = [r for r in rules if r not in RULES]
    if bad or not rules or len(set(rules)) != len(rules):
        raise ValueError(f"Early Close rules {rules}: each once, from {', '.join(RULES)}")
    if len(rules) == 1:
        return list(transports)
    return [f"{t}@{r}" if is_ltp(t) else t for t in transports
            for r in (rules if is_ltp(t) else [None])]


def _summary(r: Rounds, limit: float, round_bits: int, label: str, sender: str,
             rule: str) -> dict:
    """The documented per-transport figures. goodput_bps: payload bits
    delivered over the counted rounds / their summed time; cpu_s_per_round:
    busy CPU seconds of the whole machine per counted round; LTP's also say
    their sender, the share of DATA the ACK clock made (clock_share), the
    counted pushes by the sender that made them and why (pushes,
    sender_whys: auto sends toward a lossy path by the socket) and their
    Early Close rule."""
    times = r.times
    med = statistics.median(times)
    p99 = _pct(times, 99)
    out = {"median_s": med, "p99_s": p99, "max_s": max(times),
           "median_over_limit": med / limit, "p99_over_limit": p99 / limit,
           "delivered": float(np.mean(r.delivered)), "rounds": len(times),
           "goodput_bps": round_bits * sum(r.delivered) / sum(times),
           "cpu_s_per_round": sum(r.cpu_s) / len(times), "round_s": times,
           "reasons": dict(collections.Counter(r.reasons)), "path_drops": r.path_drops,
           "missing_chunks": r.missing_chunks, "cut_worst": r.cut_worst}
    if is_ltp(label):
        s, rule = variant(label, sender, rule)
        out.update(sender=s, early_close=rule, sent=r.sent, credit_frames=r.credit_frames,
                   clock_share=r.clock_tx / r.sent if r.sent else 0.0,
                   pushes=dict(r.pushes), sender_whys=dict(r.whys))
    return out


def run_config(*, workers: int, rate_bps: int, buffer_bytes: int, size: int, rounds: int,
               loss: float, transports: list[str], block: int = 10, warmup: int = 2,
               mtu: int = 1500, name: str = "bench", sender: str = "socket",
               rules: list[str] | None = None,
               progress: Callable[[str, int, int], None] | None = None) -> dict:
    """One configuration on one fresh rig; returns the documented JSON object.
    rules: Early Close rules (RULES) every LTP transport runs under, each
    its own label when there are several (default: progress)."""

    check_transports(transports)
    rules = list(rules or ["progress"])
    names = labels(transports, rules)
    for t in transports:
        if t.startswith("tcp-"):
            ensure_cc(t[4:])
    if size % 4:
        raise ValueError("size must be a multiple of 4 bytes (whole float32 elements)")
    if block < 1 or warmup < 0:
        raise ValueError(f"block must be >= 1 and warmup >= 0, got {block} and {warmup}")
    limit = workers * size * 8 / rate_bps
    cfg = RigConfig(name=name, workers=workers, rate_bps=rate_bps, buffer_bytes=buffer_bytes,
                    loss=loss, mode="skb", mtu=mtu)
    tally = _Tally(names, rounds, progress)
    with Rig(cfg) as rig:
        _take_turns(rig, tally, size=size, block=block, warmup=warmup, sender=sender,
                    rule=rules[0])
    results = {t: _summary(tally.rounds[t], limit, workers * size * 8, t, sender, rules[0])
               for t in names}
    return {"config": {"workers": workers, "rate_bps": rate_bps, "buffer_bytes": buffer_bytes,
                       "size_bytes": size, "rounds": rounds, "loss": loss, "mtu": mtu,
                       "sender": sender, "early_close": rules,
                       "transports": list(transports), "block": block, "warmup": warmup,
                       "ncpu": ncpu()},
            "limit_s": limit, "results": results, "schedule": tally.schedule,
            **_ratios(results)}


def _ratio(a: dict, b: dict) -> dict:
    """a's figures over b's, measured in the same run."""
    return {"median": a["median_s"] / b["median_s"], "p99": a["p99_s"] / b["p99_s"],
            "goodput": a["goodput_bps"] / b["goodput_bps"],
            "cpu_s_per_round": (a["cpu_s_per_round"] / b["cpu_s_per_round"]
                                if b["cpu_s_per_round"] > 0 else None)}


def _ratios(results: dict) -> dict:
    """ratios: every LTP transport's median, p99, goodput and CPU per round
    over every other transport's. speedup (each other transport's median
    over LTP's) and ltp_over (LTP's goodput and CPU over each other's) are
    taken against the first LTP transport of the run."""
    ltps = [t for t in results if is_ltp(t)]
    ratios = {a: {b: _ratio(results[a], results[b]) for b in results if b != a} for a in ltps}
    speedup, over = {}, {}
    if ltps:
        base = ratios[ltps[0]]
        for t, r in base.items():
            speedup[t] = 1 / r["median"]
            over[t] = {"goodput": r["goodput"], "cpu_s_per_round": r["cpu_s_per_round"]}
    return {"ratios": ratios, "speedup": speedup, "ltp_over": over}


class _Tally:
    """Counted rounds per transport, the blocks in the order they ran, and progress."""

    def __init__(self, transports: list[str], rounds: int,
                 progress: Callable[[str, int, int], None] | None):
        self.transports, self.target, self.progress = transports, rounds, progress
        self.rounds: dict[str, Rounds] = {t: Rounds() for t in transports}
        self.schedule: list[list] = []  # [transport, counted rounds] per block, in order
        self.done = 0
        self.total = rounds * len(transports)

    def add(self, t: str, got: Rounds) -> None:
        self.rounds[t].extend(got)
        self.schedule.append([t, len(got.times)])
        self.done += len(got.times)
        self.tick(t, 0)

    def tick(self, t: str, ahead: int) -> None:
        if self.progress:
            self.progress(t, self.done + ahead, self.total)

    def owed(self, t: str, block: int) -> int:
        """How many counted rounds transport t runs in its next block."""
        return min(block, self.target - len(self.rounds[t].times))


def _take_turns(rig, tally: _Tally, *, size: int, block: int, warmup: int,
                sender: str = "socket", rule: str = "progress") -> None:
    """The transports in blocks of rounds, in the order given (e.g. ltp-xdp,
    ltp-socket, cubic, ltp-xdp, ...), until each has its rounds. LTP's
    endpoints stay up between its blocks; TCP's start anew."""
    runners, close = make_runners(tally.transports, rig, size, warmup, sender, rule)
    try:
        while any(tally.owed(t, block) > 0 for t in tally.transports):
            for t in tally.transports:
                n = tally.owed(t, block)
                if n > 0:
                    before = sum(rig.drops().values())
                    got = runners[t].block(n, lambda k, t=t: tally.tick(t, k))
                    got.path_drops = sum(rig.drops().values()) - before
                    tally.add(t, got)
    finally:
        close()


def table(res: dict) -> str:
    """An 80-column table of one configuration: round times (speedup: each
    transport's median over the first LTP's), goodput and the machine's CPU
    per round, then every LTP transport's ratios to the others."""
    c = res["config"]
    w = max(10, *(len(t) for t in res["results"]))
    who = "1 flow" if c["workers"] == 1 else f"{c['workers']} workers"
    lines = [f"{who} x {c['size_bytes'] // 1024} KiB, "
             f"{c['rate_bps'] / 1e9:g} Gbit/s, buffer {c['buffer_bytes'] // 1000} kB, "
             f"loss {c['loss']:g}: limit {res['limit_s'] * 1e3:.1f} ms",
             f"{'transport':<{w}} {'median ms':>10} {'p99 ms':>9} {'max ms':>9} "
             f"{'med/lim':>8} {'p99/lim':>8} {'deliv':>7} {'speedup':>8}"]
    for t, r in res["results"].items():
        sp = res["speedup"].get(t)
        lines.append(f"{t:<{w}} {r['median_s'] * 1e3:>10.1f} {r['p99_s'] * 1e3:>9.1f} "
                     f"{r['max_s'] * 1e3:>9.1f} {r['median_over_limit']:>8.2f} "
                     f"{r['p99_over_limit']:>8.2f} {r['delivered']:>7.4f} "
                     f"{(f'{sp:.1f}x' if sp else '-'):>8}")
    lines.append(f"{'transport':<{w}} {'goodput Gbit/s':>15} {'cpu ms/round':>13} "
                 f"{'sender':>7} {'clock share':>12}   ({c.get('ncpu', '?')} CPUs)")
    for t, r in res["results"].items():
        share = f"{r['clock_share']:.2f}" if "clock_share" in r else "-"
        lines.append(f"{t:<{w}} {r['goodput_bps'] / 1e9:>15.3f} "
                     f"{r['cpu_s_per_round'] * 1e3:>13.1f} {r.get('sender', '-'):>7} "
                     f"{share:>12}")
    pairs = [(a, b, q) for a, row in res.get("ratios", {}).items() for b, q in row.items()
             if _compared(res["results"], a, b)]
    if pairs:
        v = max(23, *(len(a) + len(b) + 3 for a, b, _ in pairs))
        lines.append(f"{'same run: a / b':<{v}} {'median':>8} {'p99':>8} {'goodput':>8} "
                     f"{'cpu/round':>10}")
        for a, b, q in pairs:
            u = q["cpu_s_per_round"]
            lines.append(f"{a + ' / ' + b:<{v}} {q['median']:>8.2f} {q['p99']:>8.2f} "
                         f"{q['goodput']:>7.2f}x {(f'{u:.2f}x' if u else '-'):>10}")
    return "\n".join(lines)


def _compared(results: dict, a: str, b: str) -> bool:
    """Which of the ratios the table shows (the JSON has all): an LTP
    transport over each other kind, and over a later LTP one that differs
    only in its sender or only in its Early Close rule."""
    if not is_ltp(b):
        return True
    names = list(results)
    ra, rb = results[a], results[b]
    return names.index(b) > names.index(a) and (ra["sender"] == rb["sender"] or
                                                 ra["early_close"] == rb["early_close"])


def plot(results: list[dict], path: str) -> None:
    """CDF of round times per transport (first configuration) and, for a
    sweep, median/limit against worker count."""
    import matplotlib  # noqa: PLC0415 (optional: the plot extra)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (optional: the plot extra)
    sweep = len(results) > 1
    fig, axes = plt.subplots(1, 2 if sweep else 1, figsize=(11 if sweep else 6, 4.2))
    axes = np.atleast_1d(axes)
    ax = axes[0]
    base = results[-1]
    for t, r in base["results"].items():
        xs = np.sort(np.asarray(r["round_s"]) / base["limit_s"])
        ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=t)
    ax.axvline(1.0, color="k", ls=":", lw=1, label="line-rate limit")
    ax.set_xscale("log")
    ax.set_xlabel("round time / line-rate limit")
    ax.set_ylabel("CDF of rounds")
    ax.set_title(f"{base['config']['workers']} workers x "
                 f"{base['config']['size_bytes'] // 1024} KiB")
    ax.legend()
    if sweep:
        ax = axes[1]
        ws = [r["config"]["workers"] for r in results]
        for t in base["results"]:
            ax.plot(ws, [r["results"][t]["median_over_limit"] for r in results], "o-", label=t)
        ax.axhline(1.0, color="k", ls=":", lw=1)
        ax.set_yscale("log")
        ax.set_xlabel("workers")
        ax.set_ylabel("median round / limit")
        ax.set_title("scaling")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
