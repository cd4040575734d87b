"""Anchors, block inputs and labels for one micro-batch: the part of DFlash that public ports most
often get subtly wrong (fixed instead of random anchors, labels shifted by one).

For an anchor at absolute position a:
  block tokens   [x_a, MASK, ..., MASK]              (B tokens, positions a .. a+B-1)
  labels         x_{a+1} .. x_{a+B-1}                (block position k predicts x_{a+k}: no shift)
  label counted  only where the label is an assistant token inside the sequence.
Anchors are drawn uniformly without replacement among assistant positions a >= 1 whose whole block
fits in the sequence (a + B - 1 < length), at most `num_anchors` per sequence, all on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Blocks:
    anchors: torch.Tensor  # [n, A] long, ascending; 0 where not valid
    valid: torch.Tensor  # [n, A] bool
    tokens: torch.Tensor  # [n, A, B] long: anchor token, then mask tokens
    positions: torch.Tensor  # [n, A, B] long: a .. a+B-1
    labels: torch.Tensor  # [n, A, B-1] long
    label_mask: torch.Tensor  # [n, A, B-1] bool

    @property
    def block_size(self) -> int:
        return self.tokens.shape[-1]


def anchor_candidates(loss_mask: torch.Tensor, lengths: torch.Tensor, block_size: int) -> torch.Tensor:
    """[n, T] bool: positions that may anchor a block."""
    n, t = loss_mask.shape
    pos = torch.arange(t, device=loss_mask.device)[None, :]
    fits = pos + block_size - 1 < lengths[:, None]
    return loss_mask & fits & (pos >= 1)


def sample_blocks(
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    lengths: torch.Tensor,
    block_size: int,
    num_anchors: int,
    mask_token_id: int,
    generator: torch.Generator,
) -> Blocks:
    """input_ids, loss_mask: [n, T]; lengths: [n]. No host synchronisation."""
    n, t = input_ids.shape
    device = input_ids.device
    cand = anchor_candidates(loss_mask, lengths, block_size)
    a = max(1, min(num_anchors, t - block_size + 1))
    scores = torch.rand((n, t), generator=generator, device=device) + 1.0  # in [1, 2)
    scores = torch.where(cand, scores, torch.zeros_like(scores))
    top_scores, top_pos = scores.topk(a, dim=1)  # random subset without replacement
    valid = top_scores > 0
    anchors, _ = torch.where(valid, top_pos, t).sort(dim=1)  # ascending; invalid (= t) last
    valid = anchors < t
    anchors = torch.where(valid, anchors, torch.zeros_like(anchors))

    offsets = torch.arange(block_size, device=device)
    positions = anchors[:, :, None] + offsets  # [n, A, B]
    tokens = torch.full((n, a, block_size), mask_token_id, dtype=input_ids.dtype, device=device)
    tokens[:, :, 0] = torch.gather(input_ids, 1, anchors)

    label_pos = positions[:, :, 1:].clamp(max=t - 1).reshape(n, -1)  # [n, A*(B-1)]
    labels = torch.gather(input_ids, 1, label_pos).view(n, a, block_size - 1)
    label_ok = torch.gather(loss_mask, 1, label_pos).view(n, a, block_size - 1)
    inside = positions[:, :, 1:] < lengths[:, None, None]
    label_mask = valid[:, :, None] & label_ok & inside
    return Blocks(anchors, valid, tokens, positions, labels, label_mask)
