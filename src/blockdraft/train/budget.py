"""The time budget (`train.max_minutes`): the LR schedule is planned to end when the time does.

A run stopped by the clock halfway through its cosine ends at a high LR, with the weights of a run
that never annealed. So once the rate is measured (the median of `measure` updates after the first,
which pays for compilation), the number of updates that fit in the time left becomes the schedule's
length when it is shorter than the planned one. The plan is made once and saved with the train
state, so a resumed run keeps the same schedule.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class Plan:
    total_steps: int
    first_update_s: float
    median_update_s: float
    planned_from: int  # the update after which the plan was made


@dataclass
class TimeBudget:
    max_seconds: float | None
    measure: int = 10
    margin: float = 0.97  # updates planned into this share of the time left (saves, evals, jitter)
    plan: Plan | None = None
    _times: list[float] = field(default_factory=list)

    def observe(self, step: int, update_s: float, elapsed_s: float, total_steps: int) -> Plan | None:
        """After each update: returns the new plan once, when the time left cannot hold total_steps."""
        if self.max_seconds is None or self.plan is not None:
            return None
        self._times.append(update_s)
        if len(self._times) < self.measure + 1:
            return None
        median = statistics.median(self._times[1:])
        fit = step + int((self.max_seconds - elapsed_s) * self.margin / max(median, 1e-9))
        self.plan = Plan(max(step + 1, min(fit, total_steps)), self._times[0], median, step)
        return self.plan if self.plan.total_steps < total_steps else None

    def state_dict(self) -> dict:
        return {"plan": None if self.plan is None else vars(self.plan).copy()}

    def load_state_dict(self, state: dict) -> None:
        self.plan = Plan(**state["plan"]) if state.get("plan") else None
