"""Robust statistics the detectors share: block medians, per-bucket trend fits, runs, slopes.

Everything is O(n) or O(n log n) numpy so a million-step log stays within the time budget; medians
rather than means so a spike or a bad bucket cannot drag the baseline it is judged against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

MAD_TO_SIGMA = 1.4826
MAX_LONG_JUMPS = 20000  # bucket changes whose jump is measured as a median of 5 rows each side
SEPARATION = 2.0
MIN_SHARE = 0.03
MAX_LEVELS = 4
FIT_ROWS = 20000  # a fixed random subsample of rows fits the mixture: as good, and bounded in time


def finite_median(x: np.ndarray) -> float:
    """nanmedian, or NaN when x holds no finite value (without numpy's all-NaN warning)."""
    return float(np.nanmedian(x)) if np.isfinite(x).any() else math.nan


def typical_step_time(step_time: np.ndarray) -> float:
    """Typical seconds per update: the median positive step_time, NaN without one. The offline and the
    live checkpoint-stall checks and late_recompile's lost time are judged against this same number."""
    return finite_median(np.where(np.isfinite(step_time) & (step_time > 0), step_time, np.nan))


def block_medians(x: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Medians of consecutive blocks of `size` (NaN-aware) and each block's centre index.

    A remainder shorter than half a block joins the last full block: a block of one or two rows
    has a median equal to its own values, which would pin the level (and zero the scale) at the end.
    """
    n = len(x)
    if n == 0:
        return np.zeros(0), np.zeros(0)
    size = max(1, min(size, n))
    full = n // size
    rest = n - full * size
    if full >= 2 and 0 < rest < size / 2:
        full -= 1
        rest += size
    with np.errstate(all="ignore"):
        meds = nanmedian_rows(x[: full * size].reshape(full, size))
    centres = np.arange(full) * size + (size - 1) / 2.0
    if rest:
        meds = np.append(meds, finite_median(x[full * size :]))
        centres = np.append(centres, full * size + (rest - 1) / 2.0)
    return meds, centres


def nanmedian_rows(rows: np.ndarray) -> np.ndarray:
    """The median of each row ignoring NaN, NaN for a row without a finite value (and no warning)."""
    if np.isfinite(rows).all():
        return np.median(rows, axis=1)
    out = np.full(len(rows), np.nan)
    ok = np.isfinite(rows).any(axis=1)
    if ok.any():
        out[ok] = np.nanmedian(rows[ok], axis=1)
    return out


def smooth_trend(x: np.ndarray, size: int, extrapolate: bool = True) -> np.ndarray:
    """A robust running level of `x`: block medians, a 3-block median, linear interpolation back
    (extrapolated at both ends, so the steep first steps of a run are not judged against a flat level;
    a scale must not be, or its falling tail reaches the floor and every last row looks extreme)."""
    n = len(x)
    meds, centres = block_medians(x, size)
    ok = np.isfinite(meds)
    if not ok.any():
        return np.full(n, np.nan)
    meds, centres = meds[ok], centres[ok]
    if len(meds) >= 3:
        meds = np.median(sliding_window_view(np.pad(meds, 1, mode="edge"), 3), axis=1)
    level = np.interp(np.arange(n), centres, meds)
    if extrapolate and len(meds) >= 2:
        rows = np.arange(n)
        head, tail = rows < centres[0], rows > centres[-1]
        level[head] = meds[0] + (rows[head] - centres[0]) * (meds[1] - meds[0]) / (centres[1] - centres[0])
        level[tail] = meds[-1] + (rows[tail] - centres[-1]) * (meds[-1] - meds[-2]) / (centres[-1] - centres[-2])
    return level


@dataclass
class BucketFit:
    """log-metric = trend(t) + offset[bucket] + residual, fitted robustly."""

    trend: np.ndarray
    offset: np.ndarray
    groups: np.ndarray
    labels: np.ndarray
    resid: np.ndarray
    sigma: np.ndarray


def bucket_fit(y: np.ndarray, groups: np.ndarray, size: int, segment: np.ndarray) -> BucketFit:
    """Fit log-metric = shared trend + constant offset per bucket, and a rolling MAD scale: a spike is judged
    against its own bucket's level. Offsets come from the jumps at bucket changes (the trend barely moves in one
    step), so they stay right even when buckets arrive in runs long enough for a smoother to follow them."""
    n = len(y)
    labels, inverse = np.unique(groups, return_inverse=True)
    ok = np.isfinite(y)
    offsets, known = transition_offsets(y, inverse, len(labels), segment)
    trend = smooth_trend(np.where(ok, y - offsets[inverse], np.nan), size)
    if not known.all():
        resid = y - trend
        for j in np.flatnonzero(~known):
            sel = (inverse == j) & ok
            if sel.sum() >= 10:
                offsets[j] += float(np.median(resid[sel] - offsets[j]))
        trend = smooth_trend(np.where(ok, y - offsets[inverse], np.nan), size)
    offset = offsets[inverse] if n else np.zeros(0)
    resid = y - trend - offset
    sigma = MAD_TO_SIGMA * smooth_trend(np.abs(resid), max(size * 8, 200), extrapolate=False)
    floor = max(1e-3, 0.2 * (np.nanmedian(sigma) if np.isfinite(sigma).any() else 1e-3))
    sigma = np.maximum(np.nan_to_num(sigma, nan=floor), floor)
    return BucketFit(trend=trend, offset=offset, groups=inverse, labels=labels, resid=resid, sigma=sigma)


def transition_offsets(
    y: np.ndarray, groups: np.ndarray, k: int, segment: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per-group level offsets (weighted mean 0) from the median jump at each change of group within a segment.

    Returns the offsets and which groups were pinned down by enough transitions.
    """
    offsets = np.zeros(k)
    starts, lengths, values = runs(groups)
    if k < 2 or len(y) < 3 or len(starts) < 2:
        return offsets, np.ones(k, dtype=bool)
    known = np.zeros(k, dtype=bool)
    a, b = values[:-1], values[1:]
    right = starts[1:]
    left_end = right - 1
    jump = y[right] - y[left_end]
    long_both = (lengths[:-1] >= 5) & (lengths[1:] >= 5)
    for i in np.flatnonzero(long_both)[:MAX_LONG_JUMPS]:
        r = right[i]
        jump[i] = np.nanmedian(y[r : r + 5]) - np.nanmedian(y[r - 5 : r])
    good = np.isfinite(jump) & (segment[right] == segment[left_end])
    a, b, jump = a[good], b[good], jump[good]
    pair = a * k + b
    order = np.argsort(pair, kind="stable")
    a, b, jump = a[order], b[order], jump[order]
    first, times, _ = runs(pair[order])
    first, times = first[times >= 2], times[times >= 2]  # changes from a to b seen at least twice
    if not len(first):
        return offsets, known
    rows = np.zeros((len(first), k))
    rows[np.arange(len(first)), b[first]] = 1.0
    rows[np.arange(len(first)), a[first]] = -1.0
    rhs = np.array([np.median(jump[f : f + t]) for f, t in zip(first, times, strict=True)])
    weights = np.sqrt(times)
    mat = rows * weights[:, None]
    vec = rhs * weights
    counts = np.bincount(groups[np.isfinite(y)], minlength=k).astype(float)
    involved = rows.any(axis=0)
    share = np.where(involved, counts, 0.0)
    share = share / share.sum() if share.sum() > 0 else share
    mat = np.vstack([mat, share * len(rows)])
    vec = np.append(vec, 0.0)
    solution, *_ = np.linalg.lstsq(mat, vec, rcond=None)
    offsets[involved] = solution[involved]
    known[involved] = True
    return offsets, known


def runs(seq: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run-length encoding: (start index, length, value) of each run of equal values."""
    if not len(seq):
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    change = np.flatnonzero(seq[1:] != seq[:-1]) + 1
    starts = np.concatenate([[0], change])
    lengths = np.diff(np.concatenate([starts, [len(seq)]]))
    return starts, lengths, seq[starts]


def events(flags: np.ndarray, max_gap: int = 1) -> list[tuple[int, int]]:
    """Group flagged indices into [first, last] index ranges, merging gaps of up to `max_gap`."""
    idx = np.flatnonzero(flags)
    if not len(idx):
        return []
    cut = np.flatnonzero(np.diff(idx) > max_gap + 1)
    firsts = np.concatenate([[idx[0]], idx[cut + 1]])
    lasts = np.concatenate([idx[cut], [idx[-1]]])
    return list(zip(firsts.tolist(), lasts.tolist(), strict=True))


def slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope over a subsample: epochs and progress are smooth, so this is enough."""
    if len(x) < 2:
        return math.nan
    idx = np.linspace(0, len(x) - 1, num=min(len(x), 2000)).astype(int)
    xs, ys = x[idx], y[idx]
    if np.ptp(xs) == 0:
        return math.nan
    return float(np.polyfit(xs, ys, 1)[0])


def _finite_pairs(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = np.isfinite(x) & np.isfinite(y)
    return x[ok], y[ok]


def theil_sen(x: np.ndarray, y: np.ndarray) -> float:
    """Median of pairwise slopes: a trend that a few outlying blocks cannot bend."""
    x, y = _finite_pairs(x, y)
    if len(x) < 3:
        return float("nan")
    i, j = np.triu_indices(len(x), k=1)
    dx = x[j] - x[i]
    good = dx != 0
    return float(np.median((y[j] - y[i])[good] / dx[good]))


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    x, y = _finite_pairs(x, y)
    if len(x) < 3:
        return float("nan")
    rx = np.argsort(np.argsort(x)).astype(float)
    ry = np.argsort(np.argsort(y)).astype(float)
    if rx.std() == 0 or ry.std() == 0:
        return 0.0
    return float(np.corrcoef(rx, ry)[0, 1])


@dataclass
class Levels:
    """Distinct levels of a series: each row's level (0 = lowest) and each level's mean."""

    labels: np.ndarray
    means: np.ndarray


def mixture_levels(x: np.ndarray) -> Levels | None:
    """A 1-D Gaussian mixture chosen by BIC; None unless it finds >= 2 well separated levels: adjacent levels at
    Ashman's D = sqrt(2) |mu_a - mu_b| / sqrt(sd_a^2 + sd_b^2) >= SEPARATION (2 bounds a clearly bimodal pair),
    each holding MIN_SHARE of the rows, so that a heavy-tailed or skewed single mode (which a mixture also fits
    better than one Gaussian, with a narrow and a wide component) does not count as several."""
    ok = np.flatnonzero(np.isfinite(x))
    if len(ok) < 100:
        return None
    rng = np.random.default_rng(0)
    fit_rows = ok if len(ok) <= FIT_ROWS else np.sort(rng.choice(ok, size=FIT_ROWS, replace=False))
    v = x[fit_rows]
    best: tuple[float, np.ndarray, np.ndarray, np.ndarray] | None = None
    lo, hi = np.quantile(v, (0.01, 0.99))
    for k in range(1, MAX_LEVELS + 1):
        starts = (np.quantile(v, (np.arange(k) + 0.5) / k), np.linspace(lo, hi, k))
        w, mu, sd, ll = max((_em(v, start) for start in starts), key=lambda fit: fit[3])
        bic = -2.0 * ll + (3 * k - 1) * math.log(len(v))
        ashman = math.sqrt(2.0) * np.diff(mu) / np.sqrt(sd[1:] ** 2 + sd[:-1] ** 2)
        separated = k == 1 or (bool(np.all(ashman >= SEPARATION)) and bool(np.all(w >= MIN_SHARE)))
        if separated and (best is None or bic < best[0] - 10.0):
            best = (bic, w, mu, sd)
    if best is None or len(best[1]) < 2:
        return None
    _, w, mu, sd = best
    labels = np.full(len(x), -1, dtype=np.int64)
    labels[ok] = np.argmax(_log_resp(x[ok], w, mu, sd), axis=1)
    return Levels(labels=labels, means=mu)


def _log_resp(v: np.ndarray, w: np.ndarray, mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
    z = (v[:, None] - mu[None, :]) / sd[None, :]
    return np.log(w)[None, :] - np.log(sd)[None, :] - 0.5 * z * z


def _em(v: np.ndarray, start: np.ndarray, iters: int = 60) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """EM for a 1-D Gaussian mixture from the given starting means; components sorted by mean."""
    k = len(start)
    mu = start.astype(float)
    sd = np.full(k, max(float(np.std(v)) / k, 1e-6))
    w = np.full(k, 1.0 / k)
    ll = -math.inf
    for _ in range(iters):
        lr = _log_resp(v, w, mu, sd)
        top = lr.max(axis=1, keepdims=True)
        resp = np.exp(lr - top)
        total = resp.sum(axis=1, keepdims=True)
        ll = float(np.sum(np.log(total) + top) - 0.5 * len(v) * math.log(2 * math.pi))
        resp /= total
        nk = resp.sum(axis=0) + 1e-12
        w = nk / len(v)
        mu = (resp * v[:, None]).sum(axis=0) / nk
        sd = np.sqrt((resp * (v[:, None] - mu[None, :]) ** 2).sum(axis=0) / nk)
        sd = np.maximum(sd, 1e-4 + 1e-3 * float(np.std(v)))
    order = np.argsort(mu)
    return w[order], mu[order], sd[order], ll
