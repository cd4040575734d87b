"""Shape classes: every compiled pass has one packed context length C (the run's token budget) and
a block count V padded up to a bounded ladder, so a length mix stops compiling new graphs once the
warm-up (HotPath.warm_up) has run every class.

Why pad rather than only mark the dimensions dynamic: dynamo already turns a dimension symbolic when
its size changes (automatic dynamic shapes), but a compiled graph still guards on facts a size gives
it: the flex-attention kernels' divisibility by their 128-wide tiles, size 1, and the size ranges in
which inductor chose a reduction or indexing strategy (for example `V*B <= 1024` or `>= 4097`), and any
of them can fail for the first time after hours: a recompile stall late in a run. With one context
length and a ladder of block counts, the graphs a run can need are those of the ladder's rungs, few
and all known at start, so the warm-up compiles every one of them. The padding costs little where it
is cheap and is kept fine where it is not:
  context  always C = the token budget rounded up to 256: a padded context token costs only the fusion
           fc and the layers' k/v projections (about 5% of a target token's forward), and no block
           sees it (its sequence id is its own), so flex attention skips its tiles. Micro-batches cut
           to equal FLOPs can hold far fewer tokens than the budget (2,260 of 6,144 at the median on
           the 8B bench's mix), and then this costs several percent of the step;
  blocks   multiples of 128 query tokens (128 // B blocks), then a ratio of 2^(1/8): a filler block
           costs what a real block costs in the drafter's layers (not the lm_head: it has no label).
Padding never changes the update: filler context is invisible to every real block, filler blocks
have no label (train/blocks.py), so loss and gradients are those of the unpadded pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from blockdraft.config import BLOCK_CLASS_RATIO
from blockdraft.model.masks import TILE

CONTEXT_QUANTUM = 2 * TILE


def size_class(n: int, quantum: int, ratio: float) -> int:
    """The smallest class >= n (n >= 1) of the ladder c_0 = quantum, c_{i+1} = max(c_i + quantum,
    c_i * ratio rounded up to a multiple of quantum): linear while the ratio's step is under one
    quantum, geometric above. ratio 1 gives plain multiples of quantum."""
    c = quantum
    while c < n:
        c = max(c + quantum, math.ceil(c * ratio / quantum) * quantum)
    return c


@dataclass(frozen=True)
class ShapeClasses:
    """The classes of one run: `context(L)` and `blocks(V)` give the padded sizes of a pass."""

    block_size: int
    context_size: int  # C, a multiple of CONTEXT_QUANTUM
    block_ratio: float

    @classmethod
    def for_budget(cls, block_size: int, tokens_per_batch: int, block_ratio: float = BLOCK_CLASS_RATIO) -> ShapeClasses:
        return cls(block_size, size_class(tokens_per_batch, CONTEXT_QUANTUM, 1.0), block_ratio)

    @property
    def block_quantum(self) -> int:
        """Blocks per 128 query tokens (at least 1): V*B stays a multiple of the tile when B divides it."""
        return max(1, TILE // self.block_size)

    def context(self, length: int) -> int:
        """C; a pass longer than the budget (one sequence over it) is rounded up to CONTEXT_QUANTUM."""
        return max(self.context_size, size_class(max(length, 1), CONTEXT_QUANTUM, 1.0))

    def blocks(self, count: int) -> int:
        return size_class(max(count, 1), self.block_quantum, self.block_ratio)
