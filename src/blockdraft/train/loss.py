"""The drafter's objective and its metrics.

Position k = 1..B-1 of a block predicts x_{a+k}. Per-position weights:
  exp_decay  w_k = exp(-(k-1)/gamma)        (gamma 7 for B=16, 4 for B=8 unless set)
  uniform    w_k = 1
  streak     w_k = max(floor, prod_{i<k} p_i), p_i the drafter's current (detached) probability
             of the right token at position i: effort goes where it still changes acceptance.
loss = sum_rows w * (ce + kl_weight * KL) / D, where D is the sum of the static weights (exp_decay,
uniform; for streak the label count) over ALL micro-batches and ranks of the step, so accumulation
gives exactly the token-weighted mean.

The lm_head is fused with the loss (`fused_block_loss`): logits exist one chunk of rows at a time, and
the gradient with respect to the drafter's hidden states is computed in the same pass, so the
[rows x vocab] matmul runs twice (logits, input gradient) instead of three times (a checkpointed
chunk recomputes its logits in backward). This is the fused-linear-cross-entropy idea of liger-kernel
and cut-cross-entropy, written here because the drafter needs what neither returns: per-row weights,
the prediction (for acceptance metrics) and the KL to the target's soft labels from one pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

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


@dataclass
class RowTerms:
    """Per-row results of the fused lm_head + loss, all detached."""

    ce: torch.Tensor  # [R] cross-entropy against the label used
    kl: torch.Tensor  # [R] KL(target || drafter) at kl_temperature, times T^2 (0 when off)
    pred: torch.Tensor  # [R] the drafter's argmax
    labels: torch.Tensor  # [R] the label used (data, or the target's argmax)


def _ce_terms(
    logits: torch.Tensor, labels: torch.Tensor, need_grad: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """logits [r, V] -> ce [r] (fp32 math), argmax [r], and d ce / d logits [r, V] in the logits'
    dtype. One fused log_softmax and an in-place exp: four passes over the logits (a CPU update spent a
    seventh of its time here with logsumexp, one-hot and out-of-place exp). CUDA runs the same math
    as two Triton passes (`_cuda_ce_terms`)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    ce = -logp.gather(1, labels[:, None]).squeeze(1)
    pred = logp.argmax(dim=-1)
    if not need_grad:
        return ce, pred, None
    grad = logp.exp_().to(logits.dtype)  # softmax
    grad[torch.arange(labels.shape[0], device=labels.device), labels] -= 1.0
    return ce, pred, grad


def _cuda_ce_terms():
    """`train/cross_entropy_kernel.py`, imported at the first CUDA chunk: triton comes with CUDA builds
    of torch, not with every CPU one."""
    from blockdraft.train.cross_entropy_kernel import cross_entropy_terms

    return cross_entropy_terms


def _kl_terms(
    logits: torch.Tensor, t_logits: torch.Tensor, labels: torch.Tensor, kl_weight: float, temperature: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """With soft labels: ce, kl (times T^2), argmax and d(ce + kl_weight * kl) / d logits, in fp32."""
    x = logits.float()
    ce, pred, g = _ce_terms(x, labels, need_grad=True)
    t_logp = F.log_softmax(t_logits / temperature, dim=-1)
    d_logp = F.log_softmax(x / temperature, dim=-1)
    t_p = t_logp.exp()
    kl = (t_p * (t_logp - d_logp)).sum(-1) * temperature**2
    g += (d_logp.exp_() - t_p).mul_(temperature * kl_weight)  # d kl / d logits = T (softmax(x/T) - softmax(t/T))
    return ce, kl, pred, g


class _FusedLinearLoss(torch.autograd.Function):
    """Per-row losses ce_r + kl_weight * kl_r with logits = hidden @ weight.T, chunk by chunk.

    Row r's loss depends on hidden row r alone, so its gradient (a [H] row) is computed in the forward
    with the logits at hand; backward only scales each row by the incoming gradient of its loss. Row
    weights are applied by the caller, after the forward: streak weights, which come from these very
    losses, then cost no second pass over the vocabulary.
    """

    @staticmethod
    def forward(ctx, hidden, weight, labels, target_hidden, kl_weight, kl_temperature, use_target_labels, chunk,
                softcap):
        need_grad = hidden.requires_grad
        grad = torch.empty_like(hidden) if need_grad else None
        parts: list[tuple[torch.Tensor, ...]] = []
        for start in range(0, hidden.shape[0], chunk):
            sl = slice(start, start + chunk)
            logits = F.linear(hidden[sl].to(weight.dtype), weight)  # [r, V], the lm_head's dtype
            y = labels[sl]
            if target_hidden is not None:
                t_logits = F.linear(target_hidden[sl].to(weight.dtype), weight).float()
                if softcap:  # the target's own distribution (Gemma 2 caps its logits at +-softcap)
                    t_logits = softcap * torch.tanh(t_logits / softcap)
                if use_target_labels:
                    y = t_logits.argmax(dim=-1)
            if target_hidden is not None and kl_weight > 0:
                ce, kl, pred, g = _kl_terms(logits, t_logits, y, kl_weight, kl_temperature)
            else:
                terms = _cuda_ce_terms() if logits.is_cuda else _ce_terms
                ce, pred, g = terms(logits, y, need_grad)
                kl = torch.zeros_like(ce)
            if need_grad:
                grad[sl] = (g.to(weight.dtype) @ weight).to(grad.dtype)  # [r, H]
            parts.append((ce, kl, pred, y))
        if need_grad:
            ctx.save_for_backward(grad)
        ce, kl, pred, used = (torch.cat(p) for p in zip(*parts, strict=True)) if parts else (
            hidden.new_zeros(0, dtype=torch.float32), hidden.new_zeros(0, dtype=torch.float32), labels, labels)
        row_loss = ce + kl_weight * kl
        ctx.mark_non_differentiable(ce, kl, pred, used)
        return row_loss, ce, kl, pred, used

    @staticmethod
    def backward(ctx, grad_rows, *_unused):
        (grad,) = ctx.saved_tensors
        return grad * grad_rows[:, None].to(grad.dtype), None, None, None, None, None, None, None, None


def fused_linear_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    cfg: LossConfig,
    target_hidden: torch.Tensor | None = None,
    softcap: float | None = None,
) -> tuple[torch.Tensor, RowTerms]:
    """hidden: [R, H] drafter states at labelled rows; weight: [V, H] the frozen lm_head; labels: [R];
    target_hidden: [R, H] the target's final state before each label (for KL or target labels);
    softcap: the target's final logit soft-cap, applied to its logits (None: uncapped).
    Returns (the rows' losses ce_r + kl_weight kl_r [R] fp32, differentiable in hidden; RowTerms)."""
    row_loss, ce, kl, pred, used = _FusedLinearLoss.apply(
        hidden, weight, labels, target_hidden, cfg.kl_weight, cfg.kl_temperature, cfg.labels == "target",
        cfg.logits_chunk, softcap)
    return row_loss, RowTerms(ce, kl, pred, used)


class StepSums(NamedTuple):
    """A step's sums by name, added across micro-batches and ranks, then divided once: one micro-batch's
    as tensors (`MicroStats`, from `block_loss`), the step's as host floats (`decode` of `stats_vector`,
    whose positions are these fields in this order), so the trainer and `blockdraft bench` read it alike."""

    weighted_loss: torch.Tensor | float  # sum w*(ce + kl_weight*kl), before division by D
    weight_sum: torch.Tensor | float  # sum of w actually applied (for the reported loss)
    kl_sum: torch.Tensor | float
    streak_sum: torch.Tensor | float  # sum over blocks of leading-correct counts
    blocks: torch.Tensor | float  # blocks with at least one label
    correct: torch.Tensor | list[float]  # [B-1] correct predictions per position
    counted: torch.Tensor | list[float]  # [B-1] labels per position

    @classmethod
    def decode(cls, vector: Sequence[float]) -> StepSums:
        n = len(cls._fields) - 2
        k = (len(vector) - n) // 2
        return cls(*vector[:n], list(vector[n : n + k]), list(vector[n + k :]))

    @property
    def loss(self) -> float:
        """The reported (weight-normalised) loss of the step."""
        return self.weighted_loss / max(self.weight_sum, 1e-12)


MicroStats = StepSums  # one micro-batch's sums, as device tensors


def block_loss(
    draft_hidden: torch.Tensor,
    lm_weight: torch.Tensor,
    labels: torch.Tensor,
    label_mask: torch.Tensor,
    cfg: LossConfig,
    target_hidden: torch.Tensor | None = None,
    softcap: float | None = None,
) -> MicroStats:
    """draft_hidden: [V, B-1, H] drafter outputs at block positions 1..B-1; labels, label_mask:
    [V, B-1]; target_hidden: [V, B-1, H] the target's final hidden state at the position BEFORE each
    label (its distribution for that label), when kl/target labels are on; softcap: the target's final
    logit soft-cap."""
    block_size = labels.shape[-1] + 1
    # the labelled rows, as (block, position) indices: the pass's one host wait (their count sizes what
    # follows); indexing by them is asynchronous, where each boolean-mask index would wait again
    blk, pos = label_mask.nonzero(as_tuple=True)  # [R] each
    h = draft_hidden[blk, pos]  # [R, H]
    th = target_hidden[blk, pos] if target_hidden is not None else None
    row_loss, terms = fused_linear_loss(h, lm_weight, labels[blk, pos], cfg, th, softcap)  # [R]
    if cfg.weighting == "streak":  # from the drafter's own current (detached) predictions
        p_grid = torch.zeros(labels.shape, device=h.device)
        p_grid[blk, pos] = torch.exp(-terms.ce)
        w = streak_weights(p_grid, cfg.streak_floor)[blk, pos]
    else:
        w = static_position_weights(cfg, block_size, h.device)[pos]
    weighted = (w * row_loss).sum()

    correct_grid = torch.zeros(labels.shape, dtype=torch.bool, device=h.device)
    correct_grid[blk, pos] = terms.pred == terms.labels
    streak = torch.cumprod(correct_grid.to(torch.int32), dim=-1).sum(-1)  # [V]
    return MicroStats(
        weighted_loss=weighted,
        weight_sum=w.sum().detach(),
        kl_sum=(w * terms.kl).sum(),
        correct=correct_grid.sum(dim=0).float(),
        counted=label_mask.sum(dim=0).float(),
        streak_sum=streak.sum().float(),
        blocks=label_mask.any(dim=-1).sum().float(),
    )


def denominator(label_mask: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """This micro-batch's share of D (see module doc): static weights over its real labels."""
    w = static_position_weights(cfg, label_mask.shape[-1] + 1, label_mask.device)
    return (label_mask.float() * w).sum()


def stats_vector(total: MicroStats) -> torch.Tensor:
    """A step's sums as one fp32 vector (laid out as `StepSums`): the unit of the cross-rank sum and
    of the host transfer."""
    scalars = torch.stack([x.detach() for x in total[:-2]])
    return torch.cat([scalars.float(), total.correct.float(), total.counted.float()])


def summarize(vector: list[float], grad_norm: float) -> dict[str, float | list[float]]:
    """Host-side metrics of a whole step from `stats_vector` (summed over micro-batches and ranks)."""
    sums = StepSums.decode(vector)
    wsum = max(sums.weight_sum, 1e-12)
    streak = sums.streak_sum / max(sums.blocks, 1.0)
    return {
        "loss": sums.loss,
        "kl": sums.kl_sum / wsum,
        "acc": sum(sums.correct) / max(sum(sums.counted), 1.0),
        "acc_per_pos": [round(c / max(n, 1.0), 5) for c, n in zip(sums.correct, sums.counted, strict=True)],
        "streak": streak,
        "tau_est": 1.0 + streak,
        "loss_tokens": int(sum(sums.counted)),
        "anchors": int(sums.blocks),
        "grad_norm": grad_norm,
    }


def add_stats(a: MicroStats | None, b: MicroStats) -> MicroStats:
    """a + b field by field, detached (b alone when a is None)."""
    b = MicroStats(*(x.detach() for x in b))
    return b if a is None else MicroStats(*(x + y for x, y in zip(a, b, strict=True)))
