"""Quantities several detectors need, computed once per analysis (lazily, so absent fields cost nothing)."""

from __future__ import annotations

import math
from functools import cached_property
from typing import Any

import numpy as np

from blockdraft.doctor import stats
from blockdraft.doctor.records import RunLog, StepTable

TREND_BLOCK = 25


class Context:
    """A RunLog plus the shared fits: per-bucket loss/acc levels, step timing, logging stride."""

    def __init__(self, run: RunLog) -> None:
        self.run = run
        self.t: StepTable = run.steps
        self.n = len(run.steps)
        self.shared: dict[str, Any] = {}

    @cached_property
    def step(self) -> np.ndarray:
        return self.t.steps

    @cached_property
    def groups(self) -> np.ndarray:
        """Bucket label per row for per-bucket baselines; rare buckets pool into one label."""
        bucket = self.t.bucket.copy()
        labels, counts = np.unique(bucket, return_counts=True)
        rare = labels[counts < 30]
        if len(rare):
            bucket[np.isin(bucket, rare)] = -1
        return bucket

    def _log_fit(self, name: str, floor: float) -> stats.BucketFit | None:
        if not self.t.has(name) or self.n < 20:
            return None
        values = self.t.get(name)
        ok = np.isfinite(values) & (values > 0) & ~self.small_window
        y = np.where(ok, np.log(np.maximum(values, floor)), np.nan)
        return stats.bucket_fit(y, self.groups, self.trend_block, self.t.segment)

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

    @cached_property
    def dstep(self) -> np.ndarray:
        """Steps between a row and the previous row of the same segment (NaN at segment starts)."""
        d = np.full(self.n, np.nan)
        if self.n > 1:
            d[1:] = np.diff(self.step)
            d[1:][self.t.segment[1:] != self.t.segment[:-1]] = np.nan
        return d

    @cached_property
    def dtime(self) -> np.ndarray:
        d = np.full(self.n, np.nan)
        if self.n > 1 and self.t.has("time"):
            d[1:] = np.diff(self.t.get("time"))
            d[1:][self.t.segment[1:] != self.t.segment[:-1]] = np.nan
        return d

    @cached_property
    def stride(self) -> float:
        """Typical steps per record: 1 for our logs, the window for a monitor that averages."""
        d = self.dstep[np.isfinite(self.dstep) & (self.dstep > 0)]
        return float(np.median(d)) if len(d) else 1.0

    @cached_property
    def regular_stride(self) -> bool:
        d = self.dstep[np.isfinite(self.dstep) & (self.dstep > 0)]
        return bool(len(d)) and float(np.mean(d == self.stride)) >= 0.9

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
        if self.t.has("step_time"):
            st = self.t.get("step_time")
            st = st[np.isfinite(st) & (st > 0)]
            if len(st):
                return float(np.median(st))
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

    def rows_between(self, first_step: float, last_step: float) -> np.ndarray:
        return np.flatnonzero((self.step >= first_step) & (self.step <= last_step))

    def step_at(self, row: int) -> int:
        """The step of a row, clamped to the log (0 for a log without step records)."""
        if not self.n:
            return 0
        return int(self.step[min(max(row, 0), self.n - 1)])
