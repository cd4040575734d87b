"""Optimizer, learning-rate schedule and noise schedule: plain functions of the update number.

Update k is 1-based (the first optimizer step is k = 1). With W warmup updates:
  k <= W:  lr = peak * k / W          (update 1 uses peak/W: never zero, never the peak)
  k >  W:  cosine from peak (at k = W) to peak * min_lr_ratio (at k = total)
A skipped (guarded) step does not advance k, so the schedule never moves without an update.
"""

from __future__ import annotations

import math

import torch

from blockdraft.config import NoiseConfig, OptimConfig


def lr_at(k: int, cfg: OptimConfig, total: int, warmup: int) -> float:
    peak = cfg.lr
    if warmup > 0 and k <= warmup:
        return peak * k / warmup
    if cfg.schedule == "constant":
        return peak
    span = max(1, total - warmup)
    progress = min(1.0, max(0.0, (k - warmup) / span))
    floor = peak * cfg.min_lr_ratio
    if cfg.schedule == "linear":
        return floor + (peak - floor) * (1.0 - progress)
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def noise_std_at(k: int, cfg: NoiseConfig, total: int) -> float:
    """Std of the Gaussian noise added to the fused target features at update k (1-based):
    linear warmup from 0 over warmup_steps, then constant `std` or cosine from `std` to `final_std`."""
    if cfg.std == 0.0 and cfg.final_std == 0.0:
        return 0.0
    if cfg.warmup_steps > 0 and k <= cfg.warmup_steps:
        return cfg.std * k / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.std
    span = max(1, total - cfg.warmup_steps)
    progress = min(1.0, max(0.0, (k - cfg.warmup_steps) / span))
    return cfg.final_std + (cfg.std - cfg.final_std) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(params, cfg: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW on fp32 master weights; fused kernel on CUDA, foreach elsewhere."""
    fused = device.type == "cuda"
    return torch.optim.AdamW(
        params,
        lr=cfg.lr,
        betas=tuple(cfg.betas),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        fused=fused,
        foreach=None if fused else True,
    )
