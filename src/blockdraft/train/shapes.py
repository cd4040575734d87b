"""Shape classes: every compiled pass has one packed context length C (the run's token budget) and
a block count V padded up to one of a few classes, so a length mix stops compiling new graphs once the
warm-up (HotPath.warm_up) has run every class.

Why pad rather than only mark the dimensions dynamic: dynamo already turns a dimension symbolic when
its size changes (automatic dynamic shapes), but a compiled graph still guards on facts a size gives
it: the flex-attention kernels' divisibility by their 128-wide tiles, size 1, and the size ranges in
which inductor chose a reduction or indexing strategy (for example `V*B <= 1024` or `>= 4097`), and any
of them can fail for the first time after hours: a recompile stall late in a run. With one context
length and a few block counts, the graphs a run can need are those of its classes, all known at start,
so the warm-up compiles every one of them. The padding costs little where it
is cheap and is kept fine where it is not:
  context  always C = the token budget rounded up to 256: a padded context token costs only the fusion
           fc and the layers' k/v projections (about 5% of a target token's forward), and no block
           sees it (its sequence id is its own), so flex attention skips its tiles. Micro-batches cut
           to equal FLOPs can hold far fewer tokens than the budget (2,260 of 6,144 at the median on
           the 8B bench's mix), and then this costs several percent of the step;
  blocks   multiples of 128 query tokens (128 // B blocks); how many classes: as many as the ladder of
           ratio 2^(1/8) would give the run's passes; where: fitted to the run's plan (`fitted`), the
           classes that pad its passes' block counts least. A filler block costs what a real block
           costs in the drafter's layers (not the lm_head: it has no label). The ladder alone put 4.4%
           filler blocks into the 8B bench's mix and 4.7% at full length (1,024 blocks in a class of
           1,072); fitted, 0.5% and none, with as many classes.
Padding never changes the update: filler context is invisible to every real block, filler blocks
have no label (train/blocks.py), so loss and gradients are those of the unpadded pass.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

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


def fit_sizes(counts: Sequence[int], classes: int, quantum: int) -> tuple[int, ...]:
    """At most `classes` sizes, multiples of `quantum`, the largest covering max(counts), that pad
    these counts (each to the smallest size >= it) least in total. Dynamic programming over the
    distinct counts rounded up to the quantum, since an optimal size always sits on one of them:
    least[j] = the least padding of values[..j] with m sizes, the last one values[j]."""
    rounded = -(-np.maximum(np.asarray(counts, dtype=np.int64), 1) // quantum) * quantum
    values, weights = np.unique(rounded, return_counts=True)  # [n] ascending, [n]
    n = len(values)
    if n == 0 or classes < 1:
        return ()
    cum_w = np.concatenate([[0], np.cumsum(weights)])  # [n + 1]
    cum_v = np.concatenate([[0], np.cumsum(weights * values)])  # [n + 1]
    first, last = np.arange(n)[:, None], np.arange(n)[None, :]
    group = np.where(first <= last, values * (cum_w[last + 1] - cum_w[first]) - (cum_v[last + 1] - cum_v[first]),
                     np.inf)  # [n, n]: padding of values[i..j] to values[j]
    least = group[0]  # [n], one size
    before = []  # per further size, [n]: the last value of the sizes before it
    for _ in range(1, min(classes, n)):
        total = least[:-1, None] + group[1:]  # [n - 1, n]: values[..i] as before, values[i+1..j] to values[j]
        before.append(total.argmin(axis=0))
        least = total.min(axis=0)
    sizes, j = [int(values[-1])], n - 1
    for prev in reversed(before):
        j = int(prev[j])
        sizes.append(int(values[j]))
    return tuple(sorted(sizes))


@dataclass(frozen=True)
class ShapeClasses:
    """The classes of one run: `context(L)` and `blocks(V)` give the padded sizes of a pass."""

    block_size: int
    context_size: int  # C, a multiple of CONTEXT_QUANTUM
    block_ratio: float
    block_sizes: tuple[int, ...] = ()  # fitted to a plan (`fitted`), ascending; () or above them: the ladder

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
        i = bisect.bisect_left(self.block_sizes, count)
        return self.block_sizes[i] if i < len(self.block_sizes) else self.ladder(count)

    def ladder(self, count: int) -> int:
        """The class of ratio `block_ratio` for this block count."""
        return size_class(max(count, 1), self.block_quantum, self.block_ratio)

    def fitted(self, pass_blocks: Sequence[int]) -> ShapeClasses:
        """These classes with the block sizes fitted to a run's passes (their block counts): as many
        sizes as the ladder would use for them, placed where they pad least."""
        used = len({self.ladder(v) for v in pass_blocks})
        return replace(self, block_sizes=fit_sizes(pass_blocks, used, self.block_quantum))
