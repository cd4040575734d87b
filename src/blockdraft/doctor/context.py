"""Quantities several detectors need, computed once per analysis (lazily, so absent fields cost nothing)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cached_property, wraps
from typing import Any, TypeVar

import numpy as np

from blockdraft.doctor import stats
from blockdraft.doctor.run import LoggedRun, StepTable

TREND_BLOCK = 25
T = TypeVar("T")


class Context:
    """A LoggedRun plus the shared fits: per-bucket loss/acc levels, step timing, logging stride."""

    def __init__(self, run: LoggedRun) -> None:
        self.run = run
        self.t: StepTable = run.steps
        self.n = len(run.steps)
        self.step = run.steps.steps
        self.shared: dict[Callable, Any] = {}

    @cached_property
    def loss_levels(self) -> stats.Levels | None:
        """Distinct loss levels when the log names no buckets: homogeneous batches show as modes."""
        if (self.t.bucket >= 0).any() or not self.t.has("loss") or self.n < 200:
            return None
        resid = self.pooled_loss_resid
        single = self.dstep == 1
        if self.windowed and np.isfinite(resid[single]).sum() >= 200:
            # a 2-step window averages two batches: only 1-step records show the levels unblurred
            return stats.mixture_levels(np.where(single, resid, np.nan))
        return stats.mixture_levels(resid)

    @cached_property
    def pooled_loss_resid(self) -> np.ndarray:
        """Log loss minus its running level, one group for all rows, after the first fall."""
        fit = self._log_fit("loss", 1e-6, np.full(self.n, -1))
        if fit is None:
            return np.full(self.n, np.nan)
        return np.where(self.first_fall_done, fit.resid, np.nan)

    @cached_property
    def first_fall_done(self) -> np.ndarray:
        """Rows after the first 5% of the log, where the steep initial fall no longer dominates."""
        return np.arange(self.n) >= max(self.trend_block, self.n // 20)

    @cached_property
    def groups(self) -> np.ndarray:
        """Bucket label per row for per-bucket baselines (loss levels stand in when no buckets are
        logged); rare labels pool into one."""
        levels = self.loss_levels
        bucket = levels.labels.copy() if levels is not None else self.t.bucket.copy()
        labels, counts = np.unique(bucket, return_counts=True)
        bucket[np.isin(bucket, labels[counts < 30])] = -1
        return bucket

    def _log_fit(self, name: str, floor: float, groups: np.ndarray | None = None) -> stats.BucketFit | None:
        if not self.t.has(name) or self.n < 20:
            return None
        values = self.t.get(name)
        ok = np.isfinite(values) & (values > 0) & ~self.unreliable
        y = np.where(ok, np.log(np.maximum(values, floor)), np.nan)
        return stats.bucket_fit(y, self.groups if groups is None else groups, self.trend_block, self.t.segment)

    @cached_property
    def trend_block(self) -> int:
        """Rows per block of the running level: 25, fewer for short logs so the first fall is followed."""
        return int(min(TREND_BLOCK, max(5, self.n // 40)))

    @cached_property
    def loss_fit(self) -> stats.BucketFit | None:
        return self._log_fit("loss", 1e-6)

    @cached_property
    def acc_fit(self) -> stats.BucketFit | None:
        return self._log_fit("acc", 1e-4)

    def _since_previous(self, values: np.ndarray) -> np.ndarray:
        """Change since the previous row of the same segment (NaN at segment starts)."""
        d = np.diff(values, prepend=np.nan)
        d[np.diff(self.t.segment, prepend=-1) != 0] = np.nan
        return d

    @cached_property
    def dstep(self) -> np.ndarray:
        """Steps between a row and the previous row of the same segment (NaN at segment starts)."""
        return self._since_previous(self.step)

    @cached_property
    def prev_step(self) -> np.ndarray:
        """The step of the row before (-inf for the first row)."""
        return np.concatenate([[-np.inf], self.step[:-1]])

    @cached_property
    def dtime(self) -> np.ndarray:
        return self._since_previous(self.t.get("time")) if self.t.has("time") else np.full(self.n, np.nan)

    @cached_property
    def spacings(self) -> np.ndarray:
        """The positive step spacings between records of one segment."""
        return self.dstep[np.isfinite(self.dstep) & (self.dstep > 0)]

    @cached_property
    def stride(self) -> float:
        """Typical steps per record: 1 for our logs, the window for a monitor that averages."""
        return float(np.median(self.spacings)) if len(self.spacings) else 1.0

    @cached_property
    def regular_stride(self) -> bool:
        return bool(len(self.spacings)) and float(np.mean(self.spacings == self.stride)) >= 0.9

    @cached_property
    def update(self) -> np.ndarray:
        """The 1-based update number of each row, also where the log counts the first update as step 0
        (monitor threads often do)."""
        return self.step + 1.0 if self.n and self.step[0] == 0 else self.step

    @cached_property
    def starts_at_first_update(self) -> bool:
        return bool(self.n) and self.update[0] == 1

    @cached_property
    def windowed(self) -> bool:
        """Records are averages over windows of steps (a window field, or records a few steps apart)."""
        window = self.t.get("window")
        if np.isfinite(window).any():
            return float(np.nanmedian(window)) > 1
        return bool(len(self.spacings)) and float(np.mean(self.spacings > 1)) >= 0.2

    @cached_property
    def gap_rows(self) -> np.ndarray:
        """Rows that end a logging gap: far more steps since the previous record than the log's usual."""
        d = self.dstep
        ok = np.isfinite(d) & (d > 0)
        if not ok.any():
            return np.zeros(self.n, dtype=bool)
        if self.regular_stride:
            return ok & (d - self.stride >= max(3.0, 2.0 * self.stride))
        return ok & (d >= max(8.0, 4.0 * float(np.percentile(self.spacings, 90))))

    @cached_property
    def after_gap(self) -> np.ndarray:
        """In a windowed log, the two records after a gap: short windows a single batch can dominate."""
        out = np.zeros(self.n, dtype=bool)
        if not self.windowed:
            return out
        for r in np.flatnonzero(self.gap_rows):
            out[r + 1 : r + 3] = True
        return out & np.concatenate([[False], self.t.segment[1:] == self.t.segment[:-1]])

    @cached_property
    def unreliable(self) -> np.ndarray:
        """Rows whose value says more about the monitor's window than about the model."""
        return self.small_window | self.after_gap

    @cached_property
    def small_window(self) -> np.ndarray:
        """Rows whose metric window covers far fewer steps than usual (windowed logs only)."""
        window = self.t.get("window")
        if np.isfinite(window).any():
            typical = float(np.nanmedian(window))
            return np.isfinite(window) & (window <= max(2.0, typical / 3.0)) & (typical >= 3)
        if self.stride < 3:
            return np.zeros(self.n, dtype=bool)
        return np.isfinite(self.dstep) & (self.dstep <= max(2.0, self.stride / 3.0))

    @cached_property
    def seconds_per_step(self) -> float:
        """Typical wall seconds per update (from step_time, else from time stamps)."""
        typical = stats.typical_step_time(self.t.get("step_time"))
        if math.isfinite(typical):
            return typical
        ok = np.isfinite(self.dtime) & (self.dstep > 0)
        if ok.any():
            return float(np.median(self.dtime[ok] / self.dstep[ok]))
        return math.nan

    @cached_property
    def lr_peak(self) -> float:
        peak = self.run.setting("optim", "lr")
        if isinstance(peak, int | float) and peak > 0:
            return float(peak)
        lr = self.t.get("lr")
        lr = lr[np.isfinite(lr)]
        return float(lr.max()) if len(lr) else math.nan

    @cached_property
    def lr_schedule_end(self) -> float:
        """Where the logged LR decay would reach zero (NaN if unseen): each decaying row gives an end under
        a cosine and under a linear decay, and the shape whose ends agree best wins. A hint, not a measurement."""
        lr = self.t.get("lr")
        ok = np.isfinite(lr) & (lr > 0)
        if ok.sum() < 50:
            return math.nan
        rows = np.flatnonzero(ok)
        if self.starts_at_first_update:
            rows = rows[1:]
        v = lr[rows]
        peak = float(v.max())
        top = int(np.argmax(v >= 0.999 * peak))
        warm = float(self.update[rows[top]])
        tail = np.arange(len(v)) > top
        r = v / peak
        best = (math.inf, math.nan)
        for shape in ("cosine", "linear"):
            frac = np.arccos(np.clip(2 * r - 1, -1, 1)) / np.pi if shape == "cosine" else 1 - r
            use = tail & (frac >= 0.005) & (r >= 0.05)
            if use.sum() < 10:
                continue
            ends = np.log(warm + (self.update[rows[use]] - warm) / frac[use])
            spread = float(np.median(np.abs(ends - np.median(ends))))
            if spread < best[0]:
                best = (spread, float(np.exp(np.median(ends))))
        return best[1] if best[0] <= 0.05 else math.nan

    @property
    def whole_log(self) -> tuple[int, int]:
        """The first and last step: where a finding about the run as a whole (a setting, the batch order) points."""
        return self.step_at(0), self.step_at(self.n - 1)

    def marker_steps(self, kind: str) -> np.ndarray:
        """The sorted steps of this run's records of `kind` (checkpoints, evals, run starts)."""
        steps = [r.get("step") for r in self.run.of_kind(kind)]
        return np.array(sorted(float(s) for s in steps if isinstance(s, int | float)), dtype=np.float64)

    def step_at(self, row: int) -> int:
        """The step of a row, clamped to the log (0 for a log without step records)."""
        if not self.n:
            return 0
        return int(self.step[min(max(row, 0), self.n - 1)])


def shared(compute: Callable[[Context], T]) -> Callable[[Context], T]:
    """Compute `compute(ctx)` once per analysis: several detectors read the same events (spikes,
    level drops, gaps, the batch order) and each may be the first to ask."""

    @wraps(compute)
    def once(ctx: Context) -> T:
        if compute not in ctx.shared:
            ctx.shared[compute] = compute(ctx)
        return ctx.shared[compute]

    return once
