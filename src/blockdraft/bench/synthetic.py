"""Synthetic micro-batches for the bench, fed through the real sampler and prefetcher.

Two length profiles, both with a prompt (no loss) followed by an assistant answer:
  full  every sample exactly `seq_len` tokens, 10% prompt: the peer trainers' padded setting.
  mix   chat-like lengths: log-normal with median 900 tokens and sigma 0.8 (`--mix-median`,
        `--mix-sigma`), clipped to [64, seq_len], prompt share uniform in [5%, 40%]: what a real
        regenerated dataset looks like.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from blockdraft.data.cost import SampleCosts, flop_costs, sample_blocks, token_costs

if TYPE_CHECKING:
    from blockdraft.config import Config

MIX_MEDIAN, MIX_SIGMA, MIX_MIN = 900, 0.8, 64


class SyntheticDataset:
    """The two things the sampler and the prefetcher read: `lengths` and `sample(i)`."""

    def __init__(self, profile: str, seq_len: int, vocab_size: int, count: int, seed: int = 0,
                 median: float = MIX_MEDIAN, sigma: float = MIX_SIGMA) -> None:
        rng = np.random.default_rng(seed)
        if profile == "full":
            self.lengths = np.full(count, seq_len, dtype=np.int64)
            self.prompt = np.full(count, seq_len // 10, dtype=np.int64)
        else:
            raw = rng.lognormal(np.log(median), sigma, count)
            self.lengths = np.clip(raw, MIX_MIN, seq_len).astype(np.int64)
            self.prompt = (self.lengths * rng.uniform(0.05, 0.40, count)).astype(np.int64)
        self.vocab_size = vocab_size
        self.seed = seed

    def __len__(self) -> int:
        return len(self.lengths)

    def batch_costs(self, hf_cfg, cfg: Config, layer_ids: list[int]) -> SampleCosts:
        """The costs `blockdraft train` cuts micro-batches by (`data.batch_cost`), for these samples."""
        if cfg.data.batch_cost == "tokens":
            return token_costs(self.lengths)
        counts, pos_sums = self._candidates(cfg.drafter.block_size)
        return flop_costs(self.lengths, counts, pos_sums, hf_cfg, cfg, layer_ids, self.lengths - self.prompt)

    def blocks(self, cfg: Config) -> np.ndarray:
        """[N] blocks each sample brings to a pass, as `data.cost.dataset_blocks` counts a dataset's."""
        counts, _ = self._candidates(cfg.drafter.block_size)
        return sample_blocks(counts, cfg.train.num_anchors, cfg.train.anchors_per_token, self.lengths - self.prompt)

    def _candidates(self, block_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Anchor candidates (count, sum of positions): the answer positions a >= 1 whose block fits."""
        first = np.maximum(self.prompt, 1)
        last = self.lengths - block_size  # a + B - 1 < length
        counts = np.maximum(last - first + 1, 0)
        return counts, counts * (first + last) / 2.0

    def sample(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        n = int(self.lengths[i])
        ids = np.random.default_rng((self.seed, i)).integers(0, self.vocab_size, n, dtype=np.int64)
        mask = np.arange(n) >= self.prompt[i]
        return ids, mask
