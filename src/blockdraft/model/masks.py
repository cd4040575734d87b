"""The DFlash training visibility rule, written once and used two ways.

Training runs packed (train/blocks.py): keys are laid out as [L context features | V*B block tokens],
the context being the real tokens of all sequences end to end; queries are the V*B block tokens.
A query of block j (anchor at packed index a_j, in sequence d_j) may see
  - context key t only if t is in the same sequence and t < a_j (strictly before its anchor: the
    anchor's own hidden state is not known at inference time), and
  - every token of its own block (bidirectional), and no token of any other block.

`visibility` is a flex-attention `mask_mod` body written with tensor ops only, so the same function
also builds the dense boolean mask used with SDPA (on CPU, and as the reference in tests).
`flex_block_mask` finds which 128 x 128 tiles the rule touches from its interval form instead (a test
checks it against `create_block_mask`'s entry-by-entry evaluation of `visibility`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

TILE = 128  # the flex-attention BlockMask's query and key tile
MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def visibility(
    anchors: torch.Tensor, block_doc: torch.Tensor, context_doc: torch.Tensor, block_size: int,
    context_len: torch.Tensor | None = None,
) -> MaskMod:
    """anchors, block_doc: [V] packed anchor index and sequence of each block; context_doc: [L]
    sequence of each context token. Returns mask_mod(b, h, q_idx, kv_idx) -> bool.
    context_len (a 0-d tensor) is given when the three tensors are padded past V and L (see
    `flex_block_mask`); otherwise it is L, read inside rather than captured as an int, so it stays
    symbolic under compile."""

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        length = context_doc.shape[0] if context_len is None else context_len
        q_block = q_idx // block_size
        is_context = kv_idx < length
        same_doc = context_doc[kv_idx.clamp(max=length - 1)] == block_doc[q_block]
        sees_context = is_context & same_doc & (kv_idx < anchors[q_block])
        kv_block = (kv_idx - length).clamp(min=0) // block_size
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


def flex_block_mask(
    anchors: torch.Tensor, block_doc: torch.Tensor, context_doc: torch.Tensor, block_size: int,
    capture: tuple[int, int] | None = None,
):
    """A flex-attention BlockMask for the same rule; built once per pass, shared by all layers.

    Its tile lists come from arithmetic, not from evaluating the rule per entry (`create_block_mask`
    would, compiling a kernel for every pass shape; one such compile took minutes on an H200). With
    sequences packed end to end (ids ascending, as `pack` lays them), block j sees two key intervals:
    its sequence's context before its anchor, [start(d_j), a_j), and its own block, [L + jB, L + (j+1)B).
    Its visible keys per 128-wide key tile are then interval overlaps. A tile is skipped when no query
    of it sees a key, taken whole when every query sees every key, and masked by `visibility` inside
    the kernel otherwise.

    capture = (blocks, context): the tensors the mask_mod captures are padded to these fixed sizes
    (when larger than V and L), so a compiled forward never guards on their sizes: a graph compiled
    for one pass shape then serves every other (padding blocks see nothing, padding context is never read)."""
    from torch.nn.attention.flex_attention import BlockMask

    v, length = anchors.shape[0], context_doc.shape[0]
    q_len, kv_len = v * block_size, length + v * block_size
    device = anchors.device
    lo = torch.searchsorted(context_doc, block_doc)  # [V] first key of the block's sequence (ids ascend)
    hi = torch.maximum(anchors, lo)  # [V]: context [lo, hi); empty for filler blocks (id -1, anchor 0)
    own = length + torch.arange(v, device=device) * block_size  # [V]: own block [own, own + B)
    tile = torch.arange(0, kv_len, TILE, device=device)  # [T] first key of each tile
    end = (tile + TILE).clamp(max=kv_len)

    def overlap(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # [V], [V] -> [V, T]
        return (torch.minimum(b[:, None], end) - torch.maximum(a[:, None], tile)).clamp(min=0)

    seen = (overlap(lo, hi) + overlap(own, own + block_size)).int()  # [V, T] keys each block sees per tile
    rows = torch.repeat_interleave(seen, block_size, dim=0)  # [V*B, T]: every query row of its block
    rows = torch.cat([rows, rows.new_zeros(-q_len % TILE, rows.shape[1])])  # past Q_LEN: sees nothing
    per_tile = rows.view(-1, TILE, rows.shape[1]).sum(1)  # [Qt, T] visible (query, key) pairs
    full = per_tile == TILE * TILE
    partial = (per_tile > 0) & ~full

    def ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [rows, cols] -> counts, indices first
        counts = tiles.sum(-1, dtype=torch.int32)
        indices = torch.argsort(tiles.to(torch.int32), dim=-1, descending=True, stable=True).to(torch.int32)
        return counts[None, None], indices[None, None]

    (kv_num, kv_idx), (full_kv_num, full_kv_idx) = ordered(partial), ordered(full)  # per query tile
    (q_num, q_idx), (full_q_num, full_q_idx) = ordered(partial.T), ordered(full.T)  # per key tile (backward)

    context_len = None
    if capture is not None:
        blocks_cap, context_cap = max(capture[0], v), max(capture[1], length)
        context_len = context_doc.new_full((), length)  # a fill kernel: no copy, no sync
        anchors = torch.cat([anchors, anchors.new_zeros(blocks_cap - v)])
        block_doc = torch.cat([block_doc, block_doc.new_full((blocks_cap - v,), -1)])
        context_doc = torch.cat([context_doc, context_doc.new_full((context_cap - length,), -2)])
    return BlockMask(seq_lengths=(q_len, kv_len), kv_num_blocks=kv_num, kv_indices=kv_idx,
                     full_kv_num_blocks=full_kv_num, full_kv_indices=full_kv_idx, q_num_blocks=q_num, q_indices=q_idx,
                     full_q_num_blocks=full_q_num, full_q_indices=full_q_idx, BLOCK_SIZE=(TILE, TILE),
                     mask_mod=visibility(anchors, block_doc, context_doc, block_size, context_len))
