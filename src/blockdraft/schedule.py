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


def lr_curve(
    k: np.ndarray, peak: float, warmup: int, total: int, schedule: str, min_ratio: float, decay_from_zero: bool = False
) -> np.ndarray:
    """The LR at updates k. `schedule` is cosine, linear or (any other name) constant;
    `decay_from_zero` measures decay progress as k/total (a common form elsewhere, for the doctor)."""
    k = np.asarray(k, dtype=float)
    if decay_from_zero:
        progress = np.clip(k / max(1, total), 0.0, 1.0)
    else:
        progress = np.clip((k - warmup) / max(1, total - warmup), 0.0, 1.0)
    floor = peak * min_ratio
    if schedule == "cosine":
        decayed = floor + (peak - floor) * 0.5 * (1.0 + np.cos(np.pi * progress))
    elif schedule == "linear":
        decayed = floor + (peak - floor) * (1.0 - progress)
    else:
        decayed = np.full(k.shape, float(peak))
    if warmup <= 0:
        return decayed
    return np.where(k <= warmup, peak * np.clip(k, 0, None) / warmup, decayed)


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
        progress = np.clip((k - warmup) / max(1, total - warmup), 0.0, 1.0)
        out = final + (std - final) * 0.5 * (1.0 + np.cos(np.pi * progress))
    if warmup > 0:
        out = np.where(k <= warmup, std * np.clip(k, 0, None) / warmup, out)
    return out


def lr_at(k: int, cfg: OptimConfig, total: int, warmup: int) -> float:
    """The trainer's LR for update k."""
    return float(lr_curve(np.array([k]), cfg.lr, warmup, total, cfg.schedule, cfg.min_lr_ratio)[0])


def noise_std_at(k: int, cfg: NoiseConfig, total: int) -> float:
    """The trainer's std of the Gaussian noise added to the fused target features at update k."""
    return float(noise_curve(np.array([k]), cfg.std, cfg.final_std, cfg.warmup_steps, cfg.schedule, total)[0])
