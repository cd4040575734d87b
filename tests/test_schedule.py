"""The LR at updates 1, 2, W, W+1 and the end; the noise schedule; never the peak first."""

import math

import pytest

from blockdraft.config import NoiseConfig, OptimConfig
from blockdraft.schedule import lr_at, noise_std_at


def test_warmup_starts_at_peak_over_w_not_zero_and_not_peak():
    cfg = OptimConfig(lr=6e-4, min_lr_ratio=0.0)
    w, total = 40, 1000
    assert lr_at(1, cfg, total, w) == pytest.approx(6e-4 / 40)
    assert lr_at(2, cfg, total, w) == pytest.approx(6e-4 * 2 / 40)
    assert lr_at(w, cfg, total, w) == pytest.approx(6e-4)
    assert lr_at(w + 1, cfg, total, w) == pytest.approx(6e-4 * 0.5 * (1 + math.cos(math.pi / (total - w))))
    assert lr_at(total, cfg, total, w) == pytest.approx(0.0, abs=1e-12)


def test_cosine_floor_and_constant():
    cfg = OptimConfig(lr=1.0, min_lr_ratio=0.1)
    assert lr_at(100, cfg, 100, 10) == pytest.approx(0.1)
    assert lr_at(55, cfg, 100, 10) == pytest.approx(0.55)
    const = OptimConfig(lr=1.0, schedule="constant")
    assert lr_at(50, const, 100, 10) == 1.0


def test_noise_warmup_then_cosine_to_final():
    cfg = NoiseConfig(std=0.2, warmup_steps=10, schedule="cosine", final_std=0.05)
    assert noise_std_at(1, cfg, 110) == pytest.approx(0.02)
    assert noise_std_at(10, cfg, 110) == pytest.approx(0.2)
    assert noise_std_at(60, cfg, 110) == pytest.approx(0.125)
    assert noise_std_at(110, cfg, 110) == pytest.approx(0.05)
    assert noise_std_at(5, NoiseConfig(), 100) == 0.0
