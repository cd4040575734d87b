"""The unit of doctor output: one diagnosed problem with its evidence and the fix to try.

The JSON keys (`code`, `severity`, `steps`, `summary`, `evidence`, `advice`) are a contract: CI jobs
and the live trainer read them. `weight` only orders findings of one severity (bigger first);
`spans` lists the individual events (step ranges) for the report's shading; empty means `steps`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

SEVERITIES = ("info", "warning", "error")
SEVERITY_RANK = {name: i for i, name in enumerate(SEVERITIES)}

CODES = (  # never rename one: CI jobs and trackers key on them
    "loss_spike", "accuracy_cliff", "nonfinite", "skipped_steps", "checkpoint_stall", "logging_gap", "window_artifact",
    "homogeneous_batches", "bucket_loss_modes", "warmup_first_step", "lr_schedule_mismatch", "noise_schedule_flat",
    "optimizer_betas", "loss_decay_gamma", "queue_drain", "data_wait", "throughput_drift", "epoch_accounting",
    "plateau", "tau_gap", "data_repetition", "late_recompile",
)


@dataclass
class Finding:
    """One problem: where it happened (`steps`), how sure and how bad (`evidence`), what to change."""

    code: str
    severity: str
    steps: tuple[int, int]
    summary: str
    evidence: dict[str, float] = field(default_factory=dict)
    advice: str = ""
    weight: float = 0.0
    spans: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"unknown finding code {self.code!r}")
        if self.severity not in SEVERITY_RANK:
            raise ValueError(f"unknown severity {self.severity!r}")
        self.steps = (int(self.steps[0]), int(self.steps[1]))
        self.evidence = {k: _clean_number(v) for k, v in self.evidence.items()}

    def step_text(self, dash: str = "-") -> str:
        """`120` for a single step, `120-180` for a range (the report passes an en dash)."""
        return str(self.steps[0]) if self.steps[0] == self.steps[1] else f"{self.steps[0]}{dash}{self.steps[1]}"

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "severity": self.severity, "steps": list(self.steps), "summary": self.summary,
                "evidence": dict(self.evidence), "advice": self.advice}


def _clean_number(value: Any) -> float | int | None:
    """Evidence is numbers only; non-finite values become None so the JSON stays valid."""
    if isinstance(value, int):  # a bool too: 1 or 0
        return int(value)
    value = float(value)
    if not math.isfinite(value):
        return None
    return round(value, 6) if abs(value) >= 1e-3 else float(f"{value:.4g}")


def plural(count: int, noun: str) -> str:
    """`plural(1, "gap")` -> "1 gap", `plural(3, "gap")` -> "3 gaps" (summaries are read by people)."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def at_least(severity: str, level: str) -> bool:
    return SEVERITY_RANK[severity] >= SEVERITY_RANK[level]


def severity_counts(findings: list[Finding]) -> dict[str, int]:
    """Findings per severity, worst first, leaving out severities with none."""
    return {sev: n for sev in reversed(SEVERITIES) if (n := sum(f.severity == sev for f in findings))}


def rank(findings: list[Finding]) -> list[Finding]:
    """Most severe first; within a severity the larger problem (weight) first, then the earlier one."""
    return sorted(findings, key=lambda f: (-SEVERITY_RANK[f.severity], -f.weight, f.steps[0], f.code))
