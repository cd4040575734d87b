"""The DFlash training visibility rule, written once and used two ways.

Training runs packed (train/blocks.py): keys are laid out as [L context features | V*B block tokens],
the context being the real tokens of all sequences end to end; queries are the V*B block tokens.
A query of block j (anchor at packed index a_j, in sequence d_j) may see
  - context key t only if t is in the same sequence and t < a_j (strictly before its anchor: the
    anchor's own hidden state is not known at inference time), and
  - every token of its own block (bidirectional), and no token of any other block.

`visibility` is a flex-attention `mask_mod` body written with tensor ops only, so the same function
also builds the dense boolean mask used with SDPA (on CPU, and as the reference in tests).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def visibility(anchors: torch.Tensor, block_doc: torch.Tensor, context_doc: torch.Tensor, block_size: int) -> MaskMod:
    """anchors, block_doc: [V] packed anchor index and sequence of each block; context_doc: [L]
    sequence of each context token. Returns mask_mod(b, h, q_idx, kv_idx) -> bool.
    The context length is read inside (not captured as an int), so it stays symbolic under compile."""

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        context_len = context_doc.shape[0]
        q_block = q_idx // block_size
        is_context = kv_idx < context_len
        same_doc = context_doc[kv_idx.clamp(max=context_len - 1)] == block_doc[q_block]
        sees_context = is_context & same_doc & (kv_idx < anchors[q_block])
        kv_block = (kv_idx - context_len).clamp(min=0) // block_size
        sees_own_block = (~is_context) & (kv_block == q_block)
        return sees_context | sees_own_block

    return mask_mod


def dense_mask(
    anchors: torch.Tensor, block_doc: torch.Tensor, context_doc: torch.Tensor, block_size: int
) -> torch.Tensor:
    """[1, 1, V*B, L + V*B] boolean mask (True = may attend), for SDPA."""
    q_len = anchors.shape[0] * block_size
    device = anchors.device
    zero = torch.zeros((), dtype=torch.long, device=device)
    q = torch.arange(q_len, device=device)[:, None]
    kv = torch.arange(context_doc.shape[0] + q_len, device=device)[None, :]
    return visibility(anchors, block_doc, context_doc, block_size)(zero, zero, q, kv)[None, None]


def flex_block_mask(anchors: torch.Tensor, block_doc: torch.Tensor, context_doc: torch.Tensor, block_size: int):
    """A flex-attention BlockMask for the same rule; built once per micro-batch, shared by all layers.
    Its tiles outside a block's own sequence are skipped, so packing costs no attention work."""
    from torch.nn.attention.flex_attention import create_block_mask

    q_len = anchors.shape[0] * block_size
    return create_block_mask(
        visibility(anchors, block_doc, context_doc, block_size),
        B=None,
        H=None,
        Q_LEN=q_len,
        KV_LEN=context_doc.shape[0] + q_len,
        device=anchors.device,
        _compile=anchors.is_cuda,
    )
