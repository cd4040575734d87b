"""The DFlash training visibility rule, written once and used two ways.

Keys are laid out as [T context features | A*B block tokens]; queries are the A*B block tokens.
A query of block j (anchor at position a_j) may see
  - context key t only if t < a_j (strictly before its anchor: the anchor's own hidden state is
    not known at inference time), and
  - every token of its own block (bidirectional), and no token of any other block.

`visibility` is a flex-attention `mask_mod` body written with tensor ops only, so the same function
also builds the dense boolean mask used with SDPA (on CPU, and as the reference in tests).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def visibility(anchors: torch.Tensor, context_len: int, block_size: int) -> MaskMod:
    """anchors: [n, A] absolute anchor positions. Returns mask_mod(b, h, q_idx, kv_idx) -> bool."""

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        q_block = q_idx // block_size
        is_context = kv_idx < context_len
        sees_context = is_context & (kv_idx < anchors[b, q_block])
        kv_block = (kv_idx - context_len).clamp(min=0) // block_size
        sees_own_block = (~is_context) & (kv_block == q_block)
        return sees_context | sees_own_block

    return mask_mod


def dense_mask(anchors: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """[n, 1, A*B, T + A*B] boolean mask (True = may attend), for SDPA."""
    n, num_anchors = anchors.shape
    q_len = num_anchors * block_size
    device = anchors.device
    b = torch.arange(n, device=device)[:, None, None, None]
    h = torch.zeros((), dtype=torch.long, device=device)
    q = torch.arange(q_len, device=device)[None, None, :, None]
    kv = torch.arange(context_len + q_len, device=device)[None, None, None, :]
    return visibility(anchors, context_len, block_size)(b, h, q, kv)


def flex_block_mask(anchors: torch.Tensor, context_len: int, block_size: int):
    """A flex-attention BlockMask for the same rule; built once per batch, shared by all layers."""
    from torch.nn.attention.flex_attention import create_block_mask

    n, num_anchors = anchors.shape
    q_len = num_anchors * block_size
    return create_block_mask(
        visibility(anchors, context_len, block_size),
        B=n,
        H=None,
        Q_LEN=q_len,
        KV_LEN=context_len + q_len,
        device=anchors.device,
    )
