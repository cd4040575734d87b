"""The doctor on a growing log: inside a running trainer (its live-doctor hook) and in
`blockdraft doctor --follow`.

`ingest(record)` is cheap: non-finite values and slow checkpoints are judged on the record itself,
the config once two steps exist. `analyse()` re-runs the offline detectors over a bounded tail of
recent records: the costly part, so its caller decides how often (`observe` = ingest, and analyse
every `every` steps). Each code is reported once per severity it reaches.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from blockdraft.doctor import stats
from blockdraft.doctor.detectors import DETECTORS, Detector, diagnose, settings
from blockdraft.doctor.detectors.timing import checkpoint_stall_limit
from blockdraft.doctor.findings import SEVERITY_RANK, Finding
from blockdraft.doctor.records import apply_mapping, run_from_records
from blockdraft.doctor.run import GUARDED
from blockdraft.telemetry.log import NONFINITE, decode_record


class LiveDoctor:
    """Incremental diagnosis: `observe` returns only findings not reported before."""

    def __init__(
        self, config: dict[str, Any] | None = None, run_start: dict[str, Any] | None = None, *, every: int = 50,
        window: int = 4096, min_severity: str = "warning", mapping: dict[str, str] | None = None,
    ) -> None:
        self.run_start = dict(run_start) if run_start else None
        if config is not None:
            self.run_start = {**(self.run_start or {"kind": "run_start", "step": 0}), "config": config}
        self.every = every
        self.window = window
        self.min_rank = SEVERITY_RANK[min_severity]
        self._steps: deque[dict[str, Any]] = deque(maxlen=window)
        self._others: deque[dict[str, Any]] = deque(maxlen=512)
        self._reported: dict[str, int] = {}
        self._since = 0
        self._config_checked = False
        self._mapping = mapping or {}

    def observe(self, record: dict[str, Any]) -> list[Finding]:
        new = self.ingest(record)
        if self._since >= self.every:
            new += self.analyse()
        return new

    def ingest(self, record: dict[str, Any]) -> list[Finding]:
        """Take one record; findings judged on it alone (and the config check, once)."""
        record, kind = self._store(record)
        new: list[Finding] = []
        if kind == "run_start":
            self._config_checked = False
        elif kind == "step":
            self._since += 1
            new += self._immediate(record)
        elif kind == "checkpoint":
            new += self._checkpoint(record)
        if not self._config_checked and self.run_start is not None and len(self._steps) >= 2:
            self._config_checked = True
            new += self._analyse((settings.optimizer_betas, settings.loss_decay_gamma))
        return new

    def analyse(self) -> list[Finding]:
        """The offline detectors over the tail window: new findings only."""
        self._since = 0
        return self._analyse()

    def prime(self, records: list[dict[str, Any]]) -> None:
        """Fill the tail window with records already analysed, without reporting on them."""
        for rec in records:
            self._store(rec)
        self._config_checked = True

    def _store(self, record: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """Into the window it belongs to; (the record as stored, "step" for step records, else its kind)."""
        if self._mapping:
            record = dict(record)
            apply_mapping(record, self._mapping)
        kind = record.get("kind")
        if kind == "run_start":
            self.run_start = dict(record)
        elif kind == "step" or (kind is None and "step" in record):
            self._steps.append(record)
            return record, "step"
        elif isinstance(kind, str):
            self._others.append(record)
        return record, kind if isinstance(kind, str) else None

    def mark_reported(self, findings: list[Finding]) -> None:
        """Treat these findings as already shown (used after an offline pass over an existing log)."""
        for f in findings:
            self._fresh(f)

    def _fresh(self, finding: Finding) -> bool:
        rank = SEVERITY_RANK[finding.severity]
        if rank < self.min_rank or rank <= self._reported.get(finding.code, -1):
            return False
        self._reported[finding.code] = rank
        return True

    def _immediate(self, record: dict[str, Any]) -> list[Finding]:
        flagged = record.get(NONFINITE)
        flagged = flagged if isinstance(flagged, list) else []
        bad = [name for name in GUARDED
               if name in flagged or (isinstance(v := record.get(name), float) and not math.isfinite(v))]
        if not bad:
            return []
        step = int(record.get("step", 0))
        skipped = bool(record.get("skipped"))
        finding = Finding(
            code="nonfinite", severity="warning" if skipped else "error", steps=(step, step),
            summary=f"non-finite {', '.join(bad)} at step {step}" + (" (skipped by the guard)" if skipped else ""),
            evidence={"step": step, "skipped": int(skipped)},
            advice="Resume from the last good checkpoint if the update was applied; find the batch that caused it.",
        )
        return [finding] if self._fresh(finding) else []

    def _checkpoint(self, record: dict[str, Any]) -> list[Finding]:
        stall = record.get("stall_s")
        times = [t for r in list(self._steps)[-200:] if isinstance(t := r.get("step_time"), int | float)]
        typical = stats.typical_step_time(np.array(times, dtype=np.float64))
        if not isinstance(stall, int | float) or stall < checkpoint_stall_limit(typical):
            return []
        step = int(record.get("step", 0))
        finding = Finding(
            code="checkpoint_stall", severity="warning", steps=(step, step),
            summary=f"checkpoint at step {step} held the training loop for {stall:.0f} s",
            evidence={"stall_s": float(stall), "typical_step_s": typical},
            advice="Stage the state between steps and write it in the background.",
        )
        return [finding] if self._fresh(finding) else []

    def _analyse(self, detectors: tuple[Detector, ...] = DETECTORS) -> list[Finding]:
        recs = [self.run_start] if self.run_start is not None else []
        first = self._steps[0].get("step", 0) if self._steps else 0
        recs += [  # the `data` record describes the whole run, whatever the window
            r for r in self._others
            if r.get("kind") == "data" or (isinstance(r.get("step"), int | float) and r["step"] >= first)
        ]
        recs += list(self._steps)
        return [f for f in diagnose(run_from_records(recs), detectors) if self._fresh(f)]


def tail_records(
    path: Path, poll_s: float = 1.0, stop: Callable[[], bool] | None = None, start_at: int = 0
) -> Iterator[dict[str, Any]]:
    """Yield records appended to `path` from byte `start_at` on, polling every `poll_s` until `stop()`;
    a partial last line waits for its end."""
    offset, pending = start_at, b""
    while True:
        with path.open("rb") as fh:
            fh.seek(offset)
            chunk = fh.read()
        offset += len(chunk)
        *lines, pending = (pending + chunk).split(b"\n")
        yield from (rec for line in lines if (rec := decode_record(line)) is not None)
        if stop is not None and stop():
            return
        if not chunk:
            time.sleep(poll_s)
