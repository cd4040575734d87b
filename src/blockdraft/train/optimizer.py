"""The optimizer. The LR and noise schedules it follows are in `blockdraft.schedule`, shared with
the doctor (which must not import torch)."""

from __future__ import annotations

import torch

from blockdraft.config import OptimConfig


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
