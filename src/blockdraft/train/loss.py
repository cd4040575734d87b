"""The drafter's objective and its metrics.

Position k = 1..B-1 of a block predicts x_{a+k}. Per-position weights:
  exp_decay  w_k = exp(-(k-1)/gamma)        (gamma 7 for B=16, 4 for B=8 unless set)
  uniform    w_k = 1
  streak     w_k = max(floor, prod_{i<k} p_i), p_i the drafter's current (detached) probability
             of the right token at position i: effort goes where it still changes acceptance.
loss = sum_rows w * (ce + kl_weight * KL) / D, where D is the sum of the static weights (exp_decay,
uniform; for streak the label count) over ALL micro-batches and ranks of the step, so accumulation
gives exactly the token-weighted mean. Logits are computed in row chunks under activation
checkpointing: no [rows x vocab] tensor outlives its chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from blockdraft.config import LossConfig, default_gamma


def static_position_weights(cfg: LossConfig, block_size: int, device: torch.device) -> torch.Tensor:
    """[B-1] weights known before the forward (streak uses 1 here: its weights come from the model)."""
    k = torch.arange(1, block_size, device=device, dtype=torch.float32)
    if cfg.weighting == "exp_decay":
        gamma = cfg.gamma if cfg.gamma is not None else default_gamma(block_size)
        return torch.exp(-(k - 1) / gamma)
    return torch.ones_like(k)


def streak_weights(p_correct: torch.Tensor, floor: float) -> torch.Tensor:
    """p_correct: [..., B-1] detached probabilities -> [..., B-1] weights max(floor, prod_{i<k} p_i)."""
    ones = torch.ones_like(p_correct[..., :1])
    prefix = torch.cumprod(torch.cat([ones, p_correct[..., :-1]], dim=-1), dim=-1)
    return prefix.clamp(min=floor)


def _chunk_terms(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    target_hidden: torch.Tensor | None,
    use_target_labels: bool,
    kl_temperature: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk of rows: hidden [r, H] -> (ce [r], kl [r], prediction [r], label used [r])."""
    logits = F.linear(hidden, weight).float()  # [r, V]
    kl = logits.new_zeros(logits.shape[0])
    if target_hidden is not None:
        with torch.no_grad():
            t_logits = F.linear(target_hidden, weight).float()
        if use_target_labels:
            labels = t_logits.argmax(dim=-1)
        if kl_temperature > 0:
            t_logp = F.log_softmax(t_logits / kl_temperature, dim=-1)
            d_logp = F.log_softmax(logits / kl_temperature, dim=-1)
            kl = (t_logp.exp() * (t_logp - d_logp)).sum(-1) * kl_temperature**2
    ce = F.cross_entropy(logits, labels, reduction="none")
    return ce, kl, logits.detach().argmax(dim=-1), labels


def chunked_terms(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    target_hidden: torch.Tensor | None,
    use_target_labels: bool,
    kl_temperature: float,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same as `_chunk_terms` over all rows, `chunk` rows at a time. With more than one chunk, each
    chunk's logits are recomputed in backward instead of kept (one chunk is kept: nothing to save)."""
    outs = []
    recompute = torch.is_grad_enabled() and hidden.requires_grad and hidden.shape[0] > chunk
    for start in range(0, hidden.shape[0], chunk):
        sl = slice(start, start + chunk)
        th = target_hidden[sl] if target_hidden is not None else None
        args = (hidden[sl], weight, labels[sl], th, use_target_labels, kl_temperature)
        if recompute:
            outs.append(checkpoint(_chunk_terms, *args, use_reentrant=False))
        else:
            outs.append(_chunk_terms(*args))
    if not outs:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty, labels, labels
    return tuple(torch.cat(parts) for parts in zip(*outs, strict=True))


@dataclass
class MicroStats:
    """Sums over one micro-batch; added across micro-batches and ranks, then divided once."""

    weighted_loss: torch.Tensor  # sum w*(ce + kl_weight*kl), before division by D
    weight_sum: torch.Tensor  # sum of w actually applied (for the reported loss)
    kl_sum: torch.Tensor
    correct: torch.Tensor  # [B-1] correct predictions per position
    counted: torch.Tensor  # [B-1] labels per position
    streak_sum: torch.Tensor  # sum over valid blocks of leading-correct counts
    blocks: torch.Tensor  # valid blocks


def block_loss(
    draft_hidden: torch.Tensor,
    lm_weight: torch.Tensor,
    labels: torch.Tensor,
    label_mask: torch.Tensor,
    valid_blocks: torch.Tensor,
    cfg: LossConfig,
    target_hidden: torch.Tensor | None = None,
) -> MicroStats:
    """draft_hidden: [n, A, B-1, H] drafter outputs at block positions 1..B-1; labels, label_mask:
    [n, A, B-1]; valid_blocks: [n, A]; target_hidden: [n, A, B-1, H] the target's final hidden state
    at the position BEFORE each label (its distribution for that label), when kl/target labels are on."""
    block_size = labels.shape[-1] + 1
    rows = label_mask  # only real labels reach the lm_head
    h = draft_hidden[rows]  # [R, H]
    th = target_hidden[rows] if target_hidden is not None else None
    ce, kl, pred, used_labels = chunked_terms(
        h, lm_weight, labels[rows], th, cfg.labels == "target", cfg.kl_temperature, cfg.logits_chunk
    )
    static_w = static_position_weights(cfg, block_size, h.device).expand_as(labels)[rows]
    if cfg.weighting == "streak":
        p_grid = torch.zeros(labels.shape, device=h.device)
        p_grid[rows] = torch.exp(-ce.detach())
        w = streak_weights(p_grid, cfg.streak_floor)[rows]
    else:
        w = static_w
    per_row = ce + cfg.kl_weight * kl if cfg.kl_weight > 0 else ce

    correct_grid = torch.zeros(labels.shape, dtype=torch.bool, device=h.device)
    correct_grid[rows] = pred == used_labels
    streak = torch.cumprod(correct_grid.to(torch.int32), dim=-1).sum(-1)  # [n, A]
    return MicroStats(
        weighted_loss=(w * per_row).sum(),
        weight_sum=w.sum().detach(),
        kl_sum=(w * kl).sum().detach(),
        correct=correct_grid.sum(dim=(0, 1)).float(),
        counted=rows.sum(dim=(0, 1)).float(),
        streak_sum=(streak * valid_blocks).sum().float(),
        blocks=valid_blocks.sum().float(),
    )


def denominator(label_mask: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """This micro-batch's share of D (see module doc): static weights over its real labels."""
    w = static_position_weights(cfg, label_mask.shape[-1] + 1, label_mask.device)
    return (label_mask.float() * w).sum()


def summarize(total: MicroStats, grad_norm: torch.Tensor) -> dict[str, float | list[float]]:
    """Host-side metrics of a whole step: every number crosses to the host in ONE transfer."""
    k = total.correct.numel()
    scalars = torch.stack([total.weighted_loss, total.weight_sum, total.kl_sum, total.streak_sum, total.blocks,
                           grad_norm.to(total.blocks.dtype)])
    host = torch.cat([scalars.float(), total.correct.float(), total.counted.float()]).cpu().tolist()
    loss_sum, wsum, kl_sum, streak_sum, blocks, grad = host[:6]
    correct, counted = host[6 : 6 + k], host[6 + k :]
    wsum = max(wsum, 1e-12)
    streak = streak_sum / max(blocks, 1.0)
    return {
        "loss": loss_sum / wsum,
        "kl": kl_sum / wsum,
        "acc": sum(correct) / max(sum(counted), 1.0),
        "acc_per_pos": [round(c / max(n, 1.0), 5) for c, n in zip(correct, counted, strict=True)],
        "streak": streak,
        "tau_est": 1.0 + streak,
        "loss_tokens": int(sum(counted)),
        "anchors": int(blocks),
        "grad_norm": grad,
    }


def add_stats(a: MicroStats | None, b: MicroStats) -> MicroStats:
    """a + b field by field, detached (b alone when a is None)."""
    fields = MicroStats.__dataclass_fields__
    b = MicroStats(**{f: getattr(b, f).detach() for f in fields})
    return b if a is None else MicroStats(**{f: getattr(a, f) + getattr(b, f) for f in fields})
