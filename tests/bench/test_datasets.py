"""Which length profiles a bench measures, and the samples each takes: synthetic, or the user's files."""

import argparse
import re

import numpy as np
import pytest

from blockdraft.bench.datasets import PROFILES, bench_dataset, bench_profiles
from blockdraft.bench.measure import first_anchored
from blockdraft.bench.synthetic import SyntheticDataset
from blockdraft.errors import UserError


def bench_args(lengths: str | None = None, data: list[str] | None = None) -> argparse.Namespace:
    return argparse.Namespace(lengths=lengths, data=data, steps=2, warmup=1, micro_batch=2, seq_len=128,
                              mix_median=60.0, mix_sigma=0.5)


@pytest.mark.parametrize("lengths, data, profiles", [
    (None, None, ["full", "mix"]),  # no files: the synthetic pair
    (None, ["a.jsonl"], ["data"]),  # files brought, and no --lengths: theirs alone
    ("mix, data", ["a.jsonl"], ["mix", "data"]),
    ("full", None, ["full"]),
])
def test_profiles_default_to_the_data_a_user_brings(lengths, data, profiles):
    assert bench_profiles(bench_args(lengths, data)) == profiles
    assert set(profiles) <= set(PROFILES)


@pytest.mark.parametrize("lengths, data, message", [
    ("data", None, "--lengths data measures your training files"),
    ("full,mix", ["a.jsonl"], "--data is measured as the data profile: add it to --lengths (e.g. full,mix,data)"),
    ("short", None, "--lengths takes full, mix and/or data, not 'short'"),
    (",", None, "--lengths takes full, mix and/or data"),
])
def test_profiles_a_bench_cannot_measure_are_a_user_error(lengths, data, message):
    with pytest.raises(UserError, match=re.escape(message)):
        bench_profiles(bench_args(lengths, data))


def test_synthetic_profiles_draw_enough_samples_and_data_is_the_prepared_dataset():
    mix = bench_dataset("mix", bench_args(), 512, 1, None)
    assert isinstance(mix, SyntheticDataset) and len(mix) == 4096 and mix.lengths.max() <= 128
    prepared = argparse.Namespace(dataset=object())  # a UserData's dataset is passed on as it is
    assert bench_dataset("data", bench_args("data", ["a.jsonl"]), 512, 1, prepared) is prepared.dataset


class Chats:
    """Two samples: the first answer (8 tokens) shorter than a block of 16, the second (30) longer."""

    masks = [np.r_[np.zeros(30, bool), np.ones(8, bool)], np.r_[np.zeros(4, bool), np.ones(30, bool)]]

    def __len__(self) -> int:
        return len(self.masks)

    def sample(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(len(self.masks[i]), np.int32), self.masks[i]


def test_the_fast_vs_plain_check_takes_the_first_sample_with_a_block_to_draft():
    assert first_anchored(Chats(), 16, 1024) == 1
    assert first_anchored(Chats(), 4, 1024) == 0
    assert first_anchored(Chats(), 16, 20) == 1  # its anchor at 4 keeps its block inside 20 tokens
    assert first_anchored(Chats(), 16, 10) is None
