"""The bucket order of an epoch, and the measures of how well an order mixes the buckets.

Stride scheduling: bucket b with n_b of the epoch's N slots gets slots spaced N/n_b apart from a
random offset (each jittered by up to half a spacing), so every update is a small stratified sample
of the length mix, each bucket's consumed fraction tracks the epoch's progress, all buckets end
together, and no bucket appears more than `max_same_bucket_run` times in a row (across update and
epoch boundaries too) whenever the counts allow it; when one bucket is too big for that, runs are
kept to the smallest length the counts allow. The doctor reads logs with the same measures.
"""

from __future__ import annotations

import math

import numpy as np

JITTER = 0.5
"""Largest shift of a batch's ideal slot, in slot spacings: breaks the fixed cycle, never drifts."""


def run_bound(counts: list[int], max_run: int) -> int:
    """The smallest bound that holds within every epoch and across their boundaries: a bucket with c
    of N slots, whose previous epoch may end on a full run of it, needs runs of c / (N - c)."""
    total = sum(counts)
    needed = max((math.ceil(c / (total - c)) if c < total else c for c in counts if c), default=1)
    return max(max_run, needed)


def _feasible(remaining: list[int], last: int, run: int, bound: int) -> bool:
    """Can `remaining` still be laid out with no run over `bound`, given the current trailing run?"""
    rest = sum(remaining)
    return all(c <= bound * (rest - c + 1) - (run if b == last else 0) for b, c in enumerate(remaining) if c)


def interleave(
    counts: list[int], rng: np.random.Generator, max_run: int, tail: tuple[int, int] | None = None
) -> np.ndarray:
    """Stride-scheduled bucket sequence with counts[b] slots of bucket b and bounded same-bucket runs.

    Bucket b's k-th batch has the ideal slot (k + u_b + j_bk) * N / counts[b] (u_b its random offset,
    j_bk its jitter); the lowest ideal slot goes next unless that would break the run bound now or
    later. `tail` = (bucket, run) that the previous epoch ended with: the bound holds across the
    boundary (with one bucket only, no bound can: it is raised by the least the tail needs).
    """
    total = sum(counts)
    bound = run_bound(counts, max_run)
    remaining = list(counts)
    stride = [total / c if c else math.inf for c in counts]
    offset = rng.random(len(counts)).tolist()
    jitter = [rng.uniform(-JITTER, JITTER, c).tolist() for c in counts]
    priority = rng.permutation(len(counts)).tolist()
    taken = [0] * len(counts)
    last, run = tail if tail is not None else (-1, 0)
    while not _feasible(remaining, last, run, bound):
        bound += 1
    out = np.empty(total, dtype=np.int32)
    for t in range(total):
        candidates = sorted((stride[b] * (taken[b] + offset[b] + jitter[b][taken[b]]), priority[b], b)
                            for b in range(len(counts)) if remaining[b])
        choice = candidates[0][2]
        for _, _, b in candidates:
            if b == last and run >= bound:
                continue
            remaining[b] -= 1
            ok = _feasible(remaining, b, run + 1 if b == last else 1, bound)
            remaining[b] += 1
            if ok:
                choice = b
                break
        run = run + 1 if choice == last else 1
        last = choice
        remaining[choice] -= 1
        taken[choice] += 1
        out[t] = choice
    return out


def homogeneous(counts: list[int], rng: np.random.Generator) -> np.ndarray:
    """The seed's order, kept for ablations: buckets one after another, in random order."""
    order = rng.permutation(len(counts))
    return np.concatenate([np.full(counts[b], b, dtype=np.int32) for b in order] or [np.zeros(0, np.int32)])


def longest_run(seq: np.ndarray) -> int:
    """The longest run of equal consecutive values."""
    if len(seq) == 0:
        return 0
    change = np.flatnonzero(np.diff(seq) != 0)
    edges = np.concatenate([[-1], change, [len(seq) - 1]])
    return int(np.diff(edges).max())


def tail_run(seq: np.ndarray) -> tuple[int, int]:
    last = int(seq[-1])
    differs = np.flatnonzero(seq != last)
    return last, len(seq) - (int(differs[-1]) + 1 if len(differs) else 0)


def lag1_autocorr(x: np.ndarray) -> float:
    if len(x) < 3:
        return 0.0
    a, b = x[:-1].astype(np.float64), x[1:].astype(np.float64)
    if a.std() == 0 or b.std() == 0:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])


def update_mix(seq: np.ndarray, update_size: int) -> dict[str, float | int]:
    """How the updates of a global bucket sequence mix the buckets: the share of updates holding 2 or
    more buckets, the mean over updates of the largest bucket's share of its micro-batches, and the
    longest same-bucket run in micro-batches (across update boundaries)."""
    updates = seq[: len(seq) - len(seq) % update_size].reshape(-1, update_size)
    largest = [np.bincount(u).max() for u in updates]
    multi = [len(np.unique(u)) >= 2 for u in updates]
    return {
        "share_multi_bucket": round(float(np.mean(multi)), 4) if len(updates) else 0.0,
        "mean_max_bucket_share": round(float(np.mean(largest)) / update_size, 4) if len(updates) else 1.0,
        "max_same_bucket_run": longest_run(seq),
    }


def drain_lag(seq: np.ndarray, counts: list[int], update_size: int) -> float:
    """Largest gap, at any update boundary, between a bucket's consumed fraction of its micro-batches
    and the epoch's progress: small when every bucket drains in step with the epoch."""
    onehot = np.zeros((len(seq), len(counts)))
    onehot[np.arange(len(seq)), seq] = 1
    ends = np.arange(update_size, len(seq) + 1, update_size) - 1
    consumed = onehot.cumsum(0)[ends] / np.maximum(np.asarray(counts), 1)[None]
    return float(np.abs(consumed - ((ends + 1) / len(seq))[:, None]).max()) if len(ends) else 0.0
