"""Length buckets, token-budget micro-batches, and an epoch order in which all buckets drain together.

Why: grouping samples by length saves padding, but ordering the resulting batches bucket by bucket
(or shuffling them freely when one bucket dominates) gives long runs of long batches, and the loss
goes multimodal ("gradient whiplash": the seed incident). Here:
- inside a bucket, samples are sorted by length (ties broken at random each epoch) and cut into
  micro-batches of at most `tokens_per_batch` PADDED tokens, so padding is tiny and the number of
  batches is the same every epoch;
- the epoch's order is stride scheduling: bucket b with n_b of the epoch's N batches gets slots
  spaced N/n_b apart from a random offset (each slot jittered by up to half a spacing), so each
  bucket's consumed fraction tracks the epoch's progress (within a few batches) and all end
  together, and no bucket appears more than `max_same_bucket_run` times in a row (across epoch
  boundaries too) whenever the counts allow it; when one bucket is too big for that, runs are kept
  to the smallest length the counts allow and `describe()` warns;
- with data parallelism the schedule runs over groups of `world_size` batches of one bucket, and
  rank r takes the r-th batch of each group: all ranks see the same bucket at the same step (a
  bucket's batch count is rounded up to a multiple of world_size by repeating a few batches).
Everything is a pure function of (lengths, config, seed, epoch), which makes resumption exact. A
position saved at one world size moves to another at the same fraction of its epoch (`carry_over`).
"""

from __future__ import annotations

import hashlib
import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from blockdraft.errors import UserError

if TYPE_CHECKING:
    from blockdraft.config import DataConfig

AUTO_BUCKETS = 6
JITTER = 0.5
"""Largest shift of a batch's ideal slot, in slot spacings: breaks the fixed cycle, never drifts."""


@dataclass(frozen=True)
class PlannedBatch:
    """One micro-batch of this rank: which samples, from which bucket, at which place of the epoch."""

    epoch: int
    index: int
    bucket: int
    sample_ids: np.ndarray
    real_tokens: int
    padded_tokens: int


def auto_cuts(lengths: np.ndarray, n_buckets: int = AUTO_BUCKETS) -> list[int]:
    """Cut points giving about `n_buckets` buckets of equal total tokens (so about equal batch counts)."""
    s = np.sort(lengths.astype(np.int64))
    cum = np.cumsum(s)
    cuts = set()
    for k in range(1, n_buckets):
        idx = int(np.searchsorted(cum, cum[-1] * k / n_buckets))
        cuts.add(int(s[min(idx, len(s) - 1)]))
    return sorted(c for c in cuts if c > s[0])


def bucket_cuts(lengths: np.ndarray, buckets: list[int] | str) -> list[int]:
    if buckets == "auto":
        return auto_cuts(lengths)
    return sorted({int(b) for b in buckets if int(b) > 0})


def pack_sorted(sorted_lengths: np.ndarray, budget: int) -> np.ndarray:
    """Batch boundaries over ascending lengths: a batch grows while count * longest <= budget.

    A sample longer than the budget forms a batch on its own.
    """
    bounds = [0]
    start = 0
    for j, length in enumerate(sorted_lengths.tolist()):
        if j > start and (j - start + 1) * length > budget:
            bounds.append(j)
            start = j
    bounds.append(len(sorted_lengths))
    return np.asarray(bounds, dtype=np.int64)


def run_bound(counts: list[int], max_run: int) -> int:
    """The smallest bound that holds within every epoch and across their boundaries: a bucket with c
    of N slots, whose previous epoch may end on a full run of it, needs runs of c / (N - c)."""
    total = sum(counts)
    needed = max((math.ceil(c / (total - c)) if c < total else c for c in counts if c), default=1)
    return max(max_run, needed)


def _feasible(remaining: list[int], last: int, run: int, bound: int) -> bool:
    """Can `remaining` still be laid out with no run over `bound`, given the current trailing run?"""
    rest = sum(remaining)
    for b, c in enumerate(remaining):
        if c and c > bound * (rest - c + 1) - (run if b == last else 0):
            return False
    return True


def interleave(
    counts: list[int], rng: np.random.Generator, max_run: int, tail: tuple[int, int] | None = None
) -> np.ndarray:
    """Stride-scheduled bucket sequence with counts[b] slots of bucket b and bounded same-bucket runs.

    Bucket b's k-th batch has the ideal slot (k + u_b + j_bk) * N / counts[b]: u_b is the bucket's
    random offset, j_bk a jitter of at most half a stride that does not accumulate (so the order is
    not one fixed cycle repeated, yet no bucket drifts from its share). The lowest ideal slot goes
    next unless that would exceed the run bound or make the rest impossible to lay out within it.
    `tail` = (bucket, run) that the previous epoch ended with: the run bound holds across the boundary
    (with one bucket only, no bound can: it is raised by the least the tail needs).
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
        candidates = sorted(
            (stride[b] * (taken[b] + offset[b] + jitter[b][taken[b]]), priority[b], b)
            for b in range(len(counts))
            if remaining[b]
        )
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


class BatchSampler:
    """This rank's micro-batches, epoch after epoch, with an exact resumable position."""

    def __init__(self, lengths: np.ndarray, cfg: DataConfig, seed: int, rank: int = 0, world_size: int = 1):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if len(self.lengths) == 0:
            raise UserError("no samples to batch")
        self.cfg = cfg
        self.seed = int(seed)
        self.rank = rank
        self.world_size = world_size
        self.budget = cfg.tokens_per_batch
        cuts = bucket_cuts(self.lengths, cfg.buckets)
        raw = np.searchsorted(np.asarray(cuts, dtype=np.int64), self.lengths, side="right")
        used = np.unique(raw)
        self.bucket_of = np.searchsorted(used, raw).astype(np.int32)
        edges = [0, *cuts, None]
        self.edges = [(edges[k], edges[k + 1]) for k in used.tolist()]
        self.members: list[np.ndarray] = []
        self.bounds: list[np.ndarray] = []
        for b in range(len(used)):
            idx = np.flatnonzero(self.bucket_of == b)
            self.members.append(idx)
            self.bounds.append(pack_sorted(np.sort(self.lengths[idx]), self.budget))
        self.batch_counts = [len(bd) - 1 for bd in self.bounds]
        self.group_counts = [math.ceil(n / world_size) for n in self.batch_counts]
        self.batches_per_epoch = sum(self.group_counts)
        self.bound = run_bound(self.group_counts, cfg.max_same_bucket_run) if cfg.interleave else None
        self.fingerprint = self._fingerprint(world_size)
        self._schedules: dict[int, np.ndarray] = {}
        self._plans: dict[int, list[PlannedBatch]] = {}
        self._lock = threading.RLock()  # the prefetch thread plans while the main thread describes
        self.epoch = 0
        self.index = 0

    def _fingerprint(self, world_size: int) -> str:
        h = hashlib.blake2b(self.lengths.astype(np.int64).tobytes(), digest_size=12)
        options = (self.cfg.buckets, self.budget, self.cfg.max_same_bucket_run, self.cfg.interleave)
        h.update(repr((options, self.seed, world_size)).encode())
        return h.hexdigest()

    def _rng(self, epoch: int, stream: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, epoch, stream])

    def schedule(self, epoch: int) -> np.ndarray:
        """Bucket of each step of `epoch`; epoch e continues the run that epoch e-1 ended with."""
        with self._lock:
            return self._schedule(epoch)

    def _schedule(self, epoch: int) -> np.ndarray:
        if epoch in self._schedules:
            return self._schedules[epoch]
        if not self.cfg.interleave:
            seq = homogeneous(self.group_counts, self._rng(epoch, 1))
        else:
            done = [e for e in self._schedules if e < epoch]
            start = max(done) + 1 if done else 0
            tail = tail_run(self._schedules[start - 1]) if start > 0 else None
            for e in range(start, epoch + 1):
                seq = interleave(self.group_counts, self._rng(e, 1), self.cfg.max_same_bucket_run, tail)
                tail = tail_run(seq)
                self._remember(self._schedules, e, seq)
        self._remember(self._schedules, epoch, seq)
        return seq

    @staticmethod
    def _remember(cache: dict, epoch: int, value: Any) -> None:
        """Keep the three epochs used last: the current one, its neighbours."""
        cache.pop(epoch, None)
        cache[epoch] = value
        while len(cache) > 3:
            del cache[next(iter(cache))]

    def _global_batches(self, epoch: int) -> list[list[np.ndarray]]:
        """Per bucket, this epoch's batches in their order of use, padded to a multiple of world_size.

        Padding repeats the bucket's first batches, so every rank has the same number of steps.
        """
        rng = self._rng(epoch, 0)
        out = []
        for idx, bounds, groups in zip(self.members, self.bounds, self.group_counts, strict=True):
            order = idx[np.lexsort((rng.random(len(idx)), self.lengths[idx]))]
            batches = [order[bounds[k] : bounds[k + 1]] for k in range(len(bounds) - 1)]
            perm = np.resize(rng.permutation(len(batches)), groups * self.world_size)
            out.append([batches[k] for k in perm])
        return out

    def plan(self, epoch: int) -> list[PlannedBatch]:
        """This rank's batches of `epoch`, in order."""
        with self._lock:
            return self._plan(epoch)

    def _plan(self, epoch: int) -> list[PlannedBatch]:
        if epoch in self._plans:
            return self._plans[epoch]
        per_bucket = self._global_batches(epoch)
        taken = [0] * len(per_bucket)
        plan = []
        for index, b in enumerate(self._schedule(epoch).tolist()):
            ids = per_bucket[b][taken[b] * self.world_size + self.rank]
            taken[b] += 1
            lens = self.lengths[ids]
            plan.append(PlannedBatch(epoch, index, b, ids, int(lens.sum()), int(lens.max()) * len(ids)))
        self._remember(self._plans, epoch, plan)
        return plan

    def next(self) -> PlannedBatch:
        """The batch at the current position; then advance (epochs follow each other forever)."""
        batch = self.plan(self.epoch)[self.index]
        self.index += 1
        if self.index == self.batches_per_epoch:
            self.epoch, self.index = self.epoch + 1, 0
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index, "fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("fingerprint") != self.fingerprint:
            raise UserError(
                "the data or batching settings changed since this checkpoint (sampler fingerprint differs); "
                "resume with the same data, seed, world size and data settings"
            )
        epoch, index = int(state["epoch"]), int(state["index"])
        if not 0 <= index < self.batches_per_epoch or epoch < 0:
            raise UserError(f"sampler state out of range: epoch {epoch}, index {index}")
        self.epoch, self.index = epoch, index

    def carry_over(self, state: dict[str, Any], world_size: int) -> dict[str, Any]:
        """A position saved by a run of `world_size` ranks, for this one: unchanged at the same world
        size; otherwise the same epoch at the same fraction of it, in this world size's plan (the
        plans differ, so a few of this epoch's samples may be seen twice or not at all)."""
        if world_size == self.world_size:
            return state
        if state.get("fingerprint") != self._fingerprint(world_size):
            self.load_state_dict(state)  # raises the data-changed error
        saved_batches = sum(math.ceil(n / world_size) for n in self.batch_counts)
        index = min(self.batches_per_epoch - 1, round(int(state["index"]) * self.batches_per_epoch / saved_batches))
        return {"epoch": int(state["epoch"]), "index": index, "fingerprint": self.fingerprint}

    def describe(self, epochs: int = 2) -> dict[str, Any]:
        """The batch plan as printed at start, logged as the `data` record, and given by `data --json`."""
        seqs = [self.schedule(e) for e in range(epochs)]
        plan = self.plan(0)
        per_bucket = self._global_batches(0)
        total_real = int(self.lengths.sum())
        padded = [sum(len(b) * int(self.lengths[b].max()) for b in bucket) for bucket in per_bucket]
        buckets = []
        for b, (lo, hi) in enumerate(self.edges):
            lens = self.lengths[self.members[b]]
            buckets.append(
                {
                    "lo": lo,
                    "hi": hi if hi is not None else int(lens.max()) + 1,
                    "samples": len(lens),
                    "batches": self.group_counts[b] * self.world_size,
                    "token_share": round(float(lens.sum()) / total_real, 4),
                    "min_len": int(lens.min()),
                    "max_len": int(lens.max()),
                }
            )
        real_all = sum(int(self.lengths[b].sum()) for bucket in per_bucket for b in bucket)
        seq_lens = np.asarray([p.padded_tokens // len(p.sample_ids) for p in plan])
        warnings = []
        if self.bound is not None and self.bound > self.cfg.max_same_bucket_run:
            warnings.append(
                f"one bucket holds too many batches for runs of {self.cfg.max_same_bucket_run}; "
                f"runs are bounded by {self.bound} instead (use finer buckets)"
            )
        return {
            "buckets": buckets,
            "batches": self.batches_per_epoch * self.world_size,
            "batches_per_rank": self.batches_per_epoch,
            "world_size": self.world_size,
            "tokens_per_batch": self.budget,
            "interleave": self.cfg.interleave,
            "max_same_bucket_run": longest_run(np.concatenate(seqs)),
            "run_bound": self.bound,
            "length_autocorr_lag1": round(lag1_autocorr(seq_lens), 4),
            "pad_frac": round(1.0 - real_all / max(1, sum(padded)), 4),
            "warnings": warnings,
        }
