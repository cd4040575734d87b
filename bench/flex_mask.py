"""The drafter's flex attention alone, forward + backward, on one bench pass: what the mask_mod costs.

One pass of `blockdraft bench`'s synthetic data (full: two 3,072-token samples, 1,024 blocks; mix: the
log-normal chat-like lengths, samples taken until the 6,144-token budget or 1,100 blocks is reached:
4,094 tokens and 1,536 blocks), packed and padded as training packs it (`pack`, `sample_blocks`, shape
classes), with a Qwen3-8B drafter layer's attention shapes (32 query heads, 8 key/value heads, head dim
128, bf16). Each variant is compiled on its own and timed as the median of 20 calls after 3, between CUDA
events (`blockdraft.bench.measure.cuda_median_ms`; one layer's call; an update runs one per drafter layer):
  package            `model/masks.flex_block_mask` and `model/drafter.flex_kernel_options` as the drafter
                     calls them
  no tile hint       the same without `flex_kernel_options` (IS_DIVISIBLE left to inductor, which
                     proves it for static sizes only)
  sequence ids       the mask_mod of commit 15a383b: a key's sequence id compared with its block's
  interval, L const  the interval form with each block's own-block start computed from L (a Python
                     int), as first measured on 2026-12-02
  all tiles whole    every visited tile taken as full, no mask_mod: a wrong result, the bound of what
                     evaluating the mask costs
  FlashAttention-4   the package's mask on FlashAttention-4's CuTe kernels (`train.flex_backend: flash`),
                     when flash-attn-4 is installed; its output is compared with the first variant's
                     as the largest absolute difference (another kernel's rounding)
`static` compiles for the pass's shapes; `dynamic` with symbolic sizes, as dynamo compiles the drafter
after the first block class (train/hotpath.py). Output is compared with the first variant's (exactly).

    PYTHONPATH=src python3 bench/flex_mask.py > flex-mask.json   # CUDA
"""

from __future__ import annotations

import json

import numpy as np
import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from blockdraft.bench.measure import cuda_median_ms
from blockdraft.bench.synthetic import SyntheticDataset
from blockdraft.data.batching import PlannedBatch
from blockdraft.data.prefetch import collate
from blockdraft.model.drafter import flex_kernel_options
from blockdraft.model.masks import TILE, MaskMod, flex_block_mask, intervals
from blockdraft.train.blocks import Blocks, pack, row_blocks, sample_blocks
from blockdraft.train.hotpath import flash_attention_installed
from blockdraft.train.shapes import ShapeClasses

B, HEADS, KV_HEADS, HEAD_DIM = 16, 32, 8, 128
BUDGET, SEQ_LEN, ANCHORS, MAX_BLOCKS = 6144, 3072, 512, 1536


def bench_pass(profile: str, seed: int, max_blocks: int, shapes: ShapeClasses) -> tuple:
    """The first samples of the profile's dataset that fit the token budget and `max_blocks`, packed."""
    data = SyntheticDataset(profile, SEQ_LEN, 1000, 400, seed=seed)
    batch = collate(data, PlannedBatch(0, 0, 0, np.arange(64), 0, 0, 0.0), 1, pin=False)  # 64 candidates
    blocks = row_blocks(batch.loss_mask, batch.lengths, B, ANCHORS)  # [64]
    over = (batch.lengths.cumsum(0) > BUDGET) | (blocks.cumsum(0) - blocks >= max_blocks)
    n = int(over.nonzero()[0])  # the samples before the first that does not fit
    packed = pack(batch.input_ids[:n], batch.loss_mask[:n], batch.lengths[:n], B, ANCHORS, None, shapes)
    blocks_drawn = sample_blocks(packed, B, ANCHORS, 0, torch.Generator().manual_seed(seed))
    return packed, blocks_drawn, int(batch.lengths[:n].sum()), int(blocks[:n].sum())


def by_sequence_ids(anchors: torch.Tensor, block_doc: torch.Tensor, context_doc: torch.Tensor) -> MaskMod:
    """15a383b's mask_mod: a context key is visible when its sequence is the block's and it precedes
    the anchor; a block key when it is in the query's own block."""
    length = torch.tensor(context_doc.shape[0], device=context_doc.device)

    def mask_mod(b, h, q_idx, kv_idx):
        q_block = q_idx // B
        is_context = kv_idx < length
        same_doc = context_doc[kv_idx.clamp(max=length - 1)] == block_doc[q_block]
        sees_context = is_context & same_doc & (kv_idx < anchors[q_block])
        sees_own_block = (~is_context) & ((kv_idx - length).clamp(min=0) // B == q_block)
        return sees_context | sees_own_block

    return mask_mod


def interval_with_constant_length(lo: torch.Tensor, hi: torch.Tensor, length: int) -> MaskMod:
    def mask_mod(b, h, q_idx, kv_idx):
        j = q_idx // B
        own = length + j * B
        return ((kv_idx >= lo[j]) & (kv_idx < hi[j])) | ((kv_idx >= own) & (kv_idx < own + B))

    return mask_mod


def with_mask_mod(mask: BlockMask, mask_mod: MaskMod) -> BlockMask:
    return BlockMask.from_kv_blocks(mask.kv_num_blocks, mask.kv_indices, mask.full_kv_num_blocks,
                                    mask.full_kv_indices, BLOCK_SIZE=(TILE, TILE), mask_mod=mask_mod,
                                    seq_lengths=mask.seq_lengths)


def all_tiles_whole(mask: BlockMask) -> BlockMask:
    """The same visited tiles, every one of them full (the partial ones first, then the full ones)."""
    n = mask.kv_indices.shape[-1]
    valid = torch.cat([torch.arange(n, device=mask.kv_indices.device) < mask.kv_num_blocks[..., None],
                       torch.arange(n, device=mask.kv_indices.device) < mask.full_kv_num_blocks[..., None]], -1)
    both = torch.cat([mask.kv_indices, mask.full_kv_indices], -1)
    index = torch.gather(both, -1, torch.argsort((~valid).int(), dim=-1, stable=True))[..., :n].contiguous()
    count = mask.kv_num_blocks + mask.full_kv_num_blocks
    return BlockMask.from_kv_blocks(torch.zeros_like(count), index, count, index, BLOCK_SIZE=(TILE, TILE),
                                    mask_mod=mask.mask_mod, seq_lengths=mask.seq_lengths)


def median_ms(attention, mask: BlockMask, q, k, v, options: dict, calls: int = 20) -> tuple[float, float, torch.Tensor]:
    """Median forward and forward + backward time of one call, and the output."""

    def forward() -> torch.Tensor:
        return attention(q, k, v, block_mask=mask, enable_gqa=True, kernel_options=options)

    def forward_backward() -> None:
        q.grad = k.grad = v.grad = None
        forward().sum().backward()

    total = cuda_median_ms(forward_backward, calls)
    return cuda_median_ms(forward, calls), total, forward().detach()


def main() -> None:
    device = torch.device("cuda")
    torch._dynamo.config.recompile_limit = 64  # 16 compiles of one function: past the default, it would run eager
    shapes = ShapeClasses.for_budget(B, BUDGET)
    capture = shapes.blocks(MAX_BLOCKS)
    results = []
    for profile, seed, max_blocks in (("full", 0, 1024), ("mix", 1, 1100)):
        packed, blocks, tokens, n_blocks = bench_pass(profile, seed, max_blocks, shapes)
        packed = packed.to(device)
        blocks = Blocks(**{name: getattr(blocks, name).to(device) for name in Blocks.__dataclass_fields__})
        package = flex_block_mask(blocks.anchors, blocks.doc, packed.doc, B, capture)
        lo, hi, _ = intervals(blocks.anchors, blocks.doc, packed.doc, B)
        q_len, kv_len = package.seq_lengths
        gen = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(1, HEADS, q_len, HEAD_DIM, device=device, generator=gen, dtype=torch.bfloat16)
        k, v = (torch.randn(1, KV_HEADS, kv_len, HEAD_DIM, device=device, generator=gen, dtype=torch.bfloat16)
                for _ in range(2))
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        row = {"profile": profile, "tokens": tokens, "blocks": n_blocks, "q_len": q_len, "kv_len": kv_len,
               "partial_tiles": int(package.kv_num_blocks.sum()), "full_tiles": int(package.full_kv_num_blocks.sum())}
        sequence_ids = with_mask_mod(package, by_sequence_ids(blocks.anchors, blocks.doc, packed.doc))
        constant_length = with_mask_mod(package, interval_with_constant_length(lo, hi, packed.doc.shape[0]))
        hint, flash = flex_kernel_options(package, q_len, kv_len), flex_kernel_options(package, q_len, kv_len, "FLASH")
        reference = None
        for name, dynamic, mask, options in (
            ("package, static", False, package, hint), ("package, dynamic", True, package, hint),
            ("no tile hint, static", False, package, {}), ("no tile hint, dynamic", True, package, {}),
            ("sequence ids, static", False, sequence_ids, {}), ("sequence ids, dynamic", True, sequence_ids, {}),
            ("interval, L const, static", False, constant_length, {}),
            ("all tiles whole (wrong), static", False, all_tiles_whole(package), {}),
            *([("FlashAttention-4, static", False, package, flash), ("FlashAttention-4, dynamic", True, package, flash)]
              if flash_attention_installed() else []),
        ):
            forward, total, out = median_ms(torch.compile(flex_attention, dynamic=dynamic), mask, q, k, v, options)
            same = None if reference is None else bool(torch.equal(out, reference))
            reference = out if reference is None else reference
            row[name] = {"forward_ms": round(forward, 3), "forward_backward_ms": round(total, 3), "same_output": same,
                         "max_abs_diff": float((out.float() - reference.float()).abs().max())}
        results.append(row)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
