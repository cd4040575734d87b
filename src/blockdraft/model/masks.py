"""The DFlash training visibility rule, written once and used two ways.

Training runs packed (train/blocks.py): keys are laid out as [L context features | V*B block tokens],
the context being the real tokens of all sequences end to end; queries are the V*B block tokens.
A query of block j (anchor at packed index a_j, in sequence d_j) may see
  - context key t only if t is in the same sequence and t < a_j (strictly before its anchor: the
    anchor's own hidden state is not known at inference time), and
  - every token of its own block (bidirectional), and no token of any other block.

With sequences packed end to end (ids ascending, as `pack` lays them), the rule is two key
intervals per block: its sequence's context before its anchor, [start(d_j), a_j), and its own block,
[L + jB, L + (j+1)B). `visibility` is a flex-attention `mask_mod` of those intervals, written with
tensor ops only, so the same function also builds the dense boolean mask used with SDPA (on CPU, and
in tests against the rule as stated). `flex_block_mask` finds which 128 x 128 tiles the intervals touch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

TILE = 128  # the flex-attention BlockMask's query and key tile
MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def intervals(
    anchors: torch.Tensor, block_doc: torch.Tensor, context_doc: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """anchors, block_doc: [V] packed anchor index and sequence of each block; context_doc: [L] sequence
    of each context token, ascending. Returns lo, hi, own: [V] each, block j seeing context [lo, hi)
    and its own block [own, own + B). Filler blocks (sequence -1, anchor 0) see only their own block."""
    lo = torch.searchsorted(context_doc, block_doc)  # first key of the block's sequence
    hi = torch.maximum(anchors, lo)
    own = context_doc.shape[0] + torch.arange(anchors.shape[0], device=anchors.device) * block_size
    return lo, hi, own


def visibility(lo: torch.Tensor, hi: torch.Tensor, own: torch.Tensor, block_size: int) -> MaskMod:
    """The rule as a mask_mod(b, h, q_idx, kv_idx) -> bool, from `intervals`' [V] tensors. Per entry it
    only compares: each query reads its block's three bounds and no key is looked up, which made flex
    attention 7-34% faster than comparing sequence ids per key (benchmarks/2026-12-02-h200-block-mask.md)."""

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        j = q_idx // block_size
        start = own[j]
        return ((kv_idx >= lo[j]) & (kv_idx < hi[j])) | ((kv_idx >= start) & (kv_idx < start + block_size))

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
    rule = visibility(*intervals(anchors, block_doc, context_doc, block_size), block_size)
    return rule(zero, zero, q, kv)[None, None]


def flex_block_mask(
    anchors: torch.Tensor, block_doc: torch.Tensor, context_doc: torch.Tensor, block_size: int,
    capture: int | None = None,
):
    """A flex-attention BlockMask for the same rule; built once per pass, shared by all layers.

    Its tile lists come from the intervals, not from evaluating the rule per entry (`create_block_mask`
    would, compiling a kernel for every pass shape; one such compile took minutes on an H200): a block's
    visible keys per 128-wide key tile are interval overlaps. A tile is skipped when no query of it
    sees a key, taken whole when every query sees every key, and masked by `visibility` inside the
    kernel otherwise.

    capture: the [V] tensors the mask_mod captures are padded to this many blocks (when more than V), so
    a compiled forward never guards on their size: a graph compiled for one pass shape then serves every
    other (the padding entries are never read: no query belongs to them)."""
    from torch.nn.attention.flex_attention import BlockMask

    v, length = anchors.shape[0], context_doc.shape[0]
    q_len, kv_len = v * block_size, length + v * block_size
    device = anchors.device
    lo, hi, own = intervals(anchors, block_doc, context_doc, block_size)  # [V] each
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
        # row-major strides even for partial.T of one query tile, whose last dim (size 1) keeps its stride
        # under .contiguous(): FlashAttention-4 refuses any stride but 1 there
        tiles = tiles.to(torch.int32, memory_format=torch.contiguous_format)
        counts = tiles.sum(-1, dtype=torch.int32)
        indices = torch.argsort(tiles, dim=-1, descending=True, stable=True).to(torch.int32)
        return counts[None, None], indices[None, None]

    (kv_num, kv_idx), (full_kv_num, full_kv_idx) = ordered(partial), ordered(full)  # per query tile
    (q_num, q_idx), (full_q_num, full_q_idx) = ordered(partial.T), ordered(full.T)  # per key tile (backward)

    if capture is not None and capture > v:
        lo, hi, own = (torch.cat([x, x.new_zeros(capture - v)]) for x in (lo, hi, own))
    return BlockMask(seq_lengths=(q_len, kv_len), kv_num_blocks=kv_num, kv_indices=kv_idx,
                     full_kv_num_blocks=full_kv_num, full_kv_indices=full_kv_idx, q_num_blocks=q_num, q_indices=q_idx,
                     full_q_num_blocks=full_q_num, full_q_indices=full_q_idx, BLOCK_SIZE=(TILE, TILE),
                     mask_mod=visibility(lo, hi, own, block_size))
