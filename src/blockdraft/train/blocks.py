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
fits in the sequence (a + B - 1 < length), at most `num_anchors` per sequence. Their RNG is keyed by
the update and the micro-batch's index in it over all ranks (`anchor_generator`), so an update draws
the same anchors however world_size x grad_accum splits it, and again when resumed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class Packed:
    """The n sequences of a micro-batch end to end: L real tokens, no padding."""

    token_index: torch.Tensor  # [L] long: index of each real token in the padded [n*T] batch
    input_ids: torch.Tensor  # [L] long
    loss_mask: torch.Tensor  # [L] bool
    doc: torch.Tensor  # [L] long: which sequence
    pos: torch.Tensor  # [L] long: position inside its sequence
    candidates: torch.Tensor  # [L] bool: may anchor a block
    num_blocks: int  # V = sum over sequences of min(num_anchors, candidates): known on the host

    def to(self, device: torch.device) -> Packed:
        """Host -> device without waiting (the host tensors are pinned on CUDA)."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device, non_blocking=True)
        return Packed(**moved)


def row_blocks(loss_mask: torch.Tensor, lengths: torch.Tensor, block_size: int, num_anchors: int) -> torch.Tensor:
    """[n] blocks each sequence of a right-padded host batch will get: min(num_anchors, candidates)."""
    t = loss_mask.shape[1]
    pos = torch.arange(t)[None, :]
    candidates = loss_mask & (pos >= 1) & (pos + block_size - 1 < lengths[:, None])
    return candidates.sum(dim=1).clamp(max=num_anchors)


def pack(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, lengths: torch.Tensor, block_size: int, num_anchors: int
) -> Packed:
    """input_ids, loss_mask: [n, T] right-padded host tensors; lengths: [n]. Runs on the host, where the
    number of blocks is known without a device synchronisation."""
    n, t = input_ids.shape
    pos_grid = torch.arange(t)[None, :].expand(n, t)
    real = pos_grid < lengths[:, None]  # [n, T]
    token_index = real.reshape(-1).nonzero().squeeze(1)
    doc = torch.arange(n)[:, None].expand(n, t).reshape(-1)[token_index]
    pos = pos_grid.reshape(-1)[token_index]
    mask = loss_mask.reshape(-1)[token_index]
    candidates = mask & (pos >= 1) & (pos + block_size - 1 < lengths[doc])
    pin = torch.cuda.is_available()

    def host(x: torch.Tensor) -> torch.Tensor:
        return x.pin_memory() if pin else x

    return Packed(
        token_index=host(token_index),
        input_ids=host(input_ids.reshape(-1)[token_index]),
        loss_mask=host(mask),
        doc=host(doc),
        pos=host(pos),
        candidates=host(candidates),
        num_blocks=int(row_blocks(loss_mask, lengths, block_size, num_anchors).sum()),
    )


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
    anchors: torch.Tensor  # [V] long: packed index of each block's anchor, ascending
    doc: torch.Tensor  # [V] long: the sequence of each block
    tokens: torch.Tensor  # [V, B] long: anchor token, then mask tokens
    positions: torch.Tensor  # [V, B] long: a .. a+B-1 (positions inside the sequence, for RoPE)
    labels: torch.Tensor  # [V, B-1] long
    label_mask: torch.Tensor  # [V, B-1] bool

    @property
    def block_size(self) -> int:
        return self.tokens.shape[-1]


def anchor_generator(seed: int, step: int, micro: int, part: int, device: torch.device) -> torch.Generator:
    """A stateless RNG for pass `part` of micro-batch `micro` (rank * grad_accum + its index on the rank)
    of update `step`: the anchors (and noise) of that pass, on any world size and after a resume."""
    g = torch.Generator(device=device)
    g.manual_seed((((seed * 1_000_003 + step) * 1_013 + micro) * 4_099 + part) % (2**63 - 1))
    return g


def sample_blocks(
    packed: Packed, block_size: int, num_anchors: int, mask_token_id: int, generator: torch.Generator
) -> Blocks:
    """Random anchors, at most `num_anchors` per sequence, without a host synchronisation: candidates
    are ordered by (sequence, random score); the first `num_anchors` of each sequence are kept."""
    device = packed.input_ids.device
    length = packed.input_ids.shape[0]
    score = torch.rand(length, generator=generator, device=device, dtype=torch.float64)  # [L] in [0, 1)
    key = packed.doc.double() * 4 + torch.where(packed.candidates, score, torch.full_like(score, 2.0))
    order = key.argsort()  # sequence-major; within a sequence candidates first, in random order
    starts = torch.zeros_like(packed.doc).scatter_reduce(0, packed.doc, torch.arange(length, device=device),
                                                          reduce="amin", include_self=False)
    rank = torch.arange(length, device=device) - starts[packed.doc]  # each sequence keeps its own span
    keep = (rank < num_anchors) & packed.candidates[order]
    # exactly V kept entries; with V = 0 one placeholder block without labels keeps every rank's graph alike
    chosen = keep.float().topk(max(packed.num_blocks, 1), sorted=False).indices
    anchors = order[chosen].sort().values  # [V]

    offsets = torch.arange(block_size, device=device)
    label_index = (anchors[:, None] + offsets[1:]).clamp(max=length - 1)  # [V, B-1]: inside the anchor's sequence
    tokens = torch.full((anchors.shape[0], block_size), mask_token_id, dtype=packed.input_ids.dtype, device=device)
    tokens[:, 0] = packed.input_ids[anchors]
    return Blocks(
        anchors=anchors,
        doc=packed.doc[anchors],
        tokens=tokens,
        positions=packed.pos[anchors][:, None] + offsets,
        labels=packed.input_ids[label_index],
        label_mask=packed.loss_mask[label_index] & packed.candidates[anchors][:, None],
    )
