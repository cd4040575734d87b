"""The time budget (`train.max_minutes`): the LR schedule is planned to end when the time does.

A run stopped by the clock halfway through its cosine ends at a high LR, with the weights of a run
that never annealed. So the rate is measured (the median update time since the previous look; the
first update pays for compilation and is left out) at looks spaced 4x apart (after 10, 40, 160, 640,
... updates), and each time the number of updates that fit in the time left becomes the schedule's
length, never more than the configured one. Later looks correct the earlier ones: the first updates
also recompile and meet new shapes, so a rate measured early runs slow (a SmolLM2 run on an H200
planned at update 161 ended 1.4 of its 8.4 minutes early); each look moves the end by less.
A look also comes halfway through the planned updates left, while that half holds at least 10: a
rate that slowed for a while and recovered after the last 4x look would otherwise end the run early
(a demo planned at update 641 on a slowed rate trained 7.4 of its 9 minutes).
The plan is saved with the train state, so a resumed run keeps its schedule.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

FIRST_LOOK, LOOK_SPACING = 10, 4  # looks after 10, 40, 160, ... updates after the first (or halfway sooner)


def next_look(measured: int, updates_left: int) -> int:
    """The measured-update count of the look after one at `measured`: 4x later, or halfway through
    the `updates_left` the schedule plans when that comes sooner and the half holds FIRST_LOOK updates."""
    half = updates_left // 2
    return measured + half if FIRST_LOOK <= half < measured * (LOOK_SPACING - 1) else measured * LOOK_SPACING


@dataclass
class Plan:
    total_steps: int
    first_update_s: float
    median_update_s: float
    planned_from: int  # the update after which the plan was made


@dataclass
class TimeBudget:
    max_seconds: float | None
    margin: float = 0.97  # updates planned into this share of the time left (saves, evals, jitter)
    plan: Plan | None = None
    configured_steps: int | None = None
    _times: list[float] = field(default_factory=list)
    _last_look: int = 0  # measured updates at the previous look (0: none yet)
    _next_look: int = FIRST_LOOK

    def observe(self, step: int, update_s: float, elapsed_s: float, total_steps: int) -> Plan | None:
        """After each update: a new plan when a look finds another length than total_steps."""
        if self.max_seconds is None:
            return None
        if self.configured_steps is None:
            self.configured_steps = total_steps
        self._times.append(update_s)
        looked = len(self._times) - 1
        if looked != self._next_look:
            return None
        median = statistics.median(self._times[self._last_look + 1:])
        fit = step + int((self.max_seconds - elapsed_s) * self.margin / max(median, 1e-9))
        length = max(step + 1, min(fit, self.configured_steps))
        self._last_look, self._next_look = looked, next_look(looked, length - step)
        if length == total_steps:
            return None
        self.plan = Plan(length, self._times[0], median, step)
        return self.plan

    def state_dict(self) -> dict:
        plan = None if self.plan is None else vars(self.plan).copy()
        return {"plan": plan, "configured_steps": self.configured_steps}

    def load_state_dict(self, state: dict) -> None:
        """A resumed run keeps the saved plan and looks no more (its first updates compile again)."""
        self.plan = Plan(**state["plan"]) if state.get("plan") else None
        self.configured_steps = state.get("configured_steps")
        self.max_seconds = None if self.plan is not None else self.max_seconds
