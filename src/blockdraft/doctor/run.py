"""What the doctor knows about one run: its step records as columns, its other records as dicts.

Step records become float64 columns (NaN where a field is missing), so a detector that needs a
field simply finds it absent and narrows what it checks. records.py fills these from a log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

NAN_SUFFIX = "!nan"
NAN_WATCH = ("loss", "grad_norm", "acc", "lr", "tau_est", "kl")  # fields whose non-finite values are counted
GUARDED = ("loss", "grad_norm")  # the fields the trainer's finite-value guard checks (train/guard.py)
HF_KEYS = ("train/global_step", "train/learning_rate", "train/epoch")
MISSING_BUCKET = -1
MIXED_BUCKET = -2


@dataclass
class StepTable:
    """Step records as columns, in file order (a rollback or resume repeats steps; `segment` tells)."""

    cols: dict[str, np.ndarray]
    bucket: np.ndarray
    bucket_seq: np.ndarray
    bucket_row: np.ndarray
    segment: np.ndarray
    skip_reasons: dict[int, str] = field(default_factory=dict)
    positions: int | None = None  # entries of the latest acc_per_pos list (block size - 1)

    def __len__(self) -> int:
        return len(self.segment)

    @property
    def first_segment(self) -> np.ndarray:
        """Rows (bool) of the first run segment: before any resume, rollback or step counter reset."""
        return self.segment == self.segment[0] if len(self.segment) else np.zeros(0, dtype=bool)

    def nonfinite(self, name: str) -> np.ndarray:
        """Rows where the field was written as NaN or +-Infinity (a missing field is not counted)."""
        return np.isinf(self.get(name)) | (self.get(name + NAN_SUFFIX) > 0)

    def has(self, name: str) -> bool:
        """True when the column exists and holds at least one finite value."""
        return bool(np.isfinite(self.get(name)).any())

    def get(self, name: str) -> np.ndarray:
        col = self.cols.get(name)
        return col if col is not None else np.full(len(self), np.nan)

    @property
    def steps(self) -> np.ndarray:
        return self.cols["step"]


@dataclass
class LoggedRun:
    """Everything the doctor knows about one run."""

    source: str
    steps: StepTable
    run_start: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    bad_lines: int = 0
    truncated_tail: bool = False
    log_format: str = "jsonl"
    mapped: dict[str, str] = field(default_factory=dict)
    config_source: str | None = None
    config_read: dict[str, str] = field(default_factory=dict)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return self.records.get(kind, [])

    def setting(self, *path: str) -> Any:
        """A value of the resolved config (`setting("optim", "lr")`), None when unknown."""
        node: Any = self.config
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return node

    def run_value(self, key: str) -> Any:
        """A top-level run_start value such as `total_steps`, `warmup_steps`, `batches_per_epoch`;
        the trainer's time-budget plan (`schedule_planned`) supersedes the run's `total_steps`."""
        plans = self.schedule_plans
        if plans and key in plans[-1]:
            return plans[-1][key]
        return (self.run_start or {}).get(key)

    @property
    def schedule_plans(self) -> list[dict[str, Any]]:
        """The `schedule_planned` warnings in log order: train.max_minutes shortened the LR schedule."""
        return [w for w in self.of_kind("warning") if w.get("code") == "schedule_planned"]

    @property
    def from_hf_trainer(self) -> bool:
        """Written by a Hugging Face Trainer (its state file, or its W&B/TensorBoard keys), whose
        `epoch` is the cumulative epoch count: 0.4 is 40% of the first epoch by definition."""
        return self.log_format == "hf" or set(HF_KEYS) <= set(self.mapped.values())

    @property
    def ours(self) -> bool:
        """Written by blockdraft's trainer (a run_start with our schema), so field meanings are known."""
        return self.log_format == "jsonl" and isinstance(self.run_value("schema"), int)

    @property
    def block_size(self) -> int | None:
        size = self.setting("drafter", "block_size")
        if isinstance(size, int | float) and size >= 2:
            return int(size)
        if self.steps.positions:
            return self.steps.positions + 1
        return None
