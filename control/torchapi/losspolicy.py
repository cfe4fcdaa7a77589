# SPDX-License-Identifier: Apache-2.0
"""The loss policy: what a step does with the loss it meets, chosen per step
by the server from what its link measures (`loss_policy`, settings table).

Two tolerances trade a little of what SGD sees for time on a lossy path:

- a *loss budget* (transport/early_close.py) lets Early Close close an uplink
  round once what is missing is within the budget, Bubble Filling filling
  the holes, instead of waiting for re-sends;
- a *tolerant answer* (transport/defer.py) goes out once, and the chunks some
  worker lacks are applied a step late by every replica instead of re-sent.

`repair` uses neither (the paper's rule: rounds close at its 0.95 floor at
the least, every answer whole; a `loss_budget` given still holds), `defer`
answers tolerantly from the first step, and `auto` (the default) budgets the
uplink by the loss it measures, answers whole:

- the budget is about the loss the uplink's rounds meet, so a round closes
  when its first pass is in rather than after its re-sends: budget^2 =
  BUDGET_GAIN x loss, from BUDGET_ON on (off below BUDGET_OFF: hysteresis),
  at most BUDGET_MAX; an explicit `loss_budget` fixes it instead;
- the loss is measured once a step on its rounds opened with no budget, as
  the fraction of the chunks in that came only as a re-send (a straggler's
  or a dead worker's missing chunks are not the path's loss; a round the
  paper's rule closed before a re-send came counts that chunk as neither,
  so at light loss the figure is a little under the path's), since a round a budget
  closes early leaves out chunks that were never lost: counted as lost they
  would raise the budget that cut them (Early Close's own loss_hat does,
  which is why a fixed budget of 0.7 closed rounds at 10 % loss with 0.68
  delivered). So under a budget every PROBE-th step runs without one;
- no budget of its own where the step's Early Close fields fix
  `threshold_min` (LTP_EARLY_CLOSE, the optimizer's early_close; why
  `held`): the user's floor holds, e.g. 1.0 for rounds that close only
  complete (an explicit `loss_budget` still rules), and so does float32
  (no wire of its own either: such a user asked for exact answers);
- no budget in the first `warmup` steps (loss_warmup, 0 by default: from
  the second step, the first having measured the loss), then a ramp over as
  many again. A warm-up of 40 steps was the default while auto still chose
  tolerant answers, which cost accuracy early in training; a budget alone
  did not (docs/benchmarks.md, "A budget from the second step").

The wire (`wire`): where the job's compress is auto and the gradients are
float32, auto also chooses what they travel as. Past HALF_ON of measured
uplink loss (off below HALF_OFF: hysteresis) a step's gradients and its
answer go as bfloat16, each side carrying its rounding into the next step
(error feedback: Op.carry), and back to float32 once the path is clean
again. Under heavy loss the re-sends are what a step waits for (at 10 %
loss on every port, 44 % of an answer is sent twice), and half the bytes
halve them: with it the built-in job ran 1.33x its lossless float32 rate
at 10 % loss, at the same final accuracy (docs/benchmarks.md, "The loss
policy chooses the wire"). Only a bsp step whose gradients are all float32
takes it, where the server's error_feedback is on, from the first step's
measure (no warm-up: its rounding is carried) unless `held` (below) and no
loss_budget was given. A lossless or lightly lossy path keeps float32, so its
answers stay exact; compress none keeps float32 at any loss. The workers
take the choice from a step's report and apply it from their next step, all
alike (gradsync.py, ddp.py); a probe step keeps the wire.

Why answers stay whole under auto (docs/benchmarks.md, "The loss policy"):
on this project's rig, turning tolerant answers on after a warm-up set
training back in every run (final train loss 0.04-0.18 against 0.02 at 10 %
loss; 1.7-3.3 points of accuracy at 20-30 %), and bought no time the budget
had not; from the first step they cost 14-16 points at a quarter of a run.

Each step's choice and why go into its report (ops.StepReport.policy), the
server's summary and the trace.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..transport.defer import MAX_DEFERRED

POLICIES = ("auto", "repair", "defer")
BUDGET_ON, BUDGET_OFF = 0.04, 0.02     # uplink loss per port, chunks lost at least once
HALF_ON, HALF_OFF = 0.04, 0.02         # ... for the bfloat16 wire (auto, compress auto)
LOSSY_WIRE = "bf16"
BUDGET_GAIN, BUDGET_MAX = 2.5, 0.7
PROBE = 10                             # under a budget, every PROBE-th step: none, to measure
EWMA = 0.3
# why a step chose as it did (a code in the step report, a word in summaries)
WHY = ("fixed", "warmup", "lossless", "lossy", "ramp", "probe", "held")


@dataclass(frozen=True)
class Choice:
    """One step's: `cap`, the most of its answer's data chunks the answer may
    defer (0: whole); `budget`, Early Close's for the rounds opened from now
    on; `why`, one of WHY; `wire`, what float32 gradients travel as from the
    next step on (ops.WIRES: none or LOSSY_WIRE)."""

    cap: float = 0.0
    budget: float = 0.0
    why: str = "fixed"
    wire: str = "none"

    @property
    def mode(self) -> str:
        return "defer" if self.cap > 0 else "repair"

    def to_dict(self) -> dict:
        return {"mode": self.mode, "cap": round(self.cap, 4), "budget": round(self.budget, 4),
                "why": self.why, "wire": self.wire}


class LossPolicy:
    """The server's policy (see the module): `saw_uplink` with what a step's
    rounds opened with no budget lost, then `choose`, once a step. `budget`
    > 0 fixes the budget; `warmup`: steps before auto budgets, then the
    steps of its ramp; `half`: auto may choose the bfloat16 wire (the job's
    compress is auto, with error feedback)."""

    def __init__(self, policy: str = "auto", budget: float = 0.0, warmup: int = 0,
                 half: bool = False):
        if policy not in POLICIES:
            raise ValueError(f"loss_policy: one of {', '.join(POLICIES)}, got {policy!r}")
        self.policy, self.fixed_budget, self.warmup = policy, budget, warmup
        self.steps = 0
        self.up: float | None = None       # the uplink's loss per port, an EWMA
        self.budgeted = False              # the hysteresis' state
        self.half = half and policy == "auto"
        self.halved = False                # ... of the wire
        self.choice = self._fixed() if policy != "auto" or budget else Choice(why="warmup")
        self.mind = self.choice            # the latest choice that was not a probe
        self.counts: dict[str, int] = {}
        self.switches: list[dict] = []     # step, from, to: where auto changed its mind

    def _fixed(self) -> Choice:
        return Choice(cap=MAX_DEFERRED if self.policy == "defer" else 0.0,
                      budget=self.fixed_budget, why="fixed")

    def saw_uplink(self, lost: float) -> None:
        """Of the chunks a step's uplink rounds opened with no budget took in,
        `lost` came only as a re-send (once a step: a step's rounds weigh by
        their chunks, not one each)."""
        lost = min(max(lost, 0.0), 1.0)
        self.up = lost if self.up is None else (1 - EWMA) * self.up + EWMA * lost

    def held(self, held: bool) -> bool:
        """Whether auto is held off: the step's Early Close fields fix its
        rounds' floor (held), and no loss_budget was given, which still rules."""
        return held and self.policy == "auto" and not self.fixed_budget

    def choose(self, held: bool = False, half: bool = True) -> Choice:
        """This step's choice (once a step, after its rounds are gathered).
        held: the step's Early Close fields fix its rounds' floor, so auto
        sets no budget of its own (why `held`); half False: the step's
        workers take no wire from it (wbsp: a mean of k gradients), float32."""
        self.steps += 1
        if self.held(held):        # the user's floor: no tolerance of auto's own
            c = self.choice = Choice(why="held")
        else:
            c = self.choice = self._fixed() if self.policy != "auto" else self._auto()
            if self.half and half:
                c = self.choice = replace(c, wire=self._wire())
        self.counts[c.mode] = self.counts.get(c.mode, 0) + 1
        for name, on in (("budget", c.budget > 0), (c.wire, c.wire != "none")):
            if on:
                self.counts[name] = self.counts.get(name, 0) + 1
        if c.why != "probe":        # a probe measures: it is no change of mind
            old, self.mind = self.mind, c
            if (old.mode, old.budget > 0, old.wire) != (c.mode, c.budget > 0, c.wire):
                self.switches.append({"step": self.steps, "from": old.to_dict(),
                                      "to": c.to_dict()})
                del self.switches[:-16]
        return c

    def _wire(self) -> str:
        """What float32 gradients travel as from the next step (the module's
        "The wire"), with its own hysteresis."""
        up = self.up or 0.0
        self.halved = up >= (HALF_OFF if self.halved else HALF_ON)
        return LOSSY_WIRE if self.halved else "none"

    def _auto(self) -> Choice:
        up = self.up or 0.0
        self.budgeted = up >= (BUDGET_OFF if self.budgeted else BUDGET_ON)
        if self.fixed_budget:
            return Choice(budget=self.fixed_budget, why="fixed")
        if not self.budgeted:
            return Choice(why="lossless")
        grow = min(1.0, max(0.0, (self.steps - self.warmup) / max(1, self.warmup)))
        if grow == 0:
            return Choice(why="warmup")
        if self.steps % PROBE == 0:
            return Choice(why="probe")
        return Choice(budget=grow * min(BUDGET_MAX, math.sqrt(BUDGET_GAIN * up)),
                      why="ramp" if grow < 1 else "lossy")

    def summary(self) -> dict:
        return {"policy": self.policy, "steps": dict(self.counts),
                "last": self.choice.to_dict(),
                "uplink_loss": None if self.up is None else round(self.up, 4),
                "switches": list(self.switches)}
