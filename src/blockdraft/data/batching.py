"""Length buckets, cost-balanced micro-batches, and an epoch of updates that each mix the buckets.

Why: ordering length-bucketed batches bucket by bucket (or shuffling freely when one bucket
dominates) gives long runs of long batches and a multimodal loss ("gradient whiplash": the seed
incident); an update whose world_size x grad_accum micro-batches come from one bucket does the same.
- inside a bucket, samples sorted by length (ties broken at random each epoch) are cut into
  micro-batches of at most `cost_budget` (data/cost.py) and `tokens_per_batch` padded tokens: little
  padding, about equal time per micro-batch, the same batch count every epoch;
- the epoch is one global sequence of micro-batches in the stride-scheduled bucket order of
  data/interleave.py, cut into updates of G = world_size x grad_accum consecutive ones, so each update
  is a small stratified sample of the length mix; rank r takes slots r*A .. r*A + A-1 of each update.
  The slot count is rounded up to a multiple of G by repeating a few batches, spread over the buckets.
Everything is a pure function of (lengths, costs, config, seed, epoch, G), not of how G splits into
ranks and accumulation: resumption is exact, at another world size too when G is the same; a position
saved at another G moves to the same fraction of its epoch (`carry_over`).
"""

from __future__ import annotations

import hashlib
import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from blockdraft.data.cost import SampleCosts, token_costs
from blockdraft.data.interleave import (
    drain_lag,
    homogeneous,
    interleave,
    lag1_autocorr,
    longest_run,
    run_bound,
    tail_run,
    update_mix,
)
from blockdraft.errors import UserError

if TYPE_CHECKING:
    from blockdraft.config import DataConfig

AUTO_BUCKETS = 6


@dataclass(frozen=True)
class PlannedBatch:
    """One micro-batch of this rank: which samples, from which bucket, at which place of the epoch
    (`index` in this rank's plan)."""

    epoch: int
    index: int
    bucket: int
    sample_ids: np.ndarray
    real_tokens: int
    padded_tokens: int
    cost: float


def bucket_cuts(lengths: np.ndarray, buckets: list[int] | str) -> list[int]:
    """The configured cut points; `auto`: about AUTO_BUCKETS buckets of equal total tokens (so about
    equal batch counts)."""
    if buckets != "auto":
        return sorted({int(b) for b in buckets if int(b) > 0})
    s = np.sort(lengths.astype(np.int64))
    cum = np.cumsum(s)
    idx = np.searchsorted(cum, cum[-1] * np.arange(1, AUTO_BUCKETS) / AUTO_BUCKETS)
    return sorted({int(c) for c in s[np.minimum(idx, len(s) - 1)] if c > s[0]})


def pack_sorted(
    lengths: np.ndarray, row: np.ndarray, work: np.ndarray, cost_budget: float, token_budget: int
) -> np.ndarray:
    """Batch boundaries over samples of ascending length: a batch of count rows grows while
    count * row[last] + sum(work) <= cost_budget and count * lengths[last] <= token_budget.

    A sample over either budget forms a batch on its own.
    """
    bounds = [0]
    start, acc = 0, 0.0
    for j, (length, r, w) in enumerate(zip(lengths.tolist(), row.tolist(), work.tolist(), strict=True)):
        count = j - start + 1
        if j > start and (count * r + acc + w > cost_budget or count * length > token_budget):
            bounds.append(j)
            start, acc = j, 0.0
        acc += w
    bounds.append(len(lengths))
    return np.asarray(bounds, dtype=np.int64)


def batch_cost(ids: np.ndarray, costs: SampleCosts) -> float:
    """Cost of one micro-batch (row cost grows with width, so the widest row sets it)."""
    return float(len(ids) * costs.row[ids].max() + costs.work[ids].sum())


def apportion(total: int, weights: list[int]) -> list[int]:
    """`total` split over `weights` in proportion (largest remainders, ties to the lower index)."""
    whole = sum(weights)
    quotas = [total * w / whole for w in weights]
    out = [math.floor(q) for q in quotas]
    for k in sorted(range(len(weights)), key=lambda k: (out[k] - quotas[k], k))[: total - sum(out)]:
        out[k] += 1
    return out


class BatchSampler:
    """This rank's micro-batches, epoch after epoch, with an exact resumable position.

    `costs` (data/cost.py) says what each sample costs; without it, a micro-batch costs its padded
    tokens. Update k (0-based within the epoch) is global slots kG .. kG + G - 1.
    """

    def __init__(self, lengths: np.ndarray, cfg: DataConfig, seed: int, rank: int = 0, world_size: int = 1,
                 grad_accum: int = 1, costs: SampleCosts | None = None):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if len(self.lengths) == 0:
            raise UserError("no samples to batch")
        self.cfg = cfg
        self.seed = int(seed)
        self.rank = rank
        self.world_size = world_size
        self.grad_accum = grad_accum
        self.update_size = world_size * grad_accum
        self.costs = costs if costs is not None else token_costs(self.lengths)
        if len(self.costs.row) != len(self.lengths):
            raise ValueError("costs must hold one entry per sample")
        self.budget = cfg.tokens_per_batch
        cuts = bucket_cuts(self.lengths, cfg.buckets)
        raw = np.searchsorted(np.asarray(cuts, dtype=np.int64), self.lengths, side="right")
        used = np.unique(raw)
        self.bucket_of = np.searchsorted(used, raw).astype(np.int32)
        edges = [0, *cuts, None]
        self.edges = [(edges[k], edges[k + 1]) for k in used.tolist()]
        by_length = np.lexsort((self.lengths, self.bucket_of))  # stable: equal lengths keep their order
        self.members = np.split(by_length, np.cumsum(np.bincount(self.bucket_of))[:-1])  # per bucket, ascending
        self.cost_budget = self._cost_budget()
        self.bounds = [self._pack(idx, self.cost_budget) for idx in self.members]
        self.batch_counts = [len(bd) - 1 for bd in self.bounds]
        total = sum(self.batch_counts)
        self.updates_per_epoch = math.ceil(total / self.update_size)
        pad = apportion(self.updates_per_epoch * self.update_size - total, self.batch_counts)
        self.slot_counts = [n + p for n, p in zip(self.batch_counts, pad, strict=True)]
        self.batches_per_epoch = self.updates_per_epoch * grad_accum  # this rank's
        self.bound = run_bound(self.slot_counts, cfg.max_same_bucket_run) if cfg.interleave else None
        self.fingerprint = self._fingerprint(self.update_size)
        self._schedules: dict[int, np.ndarray] = {}
        self._plans: dict[int, list[PlannedBatch]] = {}
        self._lock = threading.RLock()  # the prefetch thread plans while the main thread describes
        self.epoch = 0
        self.index = 0

    def _pack(self, idx: np.ndarray, cost_budget: float) -> np.ndarray:
        return pack_sorted(self.lengths[idx], self.costs.row[idx], self.costs.work[idx], cost_budget, self.budget)

    def _cost_budget(self) -> float:
        """Padded tokens: the token budget. FLOPs: what `tokens_per_batch` padded tokens cost in the bucket
        where a token costs least (the median over its token-budget micro-batches), so every micro-batch
        costs about as much as a full one of that bucket and none holds more padded tokens than the
        token budget allows."""
        if self.costs.kind == "tokens":
            return float(self.budget)
        per_token = []
        for idx in self.members:
            batches = np.split(idx, self._pack(idx, math.inf)[1:-1])
            per_token.append(np.median([batch_cost(ids, self.costs) / (len(ids) * self.lengths[ids].max())
                                        for ids in batches]))
        return float(min(per_token) * self.budget)

    def _fingerprint(self, update_size: int) -> str:
        h = hashlib.blake2b(self.lengths.astype(np.int64).tobytes(), digest_size=12)
        h.update(self.costs.row.tobytes())
        h.update(self.costs.work.tobytes())
        options = (self.cfg.buckets, self.budget, self.costs.kind, self.cfg.max_same_bucket_run, self.cfg.interleave)
        h.update(repr((options, self.seed, update_size)).encode())
        return h.hexdigest()

    def _rng(self, epoch: int, stream: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, epoch, stream])

    def schedule(self, epoch: int) -> np.ndarray:
        """Bucket of each global slot of `epoch`; epoch e continues the run that epoch e-1 ended with."""
        with self._lock:
            if epoch in self._schedules:
                return self._schedules[epoch]
            if not self.cfg.interleave:
                seq = homogeneous(self.slot_counts, self._rng(epoch, 1))
            else:
                done = [e for e in self._schedules if e < epoch]
                start = max(done) + 1 if done else 0
                tail = tail_run(self._schedules[start - 1]) if start > 0 else None
                for e in range(start, epoch + 1):
                    seq = interleave(self.slot_counts, self._rng(e, 1), self.cfg.max_same_bucket_run, tail)
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
        """Per bucket, this epoch's batches in their order of use, as many as the bucket's slots
        (the padding repeats the bucket's first batches)."""
        rng = self._rng(epoch, 0)
        out = []
        for idx, bounds, slots in zip(self.members, self.bounds, self.slot_counts, strict=True):
            order = idx[np.lexsort((rng.random(len(idx)), self.lengths[idx]))]
            batches = np.split(order, bounds[1:-1])
            out.append([batches[k] for k in np.resize(rng.permutation(len(batches)), slots)])
        return out

    def global_plan(self, epoch: int) -> list[tuple[int, np.ndarray]]:
        """(bucket, sample ids) of every global slot of `epoch`, in order: the same on every rank."""
        per_bucket = [iter(batches) for batches in self._global_batches(epoch)]
        return [(b, next(per_bucket[b])) for b in self.schedule(epoch).tolist()]

    def plan(self, epoch: int) -> list[PlannedBatch]:
        """This rank's batches of `epoch`, in order."""
        with self._lock:
            if epoch in self._plans:
                return self._plans[epoch]
            g, a = self.update_size, self.grad_accum
            plan = []
            for slot, (b, ids) in enumerate(self.global_plan(epoch)):
                if (slot % g) // a != self.rank:
                    continue
                lens = self.lengths[ids]
                plan.append(PlannedBatch(epoch, len(plan), b, ids, int(lens.sum()), int(lens.max()) * len(ids),
                                         batch_cost(ids, self.costs)))
            self._remember(self._plans, epoch, plan)
            return plan

    def next(self) -> PlannedBatch:
        """The batch at the current position; then advance (epochs follow each other forever)."""
        batch = self.plan(self.epoch)[self.index]
        self.index += 1
        if self.index == self.batches_per_epoch:
            self.epoch, self.index = self.epoch + 1, 0
        return batch

    def position(self, epoch: int, index: int) -> dict[str, Any]:
        """The resumable state of position `index` of this rank's plan of `epoch`."""
        if index == self.batches_per_epoch:
            epoch, index = epoch + 1, 0
        return {"epoch": epoch, "index": index, "grad_accum": self.grad_accum, "fingerprint": self.fingerprint}

    def state_dict(self) -> dict[str, Any]:
        return self.position(self.epoch, self.index)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("fingerprint") != self.fingerprint:
            raise UserError(
                "the data or batching settings changed since this checkpoint (sampler fingerprint differs); "
                "resume with the same data, seed, world size x grad_accum and data settings"
            )
        epoch, index = int(state["epoch"]), int(state["index"])
        if not 0 <= index < self.batches_per_epoch or epoch < 0:
            raise UserError(f"sampler state out of range: epoch {epoch}, index {index}")
        self.epoch, self.index = epoch, index

    def carry_over(self, state: dict[str, Any], world_size: int) -> dict[str, Any]:
        """A position saved by a run of `world_size` ranks, for this one. The same world_size x
        grad_accum: the same update of the same plan (exact). Another: the same epoch at the same
        fraction of it, in this plan (a few of this epoch's samples may be seen twice or not at all)."""
        accum = int(state.get("grad_accum", 1))
        if world_size == self.world_size and accum == self.grad_accum:
            return state
        saved_size = world_size * accum
        if state.get("fingerprint") != self._fingerprint(saved_size):
            self.load_state_dict(state)  # raises the data-changed error
        update = int(state["index"]) // accum
        if saved_size != self.update_size:
            saved_updates = math.ceil(sum(self.batch_counts) / saved_size)
            update = min(self.updates_per_epoch - 1, round(update * self.updates_per_epoch / saved_updates))
        return self.position(int(state["epoch"]), update * self.grad_accum)

    def describe(self, epochs: int = 2) -> dict[str, Any]:
        """The batch plan as printed at start, logged as the `data` record, and given by `data --json`."""
        seqs = [self.schedule(e) for e in range(epochs)]
        slots = self.global_plan(0)
        total_real = int(self.lengths.sum())
        buckets = []
        for b, (lo, hi) in enumerate(self.edges):
            lens = self.lengths[self.members[b]]
            buckets.append({"lo": lo, "hi": hi if hi is not None else int(lens.max()) + 1, "samples": len(lens),
                            "batches": self.slot_counts[b], "token_share": round(float(lens.sum()) / total_real, 4),
                            "min_len": int(lens.min()), "max_len": int(lens.max())})
        real = sum(int(self.lengths[ids].sum()) for _, ids in slots)
        padded = sum(len(ids) * int(self.lengths[ids].max()) for _, ids in slots)
        seq_lens = np.asarray([int(self.lengths[ids].max()) for _, ids in slots])
        costs = np.asarray([batch_cost(ids, self.costs) for _, ids in slots])
        per_rank = costs.reshape(self.updates_per_epoch, self.world_size, self.grad_accum).sum(axis=2)
        warnings = []
        if self.bound is not None and self.bound > self.cfg.max_same_bucket_run:
            warnings.append(f"one bucket holds too many batches for runs of {self.cfg.max_same_bucket_run}; "
                            f"runs are bounded by {self.bound} instead (use finer buckets)")
        return {
            "buckets": buckets,
            "batches": self.updates_per_epoch * self.update_size,
            "batches_per_rank": self.batches_per_epoch,
            "world_size": self.world_size,
            "grad_accum": self.grad_accum,
            "updates_per_epoch": self.updates_per_epoch,
            "tokens_per_batch": self.budget,
            "batch_cost": self.costs.kind,
            "cost_budget": self.cost_budget,
            "cost_cv": round(float(costs.std() / costs.mean()), 4),
            "rank_wait_predicted": round(float(np.mean(1 - per_rank.mean(axis=1) / per_rank.max(axis=1))), 4),
            "interleave": self.cfg.interleave,
            "max_same_bucket_run": longest_run(np.concatenate(seqs)),
            "run_bound": self.bound,
            "update_mix": update_mix(np.concatenate(seqs), self.update_size),
            "drain_lag": round(drain_lag(seqs[0], self.slot_counts, self.update_size), 4),
            "length_autocorr_lag1": round(lag1_autocorr(seq_lens), 4),
            "pad_frac": round(1.0 - real / max(1, padded), 4),
            "warnings": warnings,
        }
