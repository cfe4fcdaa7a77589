# SPDX-License-Identifier: Apache-2.0
"""`ltp trace plot`: a trace-event file drawn as a timeline PNG (matplotlib, Agg).

What Perfetto shows, without a browser: one row per track (a process's
thread: a server's rounds and answers, its NIC's view of each worker, each
worker's barrier, pushes and answers), complete slices ("X") as bars coloured
by category, instants ("i") as ticks. Flows and counters are left out. Time
runs from the first event shown, in milliseconds; `window` picks a part.
"""
from __future__ import annotations

from .common import UsageError

COLOURS = {"round": "#4c72b0", "answer": "#55a868", "barrier": "#c44e52",
           "push": "#8172b2", "nic": "#ccb974"}
OTHER = "#64b5cd"


def tracks(events: list[dict], shown: list[dict]) -> list[tuple[tuple[int, int], str]]:
    """The (pid, tid) rows of the `shown` events with their labels ("process:
    thread", from the metadata among `events`), in pid then tid order; a row
    without metadata is named by its numbers."""
    procs, threads = {}, {}
    used = {(e.get("pid"), e.get("tid")) for e in shown}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            procs[e.get("pid")] = e.get("args", {}).get("name", "")
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e.get("pid"), e.get("tid"))] = e.get("args", {}).get("name", "")
    rows = sorted(used, key=lambda k: (str(k[0]) if not isinstance(k[0], int) else "",
                                       k[0] if isinstance(k[0], int) else 0,
                                       k[1] if isinstance(k[1], int) else 0))
    return [(k, f"{procs.get(k[0], f'pid {k[0]}')}: {threads.get(k, f'tid {k[1]}')}")
            for k in rows]


def window(events: list[dict], lo_s: float | None, hi_s: float | None):
    """The slices and instants inside [lo_s, hi_s] seconds from the first
    event's start, and that start (us)."""
    shown = [e for e in events if e.get("ph") in ("X", "i") and "ts" in e]
    if not shown:
        raise UsageError("the trace has no slices or instants to draw")
    t0 = min(float(e["ts"]) for e in shown)
    lo = t0 + (lo_s or 0.0) * 1e6
    hi = float("inf") if hi_s is None else t0 + hi_s * 1e6
    if hi <= lo:
        raise UsageError(f"--window: the end ({hi_s} s) must come after the start ({lo_s} s)")
    out = [e for e in shown
           if float(e["ts"]) <= hi and float(e["ts"]) + float(e.get("dur", 0)) >= lo]
    if not out:
        raise UsageError(f"nothing in the window {lo_s or 0:g}..{hi_s} s of this trace")
    return out, lo


def plot(trace: dict, out: str, lo_s: float | None = None, hi_s: float | None = None,
         title: str | None = None) -> dict:
    """Draw `trace` (a loaded trace-event dict) into the PNG `out`; what was drawn."""
    try:
        import matplotlib  # noqa: PLC0415 (optional: the plot extra)
    except ImportError:
        raise UsageError("ltp trace plot needs matplotlib: bash scripts/setup.sh installs "
                         "it") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (as above)
    from matplotlib.patches import Patch  # noqa: PLC0415 (as above)

    events = trace["traceEvents"]
    shown, t0 = window(events, lo_s, hi_s)
    rows = tracks(events, shown)
    index = {k: i for i, (k, _) in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(14, 0.32 * len(rows) + 1.6))
    bars: dict[str, list] = {}
    ticks: dict[str, list] = {}
    for e in shown:
        y = index[(e.get("pid"), e.get("tid"))]
        x = (float(e["ts"]) - t0) / 1e3
        cat = e.get("cat", "")
        if e["ph"] == "X":
            bars.setdefault(cat, []).append((y, x, max(float(e.get("dur", 0)) / 1e3, 0.05)))
        else:
            ticks.setdefault(cat, []).append((y, x))
    for cat, items in bars.items():
        for y, x, w in items:
            ax.broken_barh([(x, w)], (y - 0.38, 0.76), facecolors=COLOURS.get(cat, OTHER),
                           edgecolors="none")
    for items in ticks.values():
        ax.scatter([x for _, x in items], [y for y, _ in items], marker="|", s=90,
                   color="black", linewidths=0.8)
    ax.set_yticks(range(len(rows)), [label for _, label in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, None if hi_s is None else (hi_s - (lo_s or 0.0)) * 1e3)
    ax.set_xlabel("ms from the first event shown")
    ax.grid(axis="x", alpha=0.3)
    cats = sorted(bars)
    ax.legend(handles=[Patch(color=COLOURS.get(c, OTHER), label=c or "(none)") for c in cats],
              loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8,
              ncols=max(1, len(cats)))
    other = trace.get("otherData", {})
    ax.set_title(title or f"{other.get('job', 'trace')}: {len(shown)} events, "
                 f"{len(rows)} tracks", fontsize=10, loc="left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return {"out": out, "tracks": len(rows), "slices": sum(len(v) for v in bars.values()),
            "instants": sum(len(v) for v in ticks.values()),
            "span_ms": round(max((float(e["ts"]) + float(e.get("dur", 0)) - t0) / 1e3
                                 for e in shown), 3)}
