"""bench/cost_vs_time.py: its statistics, and the rebuild of a log's updates from the batch plan."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from blockdraft.config import build_config
from blockdraft.data.batching import BatchSampler

_spec = importlib.util.spec_from_file_location("cost_vs_time", Path(__file__).parents[2] / "bench" / "cost_vs_time.py")
cvt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cvt)


def test_ranks_share_ties_and_spearman_sees_monotone_relations():
    assert cvt.ranks(np.array([10.0, 20.0, 20.0, 5.0])).tolist() == [2.0, 3.5, 3.5, 1.0]
    x = np.arange(1.0, 9.0)
    assert cvt.spearman(x, np.exp(x)) == pytest.approx(1.0)
    assert cvt.pearson(x, np.exp(x)) < 0.9


def test_fits_recover_the_line_whatever_the_scale_of_the_columns():
    x = np.array([1e12, 2e12, 3e12, 5e12])
    fit = cvt.linear_fit(x, 0.1 + 2e-14 * x)
    assert (fit["a"], fit["b"], fit["r2"]) == pytest.approx((0.1, 2e-14, 1.0))
    assert fit["median_abs_rel_err"] == pytest.approx(0.0, abs=1e-9)
    passes = np.array([1, 3, 2, 3])
    multi = cvt.multi_fit({"flops": x, "passes": passes}, 0.01 + 1e-14 * x + 0.04 * passes)
    assert multi["intercept"] == pytest.approx(0.01)
    assert (multi["coef"]["flops"], multi["coef"]["passes"]) == pytest.approx((1e-14, 0.04))


def test_binned_spread_group_wait_and_new_shapes():
    bins = cvt.binned_spread(np.arange(10.0), np.arange(10.0) + 1, 2)
    assert [b["n"] for b in bins] == [5, 5] and bins[0]["y_median"] == 3.0
    assert cvt.group_wait(np.array([1.0, 1.0, 1.0, 3.0, 9.0]), 2) == pytest.approx((0 + 1 / 3) / 2)
    assert cvt.new_shape_counts([[(2, 5), (2, 5)], [(2, 5), (1, 7)], [(1, 7)]]) == [1, 1, 0]


def test_a_logged_update_is_found_and_rebuilt_from_the_plan():
    rng = np.random.default_rng(0)
    lengths = rng.integers(8, 120, 300)
    cfg = build_config({"target": {"path": "unused"}, "data": {"tokens_per_batch": 512}}).data
    sampler = BatchSampler(lengths, cfg, seed=3, world_size=2, grad_accum=2)
    blocks = np.minimum(lengths // 2, 20)
    steps = []
    for epoch in (0, 1):
        plan = sampler.global_plan(epoch)
        for u in range(sampler.updates_per_epoch):
            slots = plan[u * 4 : (u + 1) * 4]
            steps.append({"epoch": epoch, "epoch_progress": (2 * u + 2) / sampler.batches_per_epoch,
                          "samples": sum(len(ids) for _, ids in slots),
                          "seq_len_max": int(max(lengths[ids].max() for _, ids in slots)),
                          "tokens": int(sum(lengths[ids].sum() for _, ids in slots)), "buckets": [b for b, _ in slots]})
    positions = [cvt.step_position(s, sampler.batches_per_epoch, sampler.grad_accum) for s in steps]
    assert positions[sampler.updates_per_epoch] == (1, 0)
    rows = cvt.update_rows(sampler, sampler.costs, blocks, 30, positions)
    assert all(r[f] == s[f] for r, s in zip(rows, steps, strict=True) for f in cvt.MATCH_FIELDS)
