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

The rig is built without XDP on the switch ports (mode "skb") so the hosts'
veths keep TSO for TCP as a real NIC would; LTP's endpoints run native XDP on
the hosts, and the one switch port that must deliver the PS's XDP_TX ACKs
gets an XDP_PASS program.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

TRANSPORTS = ("ltp", "tcp-cubic", "tcp-bbr")


def _pct(xs, q) -> float:
    return float(np.percentile(np.asarray(xs, dtype=float), q))


@dataclass
class Rounds:
    """Counted rounds of one transport: times, delivered fractions, and the
    machine's busy CPU seconds over each round."""

    times: list[float] = field(default_factory=list)
    delivered: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)

    def extend(self, other: "Rounds") -> None:
        self.times += other.times
        self.delivered += other.delivered
        self.cpu_s += other.cpu_s


def _summary(r: Rounds, limit: float, round_bits: int) -> dict:
    """The documented per-transport figures. goodput_bps: payload bits
    delivered over the counted rounds / their summed time; cpu_s_per_round:
    busy CPU seconds of the whole machine per counted round."""
    times = r.times
    med = statistics.median(times)
    p99 = _pct(times, 99)
    return {"median_s": med, "p99_s": p99, "max_s": max(times),
            "median_over_limit": med / limit, "p99_over_limit": p99 / limit,
            "delivered": float(np.mean(r.delivered)), "rounds": len(times),
            "goodput_bps": round_bits * sum(r.delivered) / sum(times),
            "cpu_s_per_round": sum(r.cpu_s) / len(times), "round_s": times}


def run_config(*, workers: int, rate_bps: int, buffer_bytes: int, size: int, rounds: int,
               loss: float, transports: list[str], block: int = 10, warmup: int = 2,
               mtu: int = 1500, name: str = "bench", sender: str = "socket",
               progress: Callable[[str, int, int], None] | None = None) -> dict:
    """One configuration on one fresh rig; returns the documented JSON object."""
    from ...dataplane.tcp_cc import ensure_cc
    from ...dataplane.rig.star import Rig, RigConfig
    from .cpustat import ncpu

    for t in transports:
        if t not in TRANSPORTS:
            raise ValueError(f"unknown transport {t!r}; choose from {', '.join(TRANSPORTS)}")
        if t.startswith("tcp-"):
            ensure_cc(t[4:])
    if size % 4:
        raise ValueError("size must be a multiple of 4 bytes (whole float32 elements)")
    limit = workers * size * 8 / rate_bps
    cfg = RigConfig(name=name, workers=workers, rate_bps=rate_bps, buffer_bytes=buffer_bytes,
                    loss=loss, mode="skb", mtu=mtu)
    tally = _Tally(transports, rounds, progress)
    with Rig(cfg) as rig:
        _take_turns(rig, tally, size=size, block=block, warmup=warmup, sender=sender)
    results = {t: _summary(tally.rounds[t], limit, workers * size * 8) for t in transports}
    return {"config": {"workers": workers, "rate_bps": rate_bps, "buffer_bytes": buffer_bytes,
                       "size_bytes": size, "rounds": rounds, "loss": loss, "mtu": mtu,
                       "sender": sender,
                       "transports": list(transports), "block": block, "warmup": warmup,
                       "ncpu": ncpu()},
            "limit_s": limit, "results": results, **_ratios(results)}


def _ratios(results: dict) -> dict:
    """speedup: each other transport's median round over LTP's; ltp_over:
    LTP's goodput and CPU per round over each other transport's."""
    speedup, over = {}, {}
    if "ltp" in results:
        ltp = results["ltp"]
        for t, r in results.items():
            if t != "ltp":
                speedup[t] = r["median_s"] / ltp["median_s"]
                over[t] = {"goodput": ltp["goodput_bps"] / r["goodput_bps"],
                           "cpu_s_per_round": (ltp["cpu_s_per_round"] / r["cpu_s_per_round"]
                                               if r["cpu_s_per_round"] > 0 else None)}
    return {"speedup": speedup, "ltp_over": over}


class _Tally:
    """Counted rounds per transport, and progress."""

    def __init__(self, transports: list[str], rounds: int,
                 progress: Callable[[str, int, int], None] | None):
        self.transports, self.target, self.progress = transports, rounds, progress
        self.rounds: dict[str, Rounds] = {t: Rounds() for t in transports}
        self.done = 0
        self.total = rounds * len(transports)

    def add(self, t: str, got: Rounds) -> None:
        self.rounds[t].extend(got)
        self.done += len(got.times)
        self.tick(t, 0)

    def tick(self, t: str, ahead: int) -> None:
        if self.progress:
            self.progress(t, self.done + ahead, self.total)

    def owed(self, t: str, block: int) -> int:
        """How many counted rounds transport t runs in its next block."""
        return min(block, self.target - len(self.rounds[t].times))


class LtpRunner:
    """LTP's side: one cluster (PS endpoint + worker processes) for the whole
    run, its round numbers going on across blocks."""

    def __init__(self, rig, size: int, warmup: int, sender: str = "socket"):
        from ...dataplane.xdp.loader import attach_pass, detach
        from .cluster import LtpCluster
        self.rig, self.size, self.warmup, self.r = rig, size, warmup, 0
        # the switch port toward the PS must pass the PS's XDP_TX ACKs; with the
        # ACK clock (sender xdp) the workers' ports pass their XDP_TX DATA too
        ports = [rig.ps.port] + ([w.port for w in rig.workers] if sender == "xdp" else [])
        self._detach = lambda: [detach(p, rig.switch_ns, "native") for p in ports]
        try:
            for p in ports:
                attach_pass(p, rig.switch_ns, "native")
            self.cluster = LtpCluster(rig, size // 4, mode="native", sender=sender)
        except BaseException:
            self._detach()
            raise

    def block(self, n: int, tick: Callable[[int], None]) -> Rounds:
        out = Rounds()
        for i in range(self.warmup + n):
            self.r += 1
            res, _ = self.cluster.run_round(self.r, self.size // 4, seed=self.r)
            if i >= self.warmup:
                out.times.append(res.duration_s)
                out.delivered.append(res.delivered_fraction)
                out.cpu_s.append(self.cluster.last_cpu_s)
                tick(len(out.times))
        return out

    def close(self) -> None:
        try:
            self.cluster.close()
        finally:
            self._detach()


class TcpRunner:
    """A TCP congestion control's side: agents started anew for each block."""

    def __init__(self, rig, size: int, warmup: int, cc: str):
        self.rig, self.size, self.warmup, self.cc = rig, size, warmup, cc

    def block(self, n: int, tick: Callable[[int], None]) -> Rounds:
        from .tcp import run_tcp_incast
        out = run_tcp_incast(self.rig, size=self.size, rounds=n, cc=self.cc, warmup=self.warmup,
                             progress=lambda k, _n, _t: tick(k))
        return Rounds(list(out["round_s"]), [1.0] * n, list(out["cpu_s"]))

    def close(self) -> None:
        pass


def make_runner(t: str, rig, size: int, warmup: int, sender: str = "socket"):
    """The runner of transport `t` (one of TRANSPORTS); LTP's pushes leave
    through `sender` (socket, or xdp: the ACK clock)."""
    if t == "ltp":
        return LtpRunner(rig, size, warmup, sender)
    return TcpRunner(rig, size, warmup, cc=t[len("tcp-"):])


def _take_turns(rig, tally: _Tally, *, size: int, block: int, warmup: int,
                sender: str = "socket") -> None:
    """The transports in blocks of rounds, LTP, cubic, BBR, LTP, ..., until each has
    its rounds. LTP's endpoints stay up between its blocks; TCP's start anew."""
    runners: dict = {}
    try:
        for t in tally.transports:
            runners[t] = make_runner(t, rig, size, warmup, sender)
        while any(tally.owed(t, block) > 0 for t in tally.transports):
            for t in tally.transports:
                n = tally.owed(t, block)
                if n > 0:
                    tally.add(t, runners[t].block(n, lambda k, t=t: tally.tick(t, k)))
    finally:
        for r in runners.values():
            r.close()


def table(res: dict) -> str:
    """An 80-column table of one configuration: round times, then goodput
    and the machine's CPU per round (with LTP's ratio to each)."""
    c = res["config"]
    who = "1 flow" if c["workers"] == 1 else f"{c['workers']} workers"
    lines = [f"{who} x {c['size_bytes'] // 1024} KiB, "
             f"{c['rate_bps'] / 1e9:g} Gbit/s, buffer {c['buffer_bytes'] // 1000} kB, "
             f"loss {c['loss']:g}: limit {res['limit_s'] * 1e3:.1f} ms",
             f"{'transport':<10} {'median ms':>10} {'p99 ms':>9} {'max ms':>9} "
             f"{'med/lim':>8} {'p99/lim':>8} {'deliv':>7} {'speedup':>8}"]
    for t, r in res["results"].items():
        sp = res["speedup"].get(t)
        lines.append(f"{t:<10} {r['median_s'] * 1e3:>10.1f} {r['p99_s'] * 1e3:>9.1f} "
                     f"{r['max_s'] * 1e3:>9.1f} {r['median_over_limit']:>8.2f} "
                     f"{r['p99_over_limit']:>8.2f} {r['delivered']:>7.4f} "
                     f"{(f'{sp:.1f}x' if sp else '-'):>8}")
    lines.append(f"{'transport':<10} {'goodput Gbit/s':>15} {'cpu ms/round':>13} "
                 f"{'ltp goodput/x':>14} {'ltp cpu/x':>10}   ({c.get('ncpu', '?')} CPUs)")
    for t, r in res["results"].items():
        o = res.get("ltp_over", {}).get(t, {})
        g, u = o.get("goodput"), o.get("cpu_s_per_round")
        lines.append(f"{t:<10} {r['goodput_bps'] / 1e9:>15.3f} "
                     f"{r['cpu_s_per_round'] * 1e3:>13.1f} "
                     f"{(f'{g:.2f}x' if g else '-'):>14} {(f'{u:.2f}x' if u else '-'):>10}")
    return "\n".join(lines)


def plot(results: list[dict], path: str) -> None:
    """CDF of round times per transport (first configuration) and, for a
    sweep, median/limit against worker count."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
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
