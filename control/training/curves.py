# SPDX-License-Identifier: Apache-2.0
"""Training curves of `ltp train`: TensorBoard scalars while a run goes, a PNG at the end.

`ltp train` hands every event its lead worker prints (start, iter, eval;
demo.py and local.py make them) to Curves.event, one run after another
(begin(label) starts a run: "ltp", "tcp-cubic", "ltp-compress=uint8", ...).

  --tensorboard DIR   one SummaryWriter per run, in DIR/<label>, so TensorBoard
                      shows the runs of a --compare as separate lines:
                        train/loss, test/loss, test/accuracy   at each evaluation
                        round/seconds, round/delivered         at each iteration
                        round/early_closed                     1 when Early Close ended it
                      The x axis is the iteration; the wall time of each point
                      is the run's training clock (evaluation excluded), so
                      TensorBoard's "relative" view plots against training time.
  --plot FILE         accuracy and training loss against training time, one line
                      per run, written once every run has ended (matplotlib, Agg).

Both are checked before any run starts (check_outputs), so a bad path costs
nothing.
"""
from __future__ import annotations

import os
import re
import time

from ...errors import UsageError

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def check_outputs(tensorboard: str | None, plot: str | None) -> None:
    """UsageError, before anything runs, for an output that cannot be written."""
    if tensorboard is not None:
        if os.path.exists(tensorboard) and not os.path.isdir(tensorboard):
            raise UsageError(f"--tensorboard: {tensorboard} exists and is not a directory")
        parent = os.path.dirname(os.path.abspath(tensorboard))
        if not os.path.isdir(parent):
            raise UsageError(f"--tensorboard: {parent} does not exist")
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401, PLC0415 (optional: the train extra)
        except ImportError:
            raise UsageError("--tensorboard needs the tensorboard package: "
                             "bash scripts/setup.sh installs it into .venv") from None
    if plot is not None:
        if not plot.lower().endswith(PLOT_SUFFIXES):
            raise UsageError(f"--plot: {plot!r} should end in one of "
                             f"{', '.join(PLOT_SUFFIXES)}")
        parent = os.path.dirname(os.path.abspath(plot))
        if not os.path.isdir(parent):
            raise UsageError(f"--plot: {parent} does not exist")
        if not os.access(parent, os.W_OK):
            raise UsageError(f"--plot: {parent} is not writable")
        try:
            import matplotlib  # noqa: F401, PLC0415 (optional: the plot extra)
        except ImportError:
            raise UsageError("--plot needs matplotlib: bash scripts/setup.sh installs it "
                             "into .venv") from None


def run_label(text: str) -> str:
    """A file-name-safe label of one run from its display label:
    "tcp (cubic)" -> "tcp-cubic", "ltp compress=uint8" -> "ltp-compress=uint8"."""
    return re.sub(r"[^A-Za-z0-9_.=]+", "-", text).strip("-") or "run"


class Run:
    """One run's points: (iteration, wall_s, value) lists by name."""

    def __init__(self, label: str):
        self.label = label
        self.points: dict[str, list[tuple[int, float, float]]] = {}

    def add(self, name: str, t: int, wall_s: float, value: float) -> None:
        self.points.setdefault(name, []).append((t, wall_s, float(value)))


class Curves:
    """Collects the runs' events; writes TensorBoard as they come and a plot at the end."""

    def __init__(self, tensorboard: str | None = None, plot: str | None = None):
        self.tensorboard, self.plot_path = tensorboard, plot
        self.runs: list[Run] = []
        self.writer = None
        self.t0 = 0.0

    @property
    def active(self) -> bool:
        return self.tensorboard is not None or self.plot_path is not None

    def begin(self, label: str) -> None:
        self.close_writer()
        self.runs.append(Run(label))
        if self.tensorboard is not None:
            from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 (optional: the train extra)
            self.writer = SummaryWriter(log_dir=os.path.join(self.tensorboard, label))
            self.t0 = time.time()

    def event(self, ev: dict) -> None:
        if not self.runs:
            return
        kind, t, wall = ev.get("event"), ev.get("t"), ev.get("wall_s")
        if t is None or wall is None:
            return
        if kind == "eval":
            self.scalars(t, wall, {"test/accuracy": ev["accuracy"], "test/loss": ev["test_loss"],
                                   "train/loss": ev["train_loss"]})
        elif kind == "iter":
            vals = {"round/seconds": ev.get("round_s"), "round/delivered": ev.get("delivered")}
            if ev.get("reason") is not None:
                vals["round/early_closed"] = float(ev["reason"] in ("early", "deadline"))
            self.scalars(t, wall, {k: v for k, v in vals.items() if v is not None})

    def scalars(self, t: int, wall: float, values: dict) -> None:
        run = self.runs[-1]
        for name, v in values.items():
            run.add(name, t, wall, v)
            if self.writer is not None:
                self.writer.add_scalar(name, v, global_step=t, walltime=self.t0 + wall)

    def close_writer(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def close(self) -> str | None:
        """Flush TensorBoard; write the plot (its path, or None without --plot)."""
        self.close_writer()
        if self.plot_path is None or not self.runs:
            return None
        plot_runs(self.runs, self.plot_path)
        return self.plot_path


def plot_runs(runs: list[Run], path: str) -> None:
    """Test accuracy and training loss against training time, one line per run."""
    import matplotlib  # noqa: PLC0415 (optional: the plot extra)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (optional: the plot extra)
    fig, (acc, loss) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for run in runs:
        for ax, name in ((acc, "test/accuracy"), (loss, "train/loss")):
            pts = run.points.get(name, [])
            if pts:
                ax.plot([p[1] for p in pts], [p[2] for p in pts], marker="o", markersize=3,
                        label=run.label)
    acc.set(title="test accuracy", xlabel="training time (s)", ylabel="accuracy")
    loss.set(title="training loss", xlabel="training time (s)", ylabel="cross-entropy")
    for ax in (acc, loss):
        ax.grid(alpha=0.3)
        ax.legend()
    tmp = f"{path}.tmp{os.getpid()}{os.path.splitext(path)[1]}"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
