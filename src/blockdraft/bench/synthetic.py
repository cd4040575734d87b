"""Synthetic micro-batches for the bench, fed through the real sampler and prefetcher.

Two length profiles, both with a prompt (no loss) followed by an assistant answer:
  full  every sample exactly `seq_len` tokens, 10% prompt: the peer trainers' padded setting.
  mix   chat-like lengths: log-normal with median 900 tokens and sigma 0.8 (`--mix-median`,
        `--mix-sigma`), clipped to [64, seq_len], prompt share uniform in [5%, 40%]: what a real
        regenerated dataset looks like.
"""

from __future__ import annotations

import numpy as np

MIX_MEDIAN, MIX_SIGMA, MIX_MIN = 900.0, 0.8, 64  # the bench verb's --mix-median and --mix-sigma defaults


class SyntheticDataset:
    """Random ids of a profile's lengths, with a prompt and an answer: a `data.cache.Samples`, as the
    sampler, the prefetcher and the batch costs (`data.cost`) read a tokenized dataset."""

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
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)])
        self.mask = np.arange(self.offsets[-1]) - np.repeat(self.offsets[:-1], self.lengths) >= np.repeat(
            self.prompt, self.lengths)  # [tokens]: the answer after each prompt

    def __len__(self) -> int:
        return len(self.lengths)

    def sample(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        n = int(self.lengths[i])
        ids = np.random.default_rng((self.seed, i)).integers(0, self.vocab_size, n, dtype=np.int64)
        return ids, self.mask[self.offsets[i]:self.offsets[i + 1]]
