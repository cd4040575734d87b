"""The bucket order: counts kept, runs bounded (across epochs too), every bucket drains with the epoch."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from blockdraft.data.interleave import interleave, lag1_autocorr, longest_run, run_bound, tail_run, update_mix

DRAIN_TOLERANCE = 4  # batches: offset (<1) + jitter (<0.5 each side) + slots taken by neighbours


def bucket_positions(seq: np.ndarray, counts: list[int]) -> np.ndarray:
    """Largest |consumed_b(t) - t * share_b| over the epoch, in batches."""
    onehot = np.zeros((len(seq), len(counts)))
    onehot[np.arange(len(seq)), seq] = 1
    ideal = np.arange(1, len(seq) + 1)[:, None] * np.asarray(counts)[None] / len(seq)
    return np.abs(onehot.cumsum(0) - ideal).max(axis=0)


@settings(max_examples=80, deadline=None)
@given(
    counts=st.lists(st.integers(0, 120), min_size=1, max_size=8).filter(lambda c: sum(c) > 0),
    max_run=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
    tail=st.one_of(st.none(), st.tuples(st.integers(0, 7), st.integers(1, 4))),
)
def test_interleave_bounds_runs_and_drains_evenly(counts, max_run, seed, tail):
    tail = tail if tail is None or (tail[0] < len(counts) and tail[1] <= max_run) else None
    seq = interleave(counts, np.random.default_rng(seed), max_run, tail)
    assert np.bincount(seq, minlength=len(counts)).tolist() == counts
    bound = run_bound(counts, max_run)
    assert longest_run(seq) <= bound
    if tail is not None:
        joined = np.concatenate([np.full(tail[1], tail[0]), seq])
        assert longest_run(joined) <= (bound if len([c for c in counts if c]) > 1 else sum(counts) + tail[1])
    if bound == max_run:  # feasible: every bucket stays within a few batches of its share
        assert bucket_positions(seq, counts).max() <= DRAIN_TOLERANCE


def test_infeasible_counts_get_the_smallest_possible_runs():
    counts = [50, 3, 2]  # 50 batches, 5 separators: runs of ceil(50 / 6) = 9 within one epoch, and
    seq = interleave(counts, np.random.default_rng(0), 3)  # ceil(50 / 5) = 10 if an epoch may end on one
    assert run_bound(counts, 3) == 10
    assert 9 <= longest_run(seq) <= 10


def test_a_dominant_bucket_keeps_its_bound_across_the_epoch_boundary():
    """One bucket with 94% of the batches (seen on 2 GPUs, demo target): an epoch that ends on a full
    run of it must not start with another full run."""
    counts = [18, 273]
    bound = run_bound(counts, 3)
    assert bound == 16  # ceil(273 / 18); 15 within one epoch
    for seed in range(20):
        seq = interleave(counts, np.random.default_rng(seed), 3, tail=(1, bound))
        assert longest_run(np.concatenate([np.full(bound, 1), seq])) <= bound


def test_update_mix_counts_updates_and_runs():
    seq = np.array([0, 0, 1, 1, 1, 1, 2, 0])  # updates of 2: (0,0) (1,1) (1,1) (2,0)
    assert update_mix(seq, 2) == {"share_multi_bucket": 0.25, "mean_max_bucket_share": 0.875,
                                  "max_same_bucket_run": 4}


def test_helpers():
    assert longest_run(np.array([1, 1, 2, 2, 2, 1])) == 3
    assert tail_run(np.array([0, 1, 1])) == (1, 2)
    assert lag1_autocorr(np.array([1, 2, 3, 4, 5, 6])) > 0.99
    assert lag1_autocorr(np.array([1, 9, 1, 9, 1, 9])) < -0.99
