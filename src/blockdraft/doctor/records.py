"""Load a training log (ours or a foreign trainer's) into a `LoggedRun` the detectors can vectorise over.

JSON lines are decoded with msgspec into a struct of only the fields we read (a million of our
step lines in ~8 s CPU on the 2-core dev box, where orjson into dicts needs ~11 s); lines it rejects
(NaN literals, odd types) go through `json` (`telemetry.log.decode_record`).
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import msgspec
import numpy as np

from blockdraft.doctor import fields
from blockdraft.doctor.fields import LIST_FIELDS, OTHER_FIELDS, STEP_FIELDS
from blockdraft.doctor.run import MISSING_BUCKET, MIXED_BUCKET, NAN_SUFFIX, NAN_WATCH, LoggedRun, StepTable
from blockdraft.errors import UserError
from blockdraft.telemetry.log import NONFINITE, decode_record

FORMATS = (
    "blockdraft log.jsonl, a JSONL of step records, Hugging Face trainer_state.json or checkpoint folder, "
    "W&B CSV export or wandb-history.jsonl, TensorBoard event files"
)
CHUNK_LINES = 50_000
SNIFF_LINES = 400
PROFILE_ROWS = 500
METRICS = ("loss", "acc", "lr", "grad_norm")


def parse_log_bytes(data: bytes, mapping: dict[str, str], source: str = "<memory>") -> LoggedRun:
    """Parse a whole JSONL log: step lines in bulk through a msgspec struct, other lines as dicts. The cyclic
    garbage collector is paused meanwhile: a million new rows would trigger it hundreds of times for nothing."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return _parse_lines(data, mapping, source)
    finally:
        if paused:
            gc.enable()


def _parse_lines(data: bytes, mapping: dict[str, str], source: str) -> LoggedRun:
    lines = data.split(b"\n")
    if lines and not lines[-1].strip():
        lines.pop()
    line_count = len(lines)
    resolved = _sniff_keys(lines, mapping)
    row_type = _row_struct(resolved)
    one, many = msgspec.json.Decoder(row_type), msgspec.json.Decoder(list[row_type])
    rows: list[Any] = []
    row_lines: list[int] = []
    others: list[dict[str, Any]] = []
    bad_lines, truncated = 0, False
    for lo in range(0, line_count, CHUNK_LINES):
        chunk = lines[lo : lo + CHUNK_LINES]
        try:
            decoded: list[Any] = many.decode(b"[" + b",".join(chunk) + b"]")
        except msgspec.DecodeError:
            decoded = [_decode_row(one, raw, resolved) for raw in chunk]
        for i, row in enumerate(decoded):
            if row is None:  # only from the line-by-line fallback
                if chunk[i].strip() and lo + i == line_count - 1:
                    truncated = True
                elif chunk[i].strip():
                    bad_lines += 1
                continue
            kind = row.kind
            # `kind == "step"` first: the common case, without building the metric generator per row
            if kind == "step" or _is_step(kind, row.step, (getattr(row, m) for m in METRICS)):
                rows.append(row)
                row_lines.append(lo + i)
            elif kind is not None:
                rec = decode_record(chunk[i])
                if rec is not None:
                    rec["_line"] = lo + i
                    others.append(rec)
    if bad_lines and bad_lines > 0.5 * max(1, line_count):
        raise UserError(
            f"{source}: {bad_lines} of {line_count} lines are not JSON objects; blockdraft doctor reads {FORMATS}"
        )
    values = {name: [getattr(r, name) for r in rows] for name in row_type.__struct_fields__}
    values["acc_per_pos"] = _tail_profiles(lines, row_lines, resolved.get("acc_per_pos"))
    run = _assemble(values, np.array(row_lines, dtype=np.int64), others, source)
    run.bad_lines, run.truncated_tail = bad_lines, truncated
    run.mapped = fields.renamed(resolved)
    return run


def run_from_records(
    recs: Sequence[dict[str, Any]], mapping: dict[str, str] | None = None, source: str = "<live>",
    log_format: str = "jsonl",
) -> LoggedRun:
    """A LoggedRun from already-decoded records (the live doctor's window, foreign formats' readers)."""
    resolved = fields.resolve(set().union(*recs), mapping or {})
    step_rows: list[dict[str, Any]] = []
    row_lines: list[int] = []
    others: list[dict[str, Any]] = []
    for line_no, rec in enumerate(recs):
        kind = rec.get(resolved.get("kind", "kind"))
        step = rec.get(resolved["step"]) if "step" in resolved else None
        if _is_step(kind, step, (rec.get(resolved[m]) for m in METRICS if m in resolved)):
            step_rows.append(rec)
            row_lines.append(line_no)
        elif isinstance(kind, str):
            others.append({**rec, "_line": line_no})
    values = {
        name: ([r.get(resolved[name]) for r in step_rows] if name in resolved else [None] * len(step_rows))
        for name in (*STEP_FIELDS, *LIST_FIELDS, *OTHER_FIELDS)
    }
    run = _assemble(values, np.array(row_lines, dtype=np.int64), others, source)
    run.mapped, run.log_format = fields.renamed(resolved), log_format
    return run


def apply_mapping(rec: dict[str, Any], mapping: dict[str, str]) -> None:
    """Rename a foreign record's fields to ours in place (--map first, then the common aliases)."""
    for ours, theirs in fields.resolve(rec, mapping).items():
        if ours not in rec:
            rec[ours] = rec[theirs]


def _sniff_keys(lines: list[bytes], mapping: dict[str, str]) -> dict[str, str]:
    """Which key holds each of our fields, judged from the first and last lines of the log."""
    sample = lines[:SNIFF_LINES] + lines[-SNIFF_LINES:] if len(lines) > 2 * SNIFF_LINES else lines
    recs = [rec for rec in map(decode_record, sample) if rec is not None and rec.get("kind") in (None, "step")]
    return fields.resolve(set().union(*recs), mapping)


def _row_struct(resolved: dict[str, str]) -> type:
    """A msgspec struct of only the fields we read, each under the log's own key."""
    scalar = float | bool | str | None
    specs: list[tuple[str, Any, Any]] = [("kind", str | None, None)]
    specs += [(name, Any if name == "queue_depth" else scalar, None) for name in STEP_FIELDS]
    specs += [(name, Any, None) for name in ("buckets", "skip_reason", NONFINITE)]
    return msgspec.defstruct("StepRow", specs, rename=fields.renamed(resolved), gc=False)


def _tail_profiles(lines: list[bytes], row_lines: list[int], key: str | None) -> list[Any]:
    """acc_per_pos of the last step rows only: only the latest list's length is read, and lists cost to decode."""
    if key is None:
        return []
    recs = (decode_record(lines[line_no]) for line_no in row_lines[-PROFILE_ROWS:])
    return [rec.get(key) if rec else None for rec in recs]


def _decode_row(decoder: Any, raw: bytes, resolved: dict[str, str]) -> Any:
    """One line as a StepRow; a line msgspec rejects (NaN literals, unusual types) goes through json
    (None if it is not a JSON object), and a record of another kind keeps only its `kind`."""
    try:
        return decoder.decode(raw)
    except msgspec.DecodeError:
        rec = decode_record(raw)
    if rec is None:
        return None
    row_type = decoder.type
    if rec.get("kind") not in (None, "step"):
        return row_type(kind=rec.get("kind"))
    return row_type(**{name: rec.get(key) for name, key in resolved.items() if name in row_type.__struct_fields__})


def _is_step(kind: Any, step: Any, metrics: Iterable[Any]) -> bool:
    """A step record: kind "step", or (a foreign log's) no kind but a step number and a metric."""
    return kind == "step" or (kind is None and step is not None and any(m is not None for m in metrics))


def _number(value: Any) -> float:
    if isinstance(value, int | float):  # a bool too: 1.0 or 0.0
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return math.nan
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list) and value and all(isinstance(v, int | float) for v in value):
        return float(sum(value))
    return math.nan


def _timestamp(value: Any) -> float:
    """Seconds since the epoch from a number or an ISO 8601 string (some loggers write those)."""
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return math.nan
    return _number(value)


def _column(values: list[Any]) -> np.ndarray:
    try:
        col = np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        col = None
    if col is None or col.ndim != 1:
        col = np.array([_number(v) for v in values], dtype=np.float64)
    return col


def _assemble(values: dict[str, list[Any]], lines: np.ndarray, others: list[dict[str, Any]], source: str) -> LoggedRun:
    records: dict[str, list[dict[str, Any]]] = {}
    for rec in others:
        records.setdefault(str(rec["kind"]), []).append(rec)
    n = len(lines)
    cols: dict[str, np.ndarray] = {}
    flags = values.get(NONFINITE, [])
    flagged_rows = [i for i, f in enumerate(flags) if isinstance(f, list)]
    for name in STEP_FIELDS:
        vals = values.get(name)
        if vals is None or all(v is None for v in vals):
            continue
        cols[name] = _column(vals)
        if name == "time" and not np.isfinite(cols[name]).any():
            cols[name] = np.array([_timestamp(v) for v in vals], dtype=np.float64)
    for name in NAN_WATCH:  # a NaN literal, or a null the writer flagged as non-finite
        literal = np.zeros(n)
        literal[[i for i in flagged_rows if name in flags[i]]] = 1.0
        if name in cols:
            literal[np.array([isinstance(v, float) and math.isnan(v) for v in values[name]], dtype=bool)] = 1.0
        if literal.any():
            cols.setdefault(name, np.full(n, np.nan))
            cols[name + NAN_SUFFIX] = literal
    _derive(cols)
    if "step" not in cols or not np.isfinite(cols["step"]).any():
        cols["step"] = np.arange(1, n + 1, dtype=np.float64)
    bucket, bucket_seq, bucket_row = _bucket_columns(values.get("buckets", []), n)
    world = _world_sizes(lines, records)
    if world is not None:
        cols["world_size"] = world
    reasons = {i: str(r) for i, r in enumerate(values.get("skip_reason", [])) if r}
    run_start = records["run_start"][-1] if records.get("run_start") else None
    config = run_start.get("config") if run_start else None
    config = config if isinstance(config, dict) else None
    table = StepTable(
        cols=cols, bucket=bucket, bucket_seq=bucket_seq, bucket_row=bucket_row, skip_reasons=reasons,
        segment=_segments(cols["step"], lines, records), positions=_positions(values["acc_per_pos"]),
    )
    return LoggedRun(source=source, steps=table, run_start=run_start, config=config, records=records)


def _derive(cols: dict[str, np.ndarray]) -> None:
    """Fields a foreign log gives in another form: tau_est from streak, a fractional `epoch`."""
    if "tau_est" not in cols and "streak" in cols:
        cols["tau_est"] = 1.0 + cols["streak"]
    epoch = cols.get("epoch")
    if epoch is not None:
        finite = epoch[np.isfinite(epoch)]
        if len(finite) and not np.all(finite == np.round(finite)):
            cols["epoch_pos"] = cols.pop("epoch")


def _bucket_columns(values: list[Any], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-row bucket (MISSING_BUCKET, or MIXED_BUCKET for an update of several) and the flat
    micro-batch bucket sequence with each micro-batch's row."""
    bucket = np.full(n, MISSING_BUCKET, dtype=np.int64)
    seq: list[int] = []
    rows: list[int] = []
    for i, value in enumerate(values):
        listed = value if isinstance(value, list) else [value]
        items = [int(v) for v in listed if isinstance(v, int | float) and not isinstance(v, bool)]
        if not items:
            continue
        bucket[i] = items[0] if all(x == items[0] for x in items) else MIXED_BUCKET
        if len(items) > 1 or items[0] >= 0:
            seq.extend(items)
            rows.extend([i] * len(items))
    return bucket, np.array(seq, dtype=np.int64), np.array(rows, dtype=np.int64)


def _positions(profiles: list[Any]) -> int | None:
    """Entries of the latest acc_per_pos list in the last PROFILE_ROWS step rows: the block size - 1."""
    return next((len(p) for p in reversed(profiles[-PROFILE_ROWS:]) if isinstance(p, list) and p), None)


def _world_sizes(lines: np.ndarray, records: dict[str, list[dict[str, Any]]]) -> np.ndarray | None:
    """Each step row's world size: that of the latest run_start above it. A run resumed on another
    number of GPUs changes its tokens per step and steps per epoch there, not at random."""
    starts = sorted((r["_line"], r["world_size"]) for r in records.get("run_start", [])
                    if isinstance(r.get("_line"), int) and isinstance(r.get("world_size"), int | float))
    if not starts:
        return None
    marks = np.array([line for line, _ in starts], dtype=np.int64)
    sizes = np.array([size for _, size in starts], dtype=np.float64)
    idx = np.searchsorted(marks, lines) - 1
    return np.where(idx >= 0, sizes[np.clip(idx, 0, None)], np.nan)


def _segments(steps: np.ndarray, lines: np.ndarray, records: dict[str, list[dict[str, Any]]]) -> np.ndarray:
    """A new segment starts at a resume or rollback, or where the step counter goes back (a guarded
    step shares its number with the update that follows it, so equal numbers stay together)."""
    if not len(steps):
        return np.zeros(0, dtype=np.int64)
    breaks = np.zeros(len(steps), dtype=bool)
    breaks[1:] = steps[1:] < steps[:-1]
    marks = [r.get("_line") for kind in ("run_start", "rollback") for r in records.get(kind, [])]
    marks_arr = np.array([m for m in marks if isinstance(m, int)], dtype=np.int64)
    if len(marks_arr):
        first_after = np.searchsorted(lines, marks_arr)
        first_after = first_after[(first_after > 0) & (first_after < len(steps))]
        breaks[first_after] = True
    return np.cumsum(breaks)
