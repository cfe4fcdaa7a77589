"""`ltp bench incast`: LTP against TCP cubic and BBR and the line-rate limit.

For each configuration one fresh rig is built. Every transport runs
barrier-synchronised rounds in which each worker pushes SIZE bytes to the PS;
the transports take turns in blocks of rounds (LTP, cubic, BBR, LTP, ...) so
that machine noise hits them alike, and each block starts with warm-up rounds
that are not counted. Round time is measured at the PS: for LTP from opening
the round (just before the workers are told to go) to Early Close; for TCP
from the "go" byte to the last byte (control/bench/tcp.py).

The rig is built without XDP on the switch ports (mode "skb") so the hosts'
veths keep TSO for TCP as a real NIC would; LTP's endpoints run native XDP on
the hosts, and the one switch port that must deliver the PS's XDP_TX ACKs
gets an XDP_PASS program.
"""
from __future__ import annotations

import statistics
from typing import Callable

import numpy as np

TRANSPORTS = ("ltp", "tcp-cubic", "tcp-bbr")


def _pct(xs, q) -> float:
    return float(np.percentile(np.asarray(xs, dtype=float), q))


def _summary(times: list[float], limit: float, delivered: float) -> dict:
    med = statistics.median(times)
    p99 = _pct(times, 99)
    return {"median_s": med, "p99_s": p99, "max_s": max(times),
            "median_over_limit": med / limit, "p99_over_limit": p99 / limit,
            "delivered": delivered, "rounds": len(times), "round_s": times}


def run_config(*, workers: int, rate_bps: int, buffer_bytes: int, size: int, rounds: int,
               loss: float, transports: list[str], block: int = 10, warmup: int = 2,
               mtu: int = 1500, name: str = "bench",
               progress: Callable[[str, int, int], None] | None = None) -> dict:
    """One configuration on one fresh rig; returns the documented JSON object."""
    from ...dataplane.tcp_cc import ensure_cc
    from ...dataplane.rig.star import Rig, RigConfig

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
        _take_turns(rig, tally, size=size, block=block, warmup=warmup)
    results = {t: _summary(tally.times[t], limit, float(np.mean(tally.delivered[t])))
               for t in transports}
    speedup = {}
    if "ltp" in results:
        for t in transports:
            if t != "ltp":
                speedup[t] = results[t]["median_s"] / results["ltp"]["median_s"]
    return {"config": {"workers": workers, "rate_bps": rate_bps, "buffer_bytes": buffer_bytes,
                       "size_bytes": size, "rounds": rounds, "loss": loss, "mtu": mtu,
                       "transports": list(transports), "block": block, "warmup": warmup},
            "limit_s": limit, "results": results, "speedup": speedup}


class _Tally:
    """Counted round times and delivered fractions per transport, and progress."""

    def __init__(self, transports: list[str], rounds: int,
                 progress: Callable[[str, int, int], None] | None):
        self.transports, self.rounds, self.progress = transports, rounds, progress
        self.times: dict[str, list[float]] = {t: [] for t in transports}
        self.delivered: dict[str, list[float]] = {t: [] for t in transports}
        self.done = 0
        self.total = rounds * len(transports)

    def add(self, t: str, times: list[float], delivered: list[float]) -> None:
        self.times[t].extend(times)
        self.delivered[t].extend(delivered)
        self.done += len(times)
        self.tick(t, 0)

    def tick(self, t: str, ahead: int) -> None:
        if self.progress:
            self.progress(t, self.done + ahead, self.total)

    def owed(self, t: str, block: int) -> int:
        """How many counted rounds transport t runs in its next block."""
        return min(block, self.rounds - len(self.times[t]))


def _take_turns(rig, tally: _Tally, *, size: int, block: int, warmup: int) -> None:
    """The transports in blocks of rounds, LTP, cubic, BBR, LTP, ..., until each has
    its rounds. LTP's endpoints stay up between its blocks; TCP's start anew."""
    from ...dataplane.xdp.loader import attach_pass, detach
    from .cluster import LtpCluster
    from .tcp import run_tcp_incast
    ltp = "ltp" in tally.transports
    cluster = None
    try:
        if ltp:   # the switch port toward the PS must pass the PS's XDP_TX ACKs
            attach_pass(rig.ps.port, rig.switch_ns, "native")
            cluster = LtpCluster(rig, size // 4, mode="native")
        r = 0
        while any(tally.owed(t, block) > 0 for t in tally.transports):
            for t in tally.transports:
                n = tally.owed(t, block)
                if n <= 0:
                    continue
                if t != "ltp":
                    out = run_tcp_incast(rig, size=size, rounds=n, cc=t[4:], warmup=warmup,
                                         progress=lambda k, _n, _t, t=t: tally.tick(t, k))
                    tally.add(t, out["round_s"], [1.0] * n)
                    continue
                for i in range(warmup + n):
                    r += 1
                    res, _ = cluster.run_round(r, size // 4, seed=r)
                    if i >= warmup:
                        tally.add(t, [res.duration_s], [res.delivered_fraction])
    finally:
        if cluster is not None:
            cluster.close()
        if ltp:
            detach(rig.ps.port, rig.switch_ns, "native")


def table(res: dict) -> str:
    """An 80-column table of one configuration."""
    c = res["config"]
    lines = [f"{c['workers']} workers x {c['size_bytes'] // 1024} KiB, "
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
