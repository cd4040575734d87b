"""log.jsonl: one JSON object a line, the source of truth for everything about a run.

Each record gets `kind`, `time` and `step`; every line is flushed as it is written, so a crash
loses at most the line being written. Non-finite floats are written as null (JSON has no NaN) and
flagged in the record's `nonfinite` list, so a NaN loss is visible rather than unparseable.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from blockdraft.telemetry.trackers import Sink

SCHEMA = 1
NONFINITE = "nonfinite"  # the record key listing the fields written as null for a NaN or Inf


def _clean(value: Any, path: str, bad: list[str]) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        bad.append(path)
        return None
    if isinstance(value, dict):
        return {k: _clean(v, f"{path}.{k}" if path else k, bad) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v, f"{path}[{i}]", bad) for i, v in enumerate(value)]
    return value


class RunLog:
    """Append-only writer for RUN/log.jsonl (rank 0 only). `sinks` (experiment trackers) get every
    record once it is on disk; a sink that raises is dropped with a `tracker_failed` warning, so a
    tracker can never stop a run. Nothing else runs here: the live doctor's sink only queues records."""

    def __init__(self, path: Path, sinks: Sequence[Sink] = ()) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: TextIO = path.open("a", encoding="utf-8")
        self._sinks = list(sinks)

    def write(self, kind: str, step: int, **fields: Any) -> dict[str, Any]:
        bad: list[str] = []
        record = _clean({"kind": kind, "time": time.time(), "step": step, **fields}, "", bad)
        if bad:
            record[NONFINITE] = bad
        self._fh.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._fh.flush()
        for sink in list(self._sinks):
            try:
                sink.write(record)
            except Exception as exc:  # any library error: the run and its log go on without this tracker
                self._sinks.remove(sink)
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                message = f"tracker {sink.name} stopped after an error, the run goes on: {type(exc).__name__}: {first}"
                print(f"warning: {message}", file=sys.stderr)
                self.write("warning", step, code="tracker_failed", severity="warning", message=message)
        return record

    def add_sink(self, sink: Sink) -> None:
        self._sinks.append(sink)

    def close(self) -> None:
        for sink in self._sinks:
            sink.close()
        self._fh.close()


def decode_record(raw: bytes | str) -> dict[str, Any] | None:
    """One JSON line as a record; None for anything else (a partial line, a list, not JSON)."""
    try:
        rec = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return rec if isinstance(rec, dict) else None


def read_log(path: Path) -> list[dict[str, Any]]:
    """All complete records; a truncated last line (a crash mid-write) is ignored."""
    with path.open("rb") as fh:
        return [rec for line in fh if (rec := decode_record(line)) is not None]
