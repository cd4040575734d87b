"""The fields of a `step` record in log.jsonl, defined once: the trainer writes exactly these, in
this order, and readers name them from here (`RunLog.write` adds `kind`, `time` and `step`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict, cast

TAU_EST_WINDOW = 100  # updates: an eval record's `tau_est_train` summarises this many step records before it


class StepRecord(TypedDict):
    lr: float
    loss: float
    kl: float
    acc: float
    acc_per_pos: list[float]
    streak: float
    tau_est: float
    loss_tokens: int
    anchors: int
    grad_norm: float
    clipped: bool
    skipped: bool
    skip_reason: str | None
    noise_std: float
    epoch: int
    epoch_progress: float
    progress: float
    samples: int
    tokens: int
    pad_frac: float
    buckets: list[int]
    seq_len_max: int
    step_time: float
    data_wait: float
    queue_depth: int
    tok_per_s: float
    mfu: float | None
    mem_gb: float | None
    graphs_compiled: int  # graphs torch.compile has made in this process so far: growth late = a recompile stall


STEP_RECORD_FIELDS: tuple[str, ...] = tuple(StepRecord.__annotations__)


def step_record(values: Mapping[str, Any]) -> StepRecord:
    """`values` as a step record in the defined order; a field missing or not defined is an error,
    so the log cannot drift from the definition its readers use."""
    missing = [f for f in STEP_RECORD_FIELDS if f not in values]
    extra = [k for k in values if k not in StepRecord.__annotations__]
    if missing or extra:
        raise ValueError(f"step record: missing {missing}, not defined {extra} (telemetry/step_record.py)")
    return cast(StepRecord, {f: values[f] for f in STEP_RECORD_FIELDS})


def tau_est_over_window(values: Iterable[float | None]) -> float | None:
    """The median of the finite `tau_est` values given, the last TAU_EST_WINDOW updates': what an eval
    record sets beside its measured tau as `tau_est_train`. One update's tau_est is one batch's, too
    noisy to judge a gap by."""
    finite = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return statistics.median(finite) if finite else None
