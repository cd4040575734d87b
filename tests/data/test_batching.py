"""Batching properties: coverage, budgets, cost balance, run bound, even drain, mixed updates, determinism,
resume (at another split of the same update size too), rank-major updates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockdraft.bench.shapes import SHAPES
from blockdraft.config import DataConfig, load_config
from blockdraft.data.batching import BatchSampler, apportion, batch_cost
from blockdraft.data.cost import SampleCosts, flop_costs
from blockdraft.data.interleave import longest_run
from blockdraft.errors import UserError
from tests.data.test_interleave import DRAIN_TOLERANCE, bucket_positions

SEED_BOUNDARIES = [0, 770, 1216, 1728, 2432, 3296, 8192]


def seed_like_lengths(n: int, rng: np.random.Generator) -> np.ndarray:
    """The incident's shape: most samples short, a long tail up to 8192."""
    return np.concatenate(
        [
            rng.integers(40, 770, int(n * 0.7)),
            rng.integers(770, 3296, int(n * 0.25)),
            rng.integers(3296, 8192, n - int(n * 0.7) - int(n * 0.25)),
        ]
    )


def seed_skew_lengths(n: int, rng: np.random.Generator) -> np.ndarray:
    """The seed's boundaries with one bucket (770-1216) holding about half of the micro-batches."""
    shares = [0.25, 0.55, 0.10, 0.05, 0.03, 0.02]
    edges = list(zip(SEED_BOUNDARIES[:-1], SEED_BOUNDARIES[1:], strict=True))
    parts = [rng.integers(max(lo, 40), hi, int(n * s)) for (lo, hi), s in zip(edges, shares, strict=True)]
    return np.concatenate(parts)


def qwen3_8b_costs(lengths: np.ndarray) -> SampleCosts:
    """FLOPs of the published Qwen3-8B recipe (configs/qwen3-8b.yaml), every token an assistant token."""
    cls, shape = SHAPES["qwen3-8b"]
    cfg = load_config("configs/qwen3-8b.yaml")
    candidates = np.maximum(lengths - cfg.drafter.block_size, 0)
    return flop_costs(lengths, candidates, candidates * (candidates + 1) / 2, cls(**shape), cfg,
                      cfg.drafter.target_layer_ids)


lengths_st = st.lists(st.integers(1, 600), min_size=1, max_size=300).map(lambda x: np.asarray(x))
cfg_st = st.builds(
    DataConfig,
    buckets=st.one_of(st.just("auto"), st.lists(st.integers(0, 600), max_size=6)),
    tokens_per_batch=st.integers(1, 2000),
    max_same_bucket_run=st.integers(1, 4),
)


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_st, cfg=cfg_st, seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 3))
def test_every_sample_once_per_epoch_within_budget(lengths, cfg, seed, epoch):
    sampler = BatchSampler(lengths, cfg, seed)
    plan = sampler.plan(epoch)
    assert len(plan) == sampler.batches_per_epoch
    ids = np.concatenate([p.sample_ids for p in plan])
    assert np.array_equal(np.sort(ids), np.arange(len(lengths)))
    for p in plan:
        lens = lengths[p.sample_ids]
        assert p.padded_tokens == len(lens) * lens.max()
        assert p.real_tokens == lens.sum()
        assert p.padded_tokens <= cfg.tokens_per_batch or len(lens) == 1
        assert np.all(sampler.bucket_of[p.sample_ids] == p.bucket)
    assert [p.index for p in plan] == list(range(len(plan)))


def test_seed_incident_distribution_is_interleaved():
    rng = np.random.default_rng(7)
    lengths = seed_like_lengths(20_000, rng)
    cfg = DataConfig(buckets=SEED_BOUNDARIES, tokens_per_batch=16384, max_len=8192)
    sampler = BatchSampler(lengths, cfg, seed=3)
    described = sampler.describe()
    assert described["max_same_bucket_run"] <= 3
    assert abs(described["length_autocorr_lag1"]) < 0.35
    assert described["pad_frac"] < 0.01
    assert abs(sum(b["token_share"] for b in described["buckets"]) - 1) < 1e-3
    seq = sampler.schedule(0)
    assert bucket_positions(seq, sampler.slot_counts).max() <= DRAIN_TOLERANCE
    homogeneous = BatchSampler(lengths, cfg.model_copy(update={"interleave": False}), seed=3).describe()
    assert homogeneous["length_autocorr_lag1"] > 0.8
    assert homogeneous["max_same_bucket_run"] == max(b["batches"] for b in homogeneous["buckets"])


def test_auto_buckets_hold_equal_token_shares():
    lengths = seed_like_lengths(20_000, np.random.default_rng(1))
    described = BatchSampler(lengths, DataConfig(tokens_per_batch=8192), seed=0).describe()
    shares = [b["token_share"] for b in described["buckets"]]
    assert len(shares) == 6
    assert max(shares) - min(shares) < 0.02
    batches = [b["batches"] for b in described["buckets"]]
    assert max(batches) < 1.5 * min(batches)  # long samples pack less tightly into 8192 tokens


@settings(max_examples=30, deadline=None)
@given(lengths=lengths_st, cfg=cfg_st, seed=st.integers(0, 1000))
def test_deterministic_and_epochs_differ_but_keep_batch_count(lengths, cfg, seed):
    a, b = BatchSampler(lengths, cfg, seed), BatchSampler(lengths, cfg, seed)
    for epoch in (0, 1, 2):
        pa, pb = a.plan(epoch), b.plan(epoch)
        assert len(pa) == a.batches_per_epoch
        assert [(p.bucket, p.sample_ids.tolist()) for p in pa] == [(p.bucket, p.sample_ids.tolist()) for p in pb]
    assert sum(p.padded_tokens for p in a.plan(0)) == sum(p.padded_tokens for p in a.plan(1))


def test_epochs_reshuffle():
    lengths = np.random.default_rng(0).integers(1, 400, 500)
    sampler = BatchSampler(lengths, DataConfig(tokens_per_batch=800), seed=0)
    orders = [np.concatenate([p.sample_ids for p in sampler.plan(e)]) for e in range(3)]
    assert not np.array_equal(orders[0], orders[1])
    assert not np.array_equal(orders[1], orders[2])


def test_run_bound_holds_across_epoch_boundaries():
    lengths = np.random.default_rng(2).integers(1, 300, 3000)
    cfg = DataConfig(tokens_per_batch=600, max_same_bucket_run=2)
    sampler = BatchSampler(lengths, cfg, seed=5)
    assert sampler.bound == 2
    seqs = [sampler.schedule(e) for e in range(6)]
    assert longest_run(np.concatenate(seqs)) <= 2
    fresh = BatchSampler(lengths, cfg, seed=5)  # jumping straight to epoch 4 gives the same order
    assert np.array_equal(fresh.schedule(4), seqs[4])


@settings(max_examples=30, deadline=None)
@given(lengths=lengths_st, cfg=cfg_st, seed=st.integers(0, 1000), steps=st.integers(0, 400))
def test_resume_mid_epoch_gives_the_same_batches(lengths, cfg, seed, steps):
    run = BatchSampler(lengths, cfg, seed)
    for _ in range(steps):
        run.next()
    state = run.state_dict()
    expected = [run.next() for _ in range(5)]
    resumed = BatchSampler(lengths, cfg, seed)
    resumed.load_state_dict(state)
    got = [resumed.next() for _ in range(5)]
    assert [(p.epoch, p.index, p.sample_ids.tolist()) for p in got] == [
        (p.epoch, p.index, p.sample_ids.tolist()) for p in expected
    ]


def test_resume_with_other_data_is_refused():
    cfg = DataConfig(tokens_per_batch=100)
    state = BatchSampler(np.arange(1, 50), cfg, 0).state_dict()
    with pytest.raises(UserError, match="changed"):
        BatchSampler(np.arange(1, 51), cfg, 0).load_state_dict(state)


@settings(max_examples=30, deadline=None)
@given(lengths=lengths_st, cfg=cfg_st, seed=st.integers(0, 1000), world=st.integers(1, 4), accum=st.integers(1, 3))
def test_ranks_take_their_rank_major_share_of_every_update_and_cover_the_data(lengths, cfg, seed, world, accum):
    samplers = [BatchSampler(lengths, cfg, seed, rank=r, world_size=world, grad_accum=accum) for r in range(world)]
    plans = [s.plan(1) for s in samplers]
    assert {len(p) for p in plans} == {samplers[0].updates_per_epoch * accum}
    slots = samplers[0].global_plan(1)
    for r, plan in enumerate(plans):
        for p in plan:
            update, within = divmod(p.index, accum)
            slot = update * world * accum + r * accum + within
            assert p.bucket == slots[slot][0] and np.array_equal(p.sample_ids, slots[slot][1])
    seen = np.concatenate([p.sample_ids for plan in plans for p in plan])
    assert set(seen.tolist()) == set(range(len(lengths)))
    distinct = {tuple(p.sample_ids.tolist()) for plan in plans for p in plan}
    assert len(distinct) == sum(samplers[0].batch_counts)
    padding = world * len(plans[0]) - sum(samplers[0].batch_counts)
    assert padding == -sum(samplers[0].batch_counts) % (world * accum)
    described = samplers[0].describe()
    assert described["batches"] == world * samplers[0].batches_per_epoch


@settings(max_examples=30, deadline=None)
@given(lengths=lengths_st, cfg=cfg_st, seed=st.integers(0, 1000), size=st.integers(1, 6))
def test_the_updates_do_not_depend_on_how_they_split_into_ranks_and_accumulation(lengths, cfg, seed, size):
    """Every (world_size, grad_accum) with the same product plans the very same updates."""
    splits = [(w, size // w) for w in range(1, size + 1) if size % w == 0]
    updates = set()
    for world, accum in splits:
        plans = [BatchSampler(lengths, cfg, seed, rank=r, world_size=world, grad_accum=accum).plan(0)
                 for r in range(world)]
        per_update = []
        for u in range(len(plans[0]) // accum):
            per_update.append(tuple(tuple(p.sample_ids.tolist()) for plan in plans
                                    for p in plan[u * accum:(u + 1) * accum]))
        updates.add(tuple(per_update))
    assert len(updates) == 1


def test_cost_balanced_micro_batches_cost_alike_across_buckets_within_the_token_budget():
    """Under a padded-token budget a micro-batch of short samples costs several times one of long samples
    (each short one brings up to 512 blocks); cut by cost, micro-batches of every bucket cost alike."""
    lengths = seed_skew_lengths(20_000, np.random.default_rng(7))
    costs = qwen3_8b_costs(lengths)
    cfg = DataConfig(buckets=SEED_BOUNDARIES[1:-1], tokens_per_batch=16384, max_len=8192)

    def bucket_medians(sampler: BatchSampler) -> np.ndarray:
        plan = sampler.plan(0)
        return np.asarray([np.median([batch_cost(p.sample_ids, costs) for p in plan if p.bucket == b])
                           for b in range(len(sampler.edges))])

    by_tokens = bucket_medians(BatchSampler(lengths, cfg, seed=3))
    sampler = BatchSampler(lengths, cfg, seed=3, costs=costs)
    by_cost = bucket_medians(sampler)
    assert by_tokens.max() / by_tokens.min() > 3
    assert by_cost.max() / by_cost.min() < 1.2
    for p in sampler.plan(0):
        assert p.padded_tokens <= cfg.tokens_per_batch
        assert p.cost <= sampler.cost_budget or len(p.sample_ids) == 1
    described = sampler.describe()
    assert described["batch_cost"] == "flops" and described["cost_cv"] < 0.1
    assert described["rank_wait_predicted"] == 0.0  # one rank waits for nobody


@pytest.mark.parametrize("world", [2, 4, 8, 16])
def test_every_update_mixes_the_buckets_of_the_seed_skew(world):
    """The issue's targets at world size 8, and at the others: >= 90% of updates hold 2+ buckets, no
    bucket runs more than 3 micro-batches in a row, each bucket drains within 2% of the epoch."""
    lengths = seed_skew_lengths(20_000, np.random.default_rng(7))
    cfg = DataConfig(buckets=SEED_BOUNDARIES[1:-1], tokens_per_batch=16384, max_len=8192)
    sampler = BatchSampler(lengths, cfg, seed=3, world_size=world, costs=qwen3_8b_costs(lengths))
    described = sampler.describe()
    shares = [b["batches"] / described["batches"] for b in described["buckets"]]
    assert 0.45 < max(shares) < 0.6  # the seed's skew: one bucket holds about half
    mix = described["update_mix"]
    if world >= 4:
        assert mix["share_multi_bucket"] >= 0.9
    assert mix["max_same_bucket_run"] <= 3 and described["max_same_bucket_run"] <= 3
    assert mix["mean_max_bucket_share"] < max(shares) + 1.5 / world  # each update is close to the whole mix
    assert described["drain_lag"] <= 0.02
    assert described["rank_wait_predicted"] <= 0.1
    assert described["warnings"] == []


def test_the_seed_order_makes_one_bucket_updates_and_the_plan_says_so():
    lengths = seed_skew_lengths(5_000, np.random.default_rng(1))
    cfg = DataConfig(buckets=SEED_BOUNDARIES[1:-1], tokens_per_batch=16384, max_len=8192, interleave=False)
    described = BatchSampler(lengths, cfg, seed=0, world_size=8).describe()
    mixed = described["update_mix"]["share_multi_bucket"] * described["updates_per_epoch"]
    assert round(mixed) <= len(described["buckets"]) - 1  # only updates across a bucket boundary mix
    assert described["update_mix"]["mean_max_bucket_share"] > 0.95


@settings(max_examples=30, deadline=None)
@given(lengths=lengths_st, cfg=cfg_st, seed=st.integers(0, 1000), updates=st.integers(0, 60))
def test_a_position_moves_between_splits_of_one_update_size_to_the_same_update(lengths, cfg, seed, updates):
    """Saved by 2 ranks x 1 micro-batch, resumed on 1 rank x 2 (and back): the very next update."""
    two = [BatchSampler(lengths, cfg, seed, rank=r, world_size=2) for r in (0, 1)]
    one = BatchSampler(lengths, cfg, seed, world_size=1, grad_accum=2)
    for _ in range(updates):
        for s in two:
            s.next()
    state = two[0].state_dict()
    one.load_state_dict(one.carry_over(state, 2))
    expected = [s.next().sample_ids.tolist() for s in two]
    assert [one.next().sample_ids.tolist() for _ in range(2)] == expected
    back = BatchSampler(lengths, cfg, seed, rank=1, world_size=2)
    back.load_state_dict(back.carry_over(one.state_dict(), 1))
    assert back.next().sample_ids.tolist() == two[1].next().sample_ids.tolist()


def test_apportion_splits_in_proportion():
    assert apportion(4, [10, 5, 5]) == [2, 1, 1]
    assert apportion(1, [2, 1]) == [1, 0] and apportion(2, [1, 1, 1]) == [1, 1, 0]
    assert sum(apportion(7, [3, 1, 9, 4])) == 7
    assert apportion(0, [4, 4]) == [0, 0]
