# SPDX-License-Identifier: Apache-2.0
"""Worker 0's progress (`lt.report_progress`): a JSON event for `ltp launch`,
whose progress bar draws it, or a plain line at a modest rate for a reader.

Under `ltp launch` (LTP_PROGRESS=json in the rank's environment) every call
is one JSON line {"event": "progress", "step", "steps", ...}; the launcher
draws a bar on a terminal and prints throttled plain lines otherwise. Run
any other way (torchrun, a log file), a call prints "step 10/100  loss 0.31"
when it is the first, the last, or PERIOD_S after the last line printed.
"""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

from . import settings_table

ENV = settings_table.TABLE["progress"].env   # LTP_PROGRESS=json: the launcher reads the events
PERIOD_S = 2.0             # at most one plain line per this many seconds (first and last always)


def metrics_text(metrics: dict) -> str:
    """"loss 0.31  epoch 2": each number given, floats to 4 digits."""
    return "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in metrics.items())


def describe(step: int, steps: int | None, metrics: dict) -> str:
    """"step 10/100  loss 0.31": the step and each number given."""
    head = f"step {step}/{steps}" if steps else f"step {step}"
    return "  ".join(x for x in (head, metrics_text(metrics)) if x)


class Throttle:
    """Is a plain line due? The first, the last step, and PERIOD_S apart."""

    def __init__(self, period_s: float = PERIOD_S, clock: Callable[[], float] = time.monotonic):
        self.period_s, self.clock, self.next_at = period_s, clock, None

    def due(self, step: int, steps: int | None) -> bool:
        now = self.clock()
        last = steps is not None and step >= steps
        if self.next_at is not None and now < self.next_at and not last:
            return False
        self.next_at = now + self.period_s
        return True


_throttle = Throttle()


def report(step: int, steps: int | None, metrics: dict) -> None:
    """One progress report of worker 0 (the caller checks the rank)."""
    if settings_table.env("progress") == "json":
        sys.stdout.write(json.dumps({"event": "progress", "step": step, "steps": steps,
                                     **metrics}) + "\n")
    elif _throttle.due(step, steps):
        sys.stdout.write(describe(step, steps, metrics) + "\n")
    else:
        return
    sys.stdout.flush()
