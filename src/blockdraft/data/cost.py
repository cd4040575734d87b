"""What a micro-batch costs, from its samples alone: the number the batch plan cuts micro-batches by.

Why: every rank waits for the slowest at the all-reduce, and equal padded tokens are not equal time:
a short sequence brings up to `num_anchors` blocks for few context tokens, a long one few blocks for
many. With the model FLOPs of `model/flops.py`, a micro-batch of n rows padded to width T costs
  n * row(T)             the frozen target's forward over the padded batch
  + sum_i work(sample i) the drafter over sample i's context, blocks and labels (linear, so additive;
                         the context a block sees is taken at its expectation, as `blockdraft bench` does)
`token_costs` is the padded-token rule (row(T) = T, no per-sample term).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from blockdraft.model.flops import Dims, DraftWork, drafter_flops, target_flops

if TYPE_CHECKING:
    from blockdraft.config import Config
    from blockdraft.data.cache import Samples

SCAN_TOKENS = 1 << 22
"""Loss-mask tokens scanned at once when counting anchor candidates (bounds the scan's memory)."""


@dataclass(frozen=True)
class SampleCosts:
    """Per sample i: `row[i]` the target's cost of one row of width len_i, `work[i]` the drafter's
    cost of sample i. A batch of ascending samples s..j costs (j - s + 1) * row[j] + sum(work[s..j])."""

    kind: str
    row: np.ndarray  # [N] float64
    work: np.ndarray  # [N] float64


def token_costs(lengths: np.ndarray) -> SampleCosts:
    """Cost = padded tokens: the plan of a padded-token budget."""
    lengths = np.asarray(lengths, dtype=np.float64)
    return SampleCosts("tokens", lengths, np.zeros_like(lengths))


def can_anchor(loss_mask: Any, pos: Any, length: Any, block_size: int) -> Any:
    """The anchor rule, elementwise on numpy arrays or torch tensors alike: a loss position a >= 1 whose
    whole block fits in its sequence (a + B - 1 < length). train/blocks.py and the costs here use it."""
    return loss_mask & (pos >= 1) & (pos + block_size - 1 < length)


def anchor_candidates(dataset: Samples, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per sample: (count of anchor candidates, sum of their positions)."""
    n = len(dataset.lengths)
    counts, pos_sums = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.float64)
    start = 0
    while start < n:
        stop = int(np.searchsorted(dataset.offsets, dataset.offsets[start] + SCAN_TOKENS, side="right")) - 1
        stop = min(n, max(stop, start + 1))
        lo, hi = int(dataset.offsets[start]), int(dataset.offsets[stop])
        lengths = dataset.lengths[start:stop].astype(np.int64)
        doc = np.repeat(np.arange(stop - start), lengths)  # [tokens]
        pos = np.arange(hi - lo) - (dataset.offsets[start:stop].astype(np.int64) - lo)[doc]
        cand = can_anchor(np.asarray(dataset.mask[lo:hi]), pos, lengths[doc], block_size)
        counts[start:stop] = np.bincount(doc, weights=cand, minlength=stop - start).astype(np.int64)
        pos_sums[start:stop] = np.bincount(doc, weights=cand * pos, minlength=stop - start)
        start = stop
    return counts, pos_sums


def blocks_per_sample(
    candidates: np.ndarray, num_anchors: int, anchors_per_token: float | None, answer_tokens: np.ndarray | None,
) -> np.ndarray:
    """[N] blocks per sample (float64): min(candidates, num_anchors, and with a density ceil(density x
    answer tokens), at least 1). train/blocks.py counts a batch's blocks with it."""
    blocks = np.minimum(candidates, num_anchors).astype(np.float64)
    if anchors_per_token is not None and answer_tokens is not None:
        blocks = np.minimum(blocks, np.maximum(np.ceil(answer_tokens * anchors_per_token - 1e-9), 1))
    return blocks


def _linear_terms(fn: Any, arity: int) -> list[float]:
    """Coefficients of a linear function without intercept: its values at the unit vectors."""
    return [fn(*[1 if k == j else 0 for k in range(arity)]) for j in range(arity)]


def flop_costs(
    lengths: np.ndarray, candidates: np.ndarray, candidate_pos_sums: np.ndarray, hf_cfg: Any, cfg: Config,
    layer_ids: list[int], answer_tokens: np.ndarray | None = None,
) -> SampleCosts:
    """Model FLOPs of each sample (training: forward and backward of the drafter, forward of the target
    up to its last tapped layer) for the run `cfg` on the target whose HF config is `hf_cfg`;
    `answer_tokens` (loss tokens per sample) is needed with `train.anchors_per_token`."""
    d, b = cfg.drafter, cfg.drafter.block_size
    target = Dims.of(hf_cfg)
    # the drafter (drafter_config): the target's attention shape, dense MLPs, full attention in every layer
    drafter = replace(target, intermediate=d.intermediate_size or target.intermediate, mlp_per_layer=(),
                      window_per_layer=())
    lengths = np.asarray(lengths, dtype=np.int64)
    widths, inverse = np.unique(lengths, return_inverse=True)
    per_width = np.asarray([target_flops([int(t)], target, max(layer_ids) + 1) for t in widths])
    c_len, c_blocks, c_seen, c_labels = _linear_terms(
        lambda *w: drafter_flops(DraftWork(*w), drafter, d.num_layers, len(layer_ids), b, hf_cfg.vocab_size), 4)
    blocks = blocks_per_sample(candidates, cfg.train.num_anchors, cfg.train.anchors_per_token, answer_tokens)
    seen = blocks * candidate_pos_sums / np.maximum(candidates, 1)
    work = c_len * lengths + c_blocks * blocks + c_seen * seen + c_labels * blocks * (b - 1)
    return SampleCosts("flops", per_width[inverse], work)


def answer_tokens(dataset: Samples) -> np.ndarray:
    """[N] loss tokens of each sample."""
    starts = np.asarray(dataset.offsets[:-1], dtype=np.int64)
    return np.add.reduceat(dataset.mask, starts, dtype=np.int64) if len(dataset.mask) else starts * 0


def dataset_costs(dataset: Samples, hf_cfg: Any, cfg: Config, layer_ids: list[int],
                  candidates: tuple[np.ndarray, np.ndarray] | None = None) -> SampleCosts:
    """The run's cost per sample, per `data.batch_cost`; `candidates`: `anchor_candidates`, if scanned already."""
    if cfg.data.batch_cost == "tokens":
        return token_costs(dataset.lengths)
    counts, pos_sums = candidates or anchor_candidates(dataset, cfg.drafter.block_size)
    answers = answer_tokens(dataset) if cfg.train.anchors_per_token is not None else None
    return flop_costs(dataset.lengths, counts, pos_sums, hf_cfg, cfg, layer_ids, answers)


def dataset_blocks(dataset: Samples, cfg: Config,
                   candidates: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """[N] blocks each sample brings to a pass, as `train.blocks.row_blocks` counts a batch's."""
    counts, _ = candidates or anchor_candidates(dataset, cfg.drafter.block_size)
    return blocks_per_sample(counts, cfg.train.num_anchors, cfg.train.anchors_per_token, answer_tokens(dataset))
