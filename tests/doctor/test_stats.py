import numpy as np

from blockdraft.doctor import stats


def test_runs_and_events():
    starts, lengths, values = stats.runs(np.array([1, 1, 2, 2, 2, 1]))
    assert starts.tolist() == [0, 2, 5] and lengths.tolist() == [2, 3, 1] and values.tolist() == [1, 2, 1]
    flags = np.zeros(20, dtype=bool)
    flags[[2, 3, 5, 15]] = True
    assert stats.events(flags, max_gap=1) == [(2, 5), (15, 15)]


def test_bucket_fit_recovers_offsets_even_with_long_runs():
    rng = np.random.default_rng(0)
    groups = np.repeat(rng.integers(0, 3, 60), 80)
    t = np.arange(len(groups))
    true = np.array([-0.3, 0.0, 0.4])
    y = np.log(1 + 5 * np.exp(-t / 800)) + true[groups] + 0.05 * rng.standard_normal(len(t))
    fit = stats.bucket_fit(y, groups, 25, segment=np.zeros(len(y), dtype=np.int64))
    got = np.array([fit.offset[groups == g][0] for g in range(3)])
    assert np.allclose(got - got.mean(), true - true.mean(), atol=0.03)
    assert abs(np.median(fit.sigma) - 0.05) < 0.02


def test_theil_sen_ignores_an_outlier():
    x = np.arange(20.0)
    y = 2 * x
    y[5] = 500
    assert stats.theil_sen(x, y) == 2.0


def test_mixture_levels_finds_the_seed_trimodal_loss_and_not_a_heavy_tail():
    rng = np.random.default_rng(0)
    bucket = rng.choice(6, size=3000, p=(0.08, 0.10, 0.09, 0.11, 0.10, 0.52))
    x = np.log(np.array([1.0, 1.0, 1.7, 1.7, 2.6, 1.0]))[bucket] + 0.08 * rng.standard_normal(3000)
    levels = stats.mixture_levels(x)
    assert levels is not None and len(levels.means) == 3
    np.testing.assert_allclose(np.exp(levels.means - levels.means[0]), [1.0, 1.7, 2.6], rtol=0.05)
    np.testing.assert_allclose(np.bincount(levels.labels, minlength=3) / len(x), [0.70, 0.20, 0.10], atol=0.03)
    assert (levels.labels == np.array([0, 0, 1, 1, 2, 0])[bucket]).mean() > 0.99
    assert stats.mixture_levels(0.1 * rng.standard_t(3, 5000)) is None
    assert stats.mixture_levels(np.log(rng.lognormal(0, 0.3, 5000) + rng.exponential(0.3, 5000))) is None
