# SPDX-License-Identifier: Apache-2.0
"""What `ltp train` shows: a progress bar per run on stderr, the runs side by
side as text, and the labels and ratios its JSON names runs by."""
from __future__ import annotations

from ..control.settings_table import EXACT_COMPRESS, TABLE
from ..control.training.config import LTP_TRANSPORTS
from ..control.training.faults import fault_lines

NO_SENDER = TABLE["sender"].default   # a run without LTP: the sender is not its to name


def label(transport: str, cc: str | None, servers: int = 1, compress: str = "none",
           sender: str = NO_SENDER, loss_policy: str = "auto",
           loss_budget: float = 0.0) -> str:
    base = f"tcp ({cc})" if transport == "tcp" else transport
    base = f"{base} x{servers}" if servers > 1 else base
    base = base if sender == NO_SENDER else f"{base} {sender}-sender"
    base = base if loss_policy == "auto" or transport not in LTP_TRANSPORTS \
        else f"{base} {loss_policy}"
    base = f"{base} budget {loss_budget:g}" if loss_budget else base
    return base if compress in EXACT_COMPRESS else f"{base} {compress}"


def ratio(a: dict, b: dict) -> float | None:
    if a.get("iterations_per_s") and b.get("iterations_per_s"):
        return round(a["iterations_per_s"] / b["iterations_per_s"], 3)
    return None


class RunBars:
    """A rich progress bar per run on stderr: iterations, accuracy, rounds/s."""

    def __init__(self, quiet: bool = False):
        from rich.console import Console  # noqa: PLC0415 (ltp's start stays light)
        from rich.progress import (  # noqa: PLC0415 (as above)
            BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn)
        self.console = Console(stderr=True)
        self.bar = Progress(TextColumn("{task.description:<12}"), BarColumn(bar_width=24),
                            MofNCompleteColumn(), TextColumn("acc {task.fields[acc]}"),
                            TextColumn("{task.fields[rps]} rounds/s"), TimeElapsedColumn(),
                            console=self.console, disable=quiet)
        self.bar.start()
        self.task = None

    def note(self, text: str) -> None:
        self.console.print(text)

    def begin(self, label: str) -> None:
        self.task = self.bar.add_task(label, total=None, acc="-    ", rps="-   ")

    def event(self, ev: dict) -> None:
        kind = ev.get("event")
        if kind == "start":
            self.bar.update(self.task, total=ev["iterations"])
        elif kind == "iter":
            rps = ev["t"] / ev["wall_s"] if ev.get("wall_s") else 0.0
            self.bar.update(self.task, completed=ev["t"], rps=f"{rps:5.1f}")
        elif kind == "eval":
            self.bar.update(self.task, acc=f"{ev['accuracy']:.3f}")

    def end(self, res: dict) -> None:
        self.bar.update(self.task, completed=res["iterations"],
                        acc=f"{res['final_accuracy']:.3f}",
                        rps=f"{res['iterations_per_s']:5.1f}")

    def close(self) -> None:
        self.bar.stop()


def policy_cell(r: dict) -> str:
    """What the loss policy chose, in steps: `budget 45/60`, `defer 60/60`,
    `bf16 58/60` (the wire it chose for float32 gradients), or `repair`
    (every answer whole, no budget, float32)."""
    lp = r.get("loss_choices")
    if not lp:
        return "-"
    st = lp.get("steps") or {}
    n = st.get("repair", 0) + st.get("defer", 0)
    parts = [f"{k} {st[k]}/{n}" for k in ("defer", "budget", "bf16") if st.get(k)]
    return ", ".join(parts) or "repair"


def _straggler(r: dict) -> str:
    """The worker named straggler most often, in how many steps, by which
    witness mostly, and its steady lag (straggler_report.py)."""
    named = r.get("straggler_rounds") or {}
    w = max(named, key=named.get, default=None)
    if w is None:
        return "-"
    by = {k: v.get(w, 0) for k, v in (r.get("named_by") or {}).items()}
    rule = max(by, key=by.get) if any(by.values()) else ""
    lag = (r.get("steady_lag_ms") or {}).get(w) if rule == "steady" else None
    return " ".join(filter(None, (f"w{w} {named[w]}/{r['iterations']}", rule,
                                  f"{lag:.1f} ms" if lag is not None else "")))


def stall_line(st: dict) -> str:
    """A run's stalls that resolved (hangs.FlightWatch.stall_summary) in one line."""
    n = st["count"]
    return (f"{n} stall{'s' if n != 1 else ''} (waits past the flight recorder's threshold "
            f"that resolved), longest {st['longest_s']:.2f} s: {st['rank']} in op {st['op']} "
            f"{st['phase']}, waiting for {st['waiting_for']}")


def stall_lines(st: dict | None) -> list[str]:
    """stall_line's, as a summary's lines (none without stalls)."""
    return [stall_line(st)] if st else []


def cause_lines(cause: dict | None) -> list[str]:
    """The summary's last block: the first failure, as torchrun's Root Cause
    (none without one)."""
    if not cause:
        return []
    after = f" after {cause['after_s']:.2f} s" if cause["after_s"] is not None else ""
    return ["", f"root cause (first failure): {cause['label']} ({cause['torch_rank']}) exited "
            f"{cause['exit_code']}{after}",
            f"  {cause['error'] or '(no error line: see its output above)'}"]


def label_of(r: dict) -> str:
    """A run's label from its result (or its failure record)."""
    return label(r["transport"], r.get("cc"), r.get("servers", 1), r.get("compress", "none"),
                 r.get("sender", NO_SENDER), r.get("loss_policy", "auto"),
                 r.get("loss_budget", 0.0))


def failed_run(run: dict, error: str) -> dict:
    """What a run that raised leaves in the results: its settings and why."""
    return {**run, "cc": run["cc"] if run["transport"] == "tcp" else None, "error": error}


def text(results: list[dict], args, loss: float, rate: int, buffer: int) -> str:
    """The runs side by side; a run that failed is named below the table."""
    failed = [f"{label_of(r)}: failed: {r['error']}" for r in results if "error" in r]
    results = [r for r in results if "error" not in r]
    if not results:
        return "\n".join(failed)
    r0 = results[0]
    rc = r0.get("rig", {})
    head = (f"ltp train: {r0['workers']} workers, {r0['sync']}, {r0['epochs']:g} epochs "
            f"({r0['iterations']} iterations), seed {args.seed}\n"
            f"model: MLP, {r0['params']} parameters")
    if r0.get("straggler"):
        head += "; straggler " + ", ".join(f"w{k} x{v:g}" for k, v in r0["straggler"].items())
    head += (f"\nrig: {rc.get('rate_bps', rate) / 1e9:g} Gbit/s, "
             f"{rc.get('buffer_bytes', buffer) / 1000:g} KB queue, loss "
             f"{rc.get('loss', loss):g} on "
             f"{'every port' if rc.get('loss_on') == 'all' else 'the PS port'}")
    cols = [label_of(r) for r in results]

    def early(r):
        if r["transport"] not in LTP_TRANSPORTS:
            return "-"
        return f"{r['rounds_early_closed']}/{(r.get('ltp') or {}).get('rounds', r['iterations'])}"

    def ttt(r):
        t = r.get("time_to_target")
        return f"{t['wall_s']:.2f}" if t else ("never" if r.get("target_accuracy") else "-")

    rows = [("final accuracy", [f"{r['final_accuracy']:.4f}" for r in results]),
            ("train loss", [f"{r['initial_train_loss']:.3f}->{r['final_train_loss']:.3f}"
                            for r in results]),
            ("rounds/s", [f"{r['iterations_per_s']:.2f}" for r in results]),
            ("wall s", [f"{r['wall_s']:.2f}" for r in results]),
            ("delivered", [f"{r['delivered_fraction']:.5f}" for r in results]),
            ("early-closed", [early(r) for r in results]),
            ("straggler", [_straggler(r) for r in results]),
            ("loss policy", [policy_cell(r) for r in results]),
            ("replicas equal", ["yes" if r.get("replicas_identical") else "NO" for r in results])]
    if args.target_accuracy is not None:
        rows.insert(4, (f"s to acc {args.target_accuracy:g}", [ttt(r) for r in results]))
    w = max(*(len(c) for c in cols), *(len(v) for _, vals in rows for v in vals)) + 2
    lines = [head, "", " " * 18 + "".join(f"{c:>{w}}" for c in cols)]
    lines += [f"{name:<18}" + "".join(f"{v:>{w}}" for v in vals) for name, vals in rows]
    if args.sync == "wbsp":
        lines += ["", "local steps per worker (gradients computed):"]
        lines += [f"  {c:<16}" + " ".join(str(v) for v in r["local_steps"].values())
                  for c, r in zip(cols, results)]
    lines += breakdown_lines(cols, results)
    faults = [ln for c, r in zip(cols, results) for ln in fault_lines(c, r)]
    lines += [""] + faults if faults else []
    stalls = [f"{c}: {stall_line(r['stalls'])}" for c, r in zip(cols, results) if r.get("stalls")]
    lines += [""] + stalls if stalls else []
    ratios = [(c, ratio(r0, r)) for c, r in zip(cols[1:], results[1:])]
    if any(x for _, x in ratios):
        lines.append("")
    lines += [f"{cols[0]}: {x:.2f}x the rounds/s of {c}" for c, x in ratios if x]
    lines += [""] + failed if failed else []
    if args.plot or args.tensorboard:
        lines.append("")
    if args.plot:
        lines.append(f"plot: {args.plot}")
    if args.tensorboard:
        lines.append(f"tensorboard: {args.tensorboard} (tensorboard --logdir {args.tensorboard})")
    return "\n".join(lines)


# the breakdown's rows: (label, part of the breakdown, phase); docs/training.md
BREAKDOWN_ROWS = (
    ("worker compute", "worker", "compute"), ("  staging", "worker", "staging"),
    ("  push (wait)", "worker", "push"), ("  pull (answer)", "worker", "pull"),
    ("  copy back", "worker", "copy_back"), ("  optimizer", "worker", "optimizer"),
    ("  other", "worker", "other"), ("  (comm: barrier)", "comm", "barrier"),
    ("  (comm: push)", "comm", "push"), ("server idle", "server", "idle"),
    ("  gather", "server", "gather"), ("  aggregate", "server", "aggregate"),
    ("  send", "server", "send"), ("  (of it: sign)", "server", "sign"),
    ("  other", "server", "other"))


def breakdown_lines(cols: list[str], results: list[dict]) -> list[str]:
    """Where a step's time went, ms per step (medians), a column per run;
    the floors beside them when measured (--floors)."""
    bds = [r.get("breakdown") or {} for r in results]
    if not any(bds):
        return []

    def ms(v):
        return f"{v * 1e3:.1f}" if v is not None else "-"

    def cell(b, part, phase):
        return ms(((b.get(part) or {}).get("median") or {}).get(phase)) if b else "-"
    rows = [("step (wall / it)", [ms(r["wall_s"] / r["iterations"]) if r.get("iterations")
                                  else "-" for r in results])]
    rows += [("step (median)", [cell(b, "worker", "wall") for b in bds])]
    rows += [(name, [cell(b, part, ph) for b in bds]) for name, part, ph in BREAKDOWN_ROWS]
    vs = [b.get("vs_floors") for b in bds]
    if any(vs):
        floors = [(v or {}).get("floors_s", {}) for v in vs]
        rows += [("floor: wire in", [ms(f.get("wire_s")) if f else "-" for f in floors]),
                 ("floor: aggregate", [ms(f.get("aggregate_s")) if f else "-" for f in floors]),
                 ("median / wire floor", [f"{v['wall_over_wire']:.2f}x" if v and
                                          v.get("wall_over_wire") else "-" for v in vs])]
    w = max(10, *(len(c) + 2 for c in cols))
    lines = ["", "where a step goes, ms (medians; worker: the median worker's):",
             " " * 20 + "".join(f"{c:>{w}}" for c in cols)]
    lines += [f"{name:<20}" + "".join(f"{v:>{w}}" for v in vals) for name, vals in rows]
    fl = next((r["floors"] for r in results if r.get("floors")), None)
    if fl:
        lines += [f"floors: memcpy {fl['memcpy_1']:.1f}/{fl['memcpy_all']:.1f} GB/s, add "
                  f"{fl['add_1']:.1f}/{fl['add_all']:.1f} GB/s (1/{fl['threads_all']} threads),",
                  f"        TCP loopback {fl['tcp_loopback_gbps']:.2f} GB/s (one stream), "
                  f"line {fl['line_bps'] / 1e9:g} Gbit/s"]
    return lines
