"""Packing, anchors, block inputs and labels for one micro-batch: the part of DFlash that public ports
most often get subtly wrong (fixed instead of random anchors, labels shifted by one).

A micro-batch arrives right-padded, [n, T]. The drafter never sees the padding: its context is the
L real tokens of the n sequences laid end to end (`Packed`), and its queries are only the V blocks
that exist, so a batch of short sequences costs what its real tokens and blocks cost.

For an anchor at position a of its sequence:
  block tokens   [x_a, MASK, ..., MASK]              (B tokens, positions a .. a+B-1)
  labels         x_{a+1} .. x_{a+B-1}                (block position k predicts x_{a+k}: no shift)
  label counted  only where the label is an assistant token.
Anchors are drawn uniformly without replacement among assistant positions a >= 1 whose whole block
fits in the sequence (a + B - 1 < length), at most `num_anchors` per sequence, and with
`anchors_per_token` at most ceil(anchors_per_token x its assistant tokens): a density, so short
answers get fewer, less overlapping blocks (None: the cap alone, as published). Both rules are
written once, in data/cost.py (`can_anchor`, `blocks_per_sample`), which plans batches by them.
Their RNG is keyed by the update and the micro-batch's index in it over all ranks
(`anchor_generator`), so an update draws the same anchors however world_size x grad_accum splits
it, and again when resumed.

With shape classes (train/shapes.py) a pass is padded: filler context tokens after the L real ones
(a sequence id of their own, no candidates) and filler blocks after the V real ones (sequence id -1:
they see no context, and no label), so the compiled forward sees few shapes and the same update.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from blockdraft.data.cost import blocks_per_sample, can_anchor
from blockdraft.train.shapes import ShapeClasses


@dataclass
class Packed:
    """The n sequences of a micro-batch end to end: L real tokens, then filler up to the shape class
    (L' >= L entries; L' = L without classes)."""

    token_index: torch.Tensor  # [L'] long: index of each token in the padded [n*T] batch (filler: 0)
    input_ids: torch.Tensor  # [L'] long
    loss_mask: torch.Tensor  # [L'] bool
    doc: torch.Tensor  # [L'] long: which sequence (filler: n, a sequence of its own)
    pos: torch.Tensor  # [L'] long: position inside its sequence
    candidates: torch.Tensor  # [L'] bool: may anchor a block (filler: never)
    num_blocks: int  # V = sum over sequences of their blocks (`row_blocks`): known on the host
    doc_blocks: torch.Tensor  # [n+1] long: blocks of each sequence (the filler's: 0)
    real_tokens: int  # L
    padded_blocks: int  # V' >= max(V, 1): blocks the forward runs, filler without labels

    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Packed:
        """A copy with `fn` applied to every tensor field."""
        return replace(self, **{k: fn(v) for k, v in vars(self).items() if isinstance(v, torch.Tensor)})

    def to(self, device: torch.device) -> Packed:
        """Host -> device without waiting (the host tensors are pinned on CUDA)."""
        return self.apply(lambda x: x.to(device, non_blocking=True))


def row_blocks(
    loss_mask: torch.Tensor, lengths: torch.Tensor, block_size: int, num_anchors: int,
    anchors_per_token: float | None = None,
) -> torch.Tensor:
    """[n] blocks each sequence of a right-padded host batch will get: min(cap, candidates)."""
    pos = torch.arange(loss_mask.shape[1])[None, :]
    candidates = can_anchor(loss_mask, pos, lengths[:, None], block_size).sum(dim=1)  # [n]
    answers = (loss_mask & (pos < lengths[:, None])).sum(dim=1)  # [n] assistant tokens
    return torch.from_numpy(blocks_per_sample(candidates.numpy(), num_anchors, anchors_per_token,
                                              answers.numpy())).long()


def pack(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, lengths: torch.Tensor, block_size: int, num_anchors: int,
    anchors_per_token: float | None = None, shapes: ShapeClasses | None = None,
) -> Packed:
    """input_ids, loss_mask: [n, T] right-padded host tensors; lengths: [n]. Runs on the host, where the
    number of blocks is known without a device synchronisation; pads to `shapes`' classes if given."""
    n, t = input_ids.shape
    pos_grid = torch.arange(t)[None, :].expand(n, t)
    real = pos_grid < lengths[:, None]  # [n, T]
    token_index = real.reshape(-1).nonzero().squeeze(1)
    doc = torch.arange(n)[:, None].expand(n, t).reshape(-1)[token_index]
    pos = pos_grid.reshape(-1)[token_index]
    mask = loss_mask.reshape(-1)[token_index]
    candidates = can_anchor(mask, pos, lengths[doc], block_size)
    ids = input_ids.reshape(-1)[token_index]
    per_doc = row_blocks(loss_mask, lengths, block_size, num_anchors, anchors_per_token)  # [n]
    doc_blocks = torch.cat([per_doc, per_doc.new_zeros(1)])  # [n+1]: the filler sequence has none
    real, blocks = int(token_index.shape[0]), int(per_doc.sum())
    padded_blocks = max(blocks, 1)
    if shapes is not None:
        padded_blocks = shapes.blocks(blocks)
        fill = shapes.context(real) - real
        token_index, ids, pos = (torch.cat([x, x.new_zeros(fill)]) for x in (token_index, ids, pos))
        doc = torch.cat([doc, doc.new_full((fill,), n)])
        mask, candidates = (torch.cat([x, x.new_zeros(fill)]) for x in (mask, candidates))
    packed = Packed(
        token_index=token_index,
        input_ids=ids,
        loss_mask=mask,
        doc=doc,
        pos=pos,
        candidates=candidates,
        num_blocks=blocks,
        doc_blocks=doc_blocks,
        real_tokens=real,
        padded_blocks=padded_blocks,
    )
    return packed.apply(torch.Tensor.pin_memory) if torch.cuda.is_available() else packed


def split_rows(blocks_per_row: list[int], max_blocks: int) -> list[list[int]]:
    """Consecutive groups of rows holding at most `max_blocks` blocks each (a row over it goes alone):
    memory follows the number of blocks, which the token budget of the batch plan does not bound."""
    groups: list[list[int]] = [[]]
    total = 0
    for row, count in enumerate(blocks_per_row):
        if groups[-1] and total + count > max_blocks:
            groups.append([])
            total = 0
        groups[-1].append(row)
        total += count
    return groups


@dataclass
class Blocks:
    anchors: torch.Tensor  # [V'] long: packed index of each block's anchor, ascending, then filler (0)
    doc: torch.Tensor  # [V'] long: the sequence of each block (filler: -1, sees no context)
    tokens: torch.Tensor  # [V', B] long: anchor token, then mask tokens
    positions: torch.Tensor  # [V', B] long: a .. a+B-1 (positions inside the sequence, for RoPE)
    labels: torch.Tensor  # [V', B-1] long
    label_mask: torch.Tensor  # [V', B-1] bool (filler: all False)


def anchor_generator(seed: int, step: int, micro: int, part: int, device: torch.device) -> torch.Generator:
    """A stateless RNG for pass `part` of micro-batch `micro` (rank * grad_accum + its index on the rank)
    of update `step`: the anchors (and noise) of that pass, on any world size and after a resume."""
    g = torch.Generator(device=device)
    g.manual_seed((((seed * 1_000_003 + step) * 1_013 + micro) * 4_099 + part) % (2**63 - 1))
    return g


def sample_blocks(
    packed: Packed, block_size: int, num_anchors: int, mask_token_id: int, generator: torch.Generator
) -> Blocks:
    """Random anchors, `packed.doc_blocks` (at most `num_anchors`) per sequence, without a host
    synchronisation: candidates are ordered by (sequence, random score); the first of each sequence
    are kept. Scores are drawn for the real tokens only, so padding leaves the anchors as they were."""
    device = packed.input_ids.device
    length = packed.input_ids.shape[0]
    score = torch.rand(packed.real_tokens, generator=generator, device=device, dtype=torch.float64)  # [L] in [0, 1)
    score = torch.cat([score, score.new_full((length - packed.real_tokens,), 2.0)])  # [L']
    key = packed.doc.double() * 4 + torch.where(packed.candidates, score, torch.full_like(score, 2.0))
    order = key.argsort()  # sequence-major; within a sequence candidates first, in random order
    starts = torch.zeros_like(packed.doc).scatter_reduce(0, packed.doc, torch.arange(length, device=device),
                                                          reduce="amin", include_self=False)
    rank = torch.arange(length, device=device) - starts[packed.doc]  # each sequence keeps its own span
    keep = (rank < packed.doc_blocks[packed.doc].clamp(max=num_anchors)) & packed.candidates[order]
    # exactly V kept entries; with V = 0 one placeholder block without labels keeps every rank's graph alike
    chosen = keep.float().topk(max(packed.num_blocks, 1), sorted=False).indices
    anchors = order[chosen].sort().values  # [V]
    doc = packed.doc[anchors]
    labelled = packed.candidates[anchors]  # [V] (False for the placeholder)
    fill = packed.padded_blocks - anchors.shape[0]
    if fill > 0:  # filler blocks: anchored at 0, in no sequence, without labels
        anchors = torch.cat([anchors, anchors.new_zeros(fill)])  # [V']
        doc = torch.cat([doc, doc.new_full((fill,), -1)])
        labelled = torch.cat([labelled, labelled.new_zeros(fill)])

    offsets = torch.arange(block_size, device=device)
    label_index = (anchors[:, None] + offsets[1:]).clamp(max=length - 1)  # [V', B-1]: inside the anchor's sequence
    tokens = torch.full((anchors.shape[0], block_size), mask_token_id, dtype=packed.input_ids.dtype, device=device)
    tokens[:, 0] = packed.input_ids[anchors]
    return Blocks(
        anchors=anchors,
        doc=doc,
        tokens=tokens,
        positions=packed.pos[anchors][:, None] + offsets,
        labels=packed.input_ids[label_index],
        label_mask=packed.loss_mask[label_index] & labelled[:, None],
    )
