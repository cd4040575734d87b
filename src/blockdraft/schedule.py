"""The learning-rate and noise schedules, defined once: the trainer applies them and the doctor
compares a run's logged values with them, so changing a schedule here changes both (numpy only: the
doctor must not import torch).

Update k is 1-based (the first optimizer step is k = 1). With W warmup updates:
  k <= W:  lr = peak * k / W          (update 1 uses peak/W: never zero, never the peak)
  k >  W:  cosine (or linear) from peak (at k = W) to peak * min_lr_ratio (at k = total), or constant
Noise std warms up linearly from 0 over its own warmup, then stays at std or follows a cosine from
std to final_std. A skipped (guarded) step does not advance k, so neither schedule moves without an update.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from blockdraft.config import NoiseConfig, OptimConfig


def _progress(k: np.ndarray, warmup: int, total: int) -> np.ndarray:
    """Decay progress: 0 up to update `warmup`, 1 from update `total` on."""
    return np.clip((k - warmup) / max(1, total - warmup), 0.0, 1.0)


def _cosine(start: float, end: float, progress: np.ndarray) -> np.ndarray:
    return end + (start - end) * 0.5 * (1.0 + np.cos(np.pi * progress))


def _warmed_up(k: np.ndarray, value: float, warmup: int, after: np.ndarray) -> np.ndarray:
    """value * k / warmup for k <= warmup (update 1 is never zero), `after` beyond."""
    return np.where(k <= warmup, value * np.clip(k, 0, None) / warmup, after) if warmup > 0 else after


def lr_curve(
    k: np.ndarray, peak: float, warmup: int, total: int, schedule: str, min_ratio: float, decay_from_zero: bool = False
) -> np.ndarray:
    """The LR at updates k. `schedule` is cosine, linear or (any other name) constant;
    `decay_from_zero` measures decay progress as k/total (a common form elsewhere, for the doctor)."""
    k = np.asarray(k, dtype=float)
    progress = _progress(k, 0 if decay_from_zero else warmup, total)
    floor = peak * min_ratio
    if schedule == "cosine":
        decayed = _cosine(peak, floor, progress)
    elif schedule == "linear":
        decayed = floor + (peak - floor) * (1.0 - progress)
    else:
        decayed = np.full(k.shape, float(peak))
    return _warmed_up(k, peak, warmup, decayed)


def noise_curve(
    k: np.ndarray, std: float, final: float, warmup: int, schedule: str, total: int | None
) -> np.ndarray | None:
    """Noise std at updates k; None for a cosine whose end (`total`) is unknown."""
    k = np.asarray(k, dtype=float)
    if std == 0.0 and final == 0.0:
        return np.zeros(k.shape)
    out = np.full(k.shape, float(std))
    if schedule == "cosine":
        if total is None:
            return None
        out = _cosine(std, final, _progress(k, warmup, total))
    return _warmed_up(k, std, warmup, out)


def lr_at(k: int, cfg: OptimConfig, total: int, warmup: int) -> float:
    """The trainer's LR for update k."""
    return float(lr_curve(np.array([k]), cfg.lr, warmup, total, cfg.schedule, cfg.min_lr_ratio)[0])


def noise_std_at(k: int, cfg: NoiseConfig, total: int) -> float:
    """The trainer's std of the Gaussian noise added to the fused target features at update k."""
    return float(noise_curve(np.array([k]), cfg.std, cfg.final_std, cfg.warmup_steps, cfg.schedule, total)[0])
