"""Shape classes: the packed context length L and the block count V of a pass, padded up to a bounded
ladder of sizes, so a length mix stops compiling new graphs once its classes have been seen.

Why pad rather than only mark the dimensions dynamic: dynamo already turns a dimension symbolic when
its size changes (automatic dynamic shapes), but a compiled graph still guards on facts a size gives
it (the flex-attention kernels' divisibility by their 128-wide tiles, size 1, what inductor chose for
a size range), and any of them can fail for the first time after hours: a recompile stall late in a
run. Classes make those facts the same for every pass of a class (each class is a multiple of the
tile, never 1) and bound the shapes a run can ever show by the number of classes, whatever the
backend specialises. The padding costs little where it is cheap and is kept fine where it is not:
  context  multiples of 256 tokens, then a ratio of 2^(1/2) between classes: a padded context token
           costs only the fusion fc and the layers' k/v projections (about 4% of a target token), and
           no block sees it (its sequence id is its own), so flex attention skips its tiles;
  blocks   multiples of 128 query tokens (128 // B blocks), then a ratio of 2^(1/8): a filler block
           costs what a real block costs in the drafter's layers (not the lm_head: it has no label).
Padding never changes the update: filler context is invisible to every real block, filler blocks
have no label (train/blocks.py), so loss and gradients are those of the unpadded pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TILE = 128  # the flex-attention block (query and key/value tile) size


def size_class(n: int, quantum: int, ratio: float) -> int:
    """The smallest class >= n (n >= 1) of the ladder c_0 = quantum, c_{i+1} = max(c_i + quantum,
    c_i * ratio rounded up to a multiple of quantum): linear while the ratio's step is under one
    quantum, geometric above. ratio 1 gives plain multiples of quantum."""
    c = quantum
    while c < n:
        c = max(c + quantum, math.ceil(c * ratio / quantum) * quantum)
    return c


def ladder(limit: int, quantum: int, ratio: float) -> list[int]:
    """Every class up to the first one >= limit: the most shapes sizes up to `limit` can take."""
    out = [quantum]
    while out[-1] < limit:
        out.append(size_class(out[-1] + 1, quantum, ratio))
    return out


@dataclass(frozen=True)
class ShapeClasses:
    """The ladders of one run: `context(L)` and `blocks(V)` give the padded sizes of a pass."""

    block_size: int
    context_ratio: float = 2**0.5
    block_ratio: float = 2**0.125
    context_quantum: int = 256

    @property
    def block_quantum(self) -> int:
        """Blocks per 128 query tokens (at least 1): V*B stays a multiple of the tile when B divides it."""
        return max(1, TILE // self.block_size)

    def context(self, length: int) -> int:
        return size_class(max(length, 1), self.context_quantum, self.context_ratio)

    def blocks(self, count: int) -> int:
        return size_class(max(count, 1), self.block_quantum, self.block_ratio)

    def bound(self, max_context: int, max_blocks: int) -> int:
        """How many (context, blocks) class pairs passes of at most these sizes can show."""
        return (len(ladder(max_context, self.context_quantum, self.context_ratio))
                * len(ladder(max_blocks, self.block_quantum, self.block_ratio)))
