"""Model FLOPs count real lengths only, and scale linearly in the drafter's work."""

import pytest

from blockdraft.model.flops import Dims, DraftWork, drafter_flops, target_flops


def test_flops_follow_real_lengths():
    dims = Dims(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128)
    # a padded sequence costs nothing extra: only real lengths enter
    assert target_flops([100, 20], dims, 3) == target_flops([100], dims, 3) + target_flops([20], dims, 3)
    one = drafter_flops(DraftWork(100, 10, 500.0, 150), dims, layers=2, taps=3, block_size=16, vocab=1000)
    two = drafter_flops(DraftWork(200, 20, 1000.0, 300), dims, layers=2, taps=3, block_size=16, vocab=1000)
    assert two == pytest.approx(2 * one)
