"""What the LR and noise std should have been at each step, from the run's resolved config: the
schedules the trainer follows (`blockdraft.schedule`), fed with the lengths read from the log."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from blockdraft.config import total_updates, warmup_updates
from blockdraft.doctor import stats
from blockdraft.doctor.run import LoggedRun
from blockdraft.schedule import lr_curve, noise_curve


def _finite(value: object) -> bool:
    """A logged number the doctor can compute with: JSON logs can hold true/false, NaN and Infinity."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _positive_int(value: object) -> int | None:
    return int(value) if _finite(value) and value > 0 else None


def total_steps(run: LoggedRun) -> int | None:
    """Updates in the whole run: run_start's, the config's max_steps, or the trainer's rule
    (`config.total_updates`) on epochs and steps per epoch (configured, else measured from the log)."""
    known = _positive_int(run.run_value("total_steps")) or _positive_int(run.setting("train", "max_steps"))
    if known:
        return known
    epochs = run.setting("train", "epochs")
    if not _finite(epochs) or epochs <= 0:
        return None
    per_epoch = _positive_int(run.setting("train", "steps_per_epoch"))
    if per_epoch is None and (rise := epochs_per_step(run)) > 0:
        per_epoch = _positive_int(round(1 / rise))  # a fitted slope: 1/rise is 1499.9..., not 1499
    return total_updates(None, float(epochs), per_epoch) if per_epoch else None


def epochs_per_step(run: LoggedRun) -> float:
    """The slope of the log's epoch position (a fractional epoch, or epoch plus epoch_progress) over the
    steps of the first run segment; NaN with fewer than 50 positions."""
    t = run.steps
    if t.has("epoch_pos"):
        pos = t.get("epoch_pos")
    elif t.has("epoch_progress"):
        pos = np.nan_to_num(t.get("epoch"), nan=0.0) + t.get("epoch_progress")
    else:
        return math.nan
    ok = np.isfinite(pos) & t.first_segment & np.isfinite(t.steps)
    return stats.slope(t.steps[ok], pos[ok]) if ok.sum() >= 50 else math.nan


def warmup_steps(run: LoggedRun) -> int | None:
    """Resolved warmup length: run_start's, else the trainer's rule (`config.warmup_updates`) on the
    config's warmup_steps or warmup_ratio."""
    for known in (run.run_value("warmup_steps"), run.setting("optim", "warmup_steps")):
        if _finite(known) and known >= 0:
            return int(known)
    ratio = run.setting("optim", "warmup_ratio")
    total = total_steps(run)
    if _finite(ratio) and total:
        return warmup_updates(None, float(ratio), total)
    return None


def _by_plan(run: LoggedRun, k: np.ndarray, curve: Any, total: int, warmup: int) -> np.ndarray:
    """curve(total, warmup) at updates k under each plan the trainer followed: run_start's lengths, then
    each time-budget re-plan (`schedule_planned`), in force from the update after the one it was logged at."""
    start = run.run_start or {}
    plans = [(0, start.get("total_steps"), start.get("warmup_steps"))] + [
        (w.get("step", 0), w.get("total_steps"), w.get("warmup_steps")) for w in run.schedule_plans]
    out = curve(total, warmup)  # the latest plan's lengths (total_steps, warmup_steps)
    for (after, plan_total, plan_warmup), (until, _, _) in itertools.pairwise(plans):
        if _positive_int(plan_total) and isinstance(plan_warmup, int):
            out = np.where((k > after) & (k <= until), curve(int(plan_total), plan_warmup), out)
    return out


def expected_lr(
    run: LoggedRun, k: np.ndarray, decay_from_zero: bool = False, shape: str | None = None
) -> np.ndarray | None:
    """The configured LR at updates `k`, or None when the config does not pin it down.

    `shape` overrides the configured schedule (cosine when the config names none)."""
    peak = run.setting("optim", "lr")
    total = total_steps(run)
    warmup = warmup_steps(run)
    schedule = shape or run.setting("optim", "schedule") or "cosine"
    min_ratio = run.setting("optim", "min_lr_ratio") or 0.0
    if not isinstance(peak, int | float) or peak <= 0 or total is None or warmup is None:
        return None
    return _by_plan(run, k, lambda t, w: lr_curve(k, float(peak), w, t, str(schedule), float(min_ratio),
                                                  decay_from_zero), total, warmup)


def expected_noise(run: LoggedRun, k: np.ndarray) -> np.ndarray | None:
    """Noise std at updates `k`: std*k/W during warmup, then constant or cosine from std to final_std."""
    noise = run.setting("noise")
    if not isinstance(noise, dict) or not isinstance(noise.get("std"), int | float):
        return None
    std = float(noise["std"])
    final = float(noise.get("final_std") or 0.0)
    warm = int(noise.get("warmup_steps") or 0)
    shape = str(noise.get("schedule") or "constant")
    total = total_steps(run)
    if total is None:
        return noise_curve(k, std, final, warm, shape, None)
    return _by_plan(run, k, lambda t, _w: noise_curve(k, std, final, warm, shape, t), total, 0)
