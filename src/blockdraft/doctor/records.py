"""Load a log.jsonl (ours or a foreign trainer's) into columns the detectors can vectorise over.

Step records become float64 columns (NaN where a field is missing), so a detector that needs a
field simply finds it absent and narrows what it checks. Other record kinds stay as dicts.
Parsing a million lines with `json.loads` takes ~45 s on the 2-core dev box, so lines of our own
writer go through `fastjson` (numpy over the raw bytes) and everything else through `json`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from blockdraft.doctor import fastjson
from blockdraft.errors import UserError

STEP_FIELDS = (
    "step",
    "time",
    "lr",
    "loss",
    "acc",
    "tau_est",
    "grad_norm",
    "skipped",
    "noise_std",
    "epoch",
    "epoch_progress",
    "progress",
    "tokens",
    "seq_len_max",
    "step_time",
    "data_wait",
    "queue_depth",
    "tok_per_s",
    "kl",
    "window",
)
LIST_FIELDS = ("buckets", "acc_per_pos")

# Names other trainers commonly use; applied only when our own name is absent from a record.
ALIASES: dict[str, tuple[str, ...]] = {
    "step": ("global_step", "train/global_step", "iteration", "iter"),
    "loss": ("train/loss", "train_loss"),
    "acc": ("accuracy", "train/acc", "train/accuracy"),
    "lr": ("learning_rate", "train/lr", "train/learning_rate"),
    "grad_norm": ("train/grad_norm", "gradient_norm"),
    "time": ("timestamp", "wall_time"),
}

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
    acc_per_pos: np.ndarray | None = None
    lazy: dict[str, Callable[[], np.ndarray]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.segment)

    def nonfinite(self, name: str) -> np.ndarray:
        """Rows where the field was written as NaN or +-Infinity (a missing field is not counted)."""
        col = self.get(name)
        literal = self.cols.get(name + fastjson.NAN_SUFFIX)
        bad = np.isinf(col)
        if literal is not None:
            bad |= literal > 0
        return bad

    def has(self, name: str) -> bool:
        """True when the column exists and holds at least one finite value."""
        col = self._column(name)
        return col is not None and bool(np.isfinite(col).any())

    def get(self, name: str) -> np.ndarray:
        col = self._column(name)
        return col if col is not None else np.full(len(self), np.nan)

    def _column(self, name: str) -> np.ndarray | None:
        if name not in self.cols and name in self.lazy:
            self.cols[name] = self.lazy.pop(name)()
        return self.cols.get(name)

    @property
    def steps(self) -> np.ndarray:
        return self.cols["step"]


@dataclass
class RunLog:
    """Everything the doctor knows about one run."""

    source: str
    steps: StepTable
    run_start: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    bad_lines: int = 0
    truncated_tail: bool = False

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
        """A top-level run_start value such as `total_steps`, `warmup_steps`, `batches_per_epoch`."""
        return (self.run_start or {}).get(key)

    @property
    def block_size(self) -> int | None:
        size = self.setting("drafter", "block_size")
        if isinstance(size, int | float) and size >= 2:
            return int(size)
        if self.steps.acc_per_pos is not None and len(self.steps.acc_per_pos) >= 1:
            return len(self.steps.acc_per_pos) + 1
        return None


def resolve_log_path(path: str | Path) -> Path:
    """A run folder means its log.jsonl; anything else must be a readable file."""
    path = Path(path)
    if path.is_dir():
        path = path / "log.jsonl"
        if not path.is_file():
            raise UserError(f"{path.parent}: no log.jsonl in this folder")
    elif not path.exists():
        raise UserError(f"{path}: no such file or folder")
    elif not path.is_file():
        raise UserError(f"{path}: not a regular file")
    return path


def parse_mapping(text: str | None) -> dict[str, str]:
    """`loss=train/loss,step=global_step` -> {"loss": "train/loss", "step": "global_step"}."""
    mapping: dict[str, str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        ours, sep, theirs = item.partition("=")
        if not sep or not ours.strip() or not theirs.strip():
            raise UserError(f"--map item {item!r} is not of the form our_field=their_field")
        mapping[ours.strip()] = theirs.strip()
    return mapping


def load_run(path: str | Path, mapping: dict[str, str] | None = None) -> RunLog:
    """Read a log file (or run folder) into a RunLog; a truncated last line is dropped, not fatal."""
    log_path = resolve_log_path(path)
    try:
        data = log_path.read_bytes()
    except OSError as exc:
        raise UserError(f"{log_path}: cannot read: {exc.strerror}") from None
    run = parse_log_bytes(data, mapping or {}, source=str(log_path))
    if not len(run.steps) and not run.records:
        raise UserError(f"{log_path}: no JSON records in this file (is it a log.jsonl?)")
    return run


def parse_log_bytes(data: bytes, mapping: dict[str, str], source: str = "<memory>") -> RunLog:
    """Parse a whole log: our step lines in bulk, every other line with json."""
    fast_rows, slow_lines, line_count = fastjson.split_step_lines(data, mapping)
    decoded: list[tuple[int, dict[str, Any]]] = []
    bad_lines = 0
    truncated = False
    for line_no, raw in slow_lines:
        rec = _decode(raw)
        if rec is None:
            if line_no == line_count - 1:
                truncated = True
            else:
                bad_lines += 1
            continue
        decoded.append((line_no, rec))
    if bad_lines and bad_lines > 0.5 * max(1, line_count):
        raise UserError(f"{source}: {bad_lines} of {line_count} lines are not JSON objects")
    run = _assemble(decoded, mapping, fast_rows, source, data)
    run.bad_lines, run.truncated_tail = bad_lines, truncated
    return run


def run_from_records(
    recs: list[dict[str, Any]], mapping: dict[str, str] | None = None, source: str = "<live>"
) -> RunLog:
    """A RunLog from already-decoded records (the live doctor's window)."""
    return _assemble([(i, dict(r)) for i, r in enumerate(recs)], mapping or {}, None, source)


def _assemble(
    decoded: list[tuple[int, dict[str, Any]]],
    mapping: dict[str, str],
    fast_rows: fastjson.FastRows | None,
    source: str,
    data: bytes | None = None,
) -> RunLog:
    records: dict[str, list[dict[str, Any]]] = {}
    step_dicts: list[tuple[int, dict[str, Any]]] = []
    for line_no, rec in decoded:
        apply_mapping(rec, mapping)
        kind = rec.get("kind")
        if kind is None and "step" in rec and any(k in rec for k in ("loss", "acc", "lr")):
            kind = "step"
        if kind == "step":
            step_dicts.append((line_no, rec))
        elif isinstance(kind, str):
            rec["_line"] = line_no
            records.setdefault(kind, []).append(rec)
    table = _build_table(fast_rows, step_dicts, records, data)
    run_start = records["run_start"][-1] if records.get("run_start") else None
    config = run_start.get("config") if run_start else None
    return RunLog(
        source=source,
        steps=table,
        run_start=run_start,
        config=config if isinstance(config, dict) else None,
        records=records,
    )


def _decode(raw: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return rec if isinstance(rec, dict) else None


def apply_mapping(rec: dict[str, Any], mapping: dict[str, str]) -> None:
    """Rename a foreign record's fields to ours in place (--map first, then the common aliases)."""
    for ours, theirs in mapping.items():
        if theirs in rec:
            rec[ours] = rec[theirs]
    for ours, names in ALIASES.items():
        if ours not in rec:
            for name in names:
                if name in rec:
                    rec[ours] = rec[name]
                    break


def _number(value: Any) -> float:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return math.nan
    return math.nan


def _flagged(rec: dict[str, Any]) -> tuple[str, ...]:
    """Fields our writer found non-finite and wrote as null (the record's `nonfinite` list)."""
    flagged = rec.get(fastjson.FLAGGED)
    return tuple(str(f) for f in flagged) if isinstance(flagged, list) else ()


def _slow_columns(step_dicts: list[tuple[int, dict[str, Any]]]) -> dict[str, np.ndarray]:
    cols: dict[str, np.ndarray] = {}
    dicts = [d for _, d in step_dicts]
    for name in STEP_FIELDS:
        values = [d.get(name) for d in dicts]
        flagged = [name in _flagged(d) for d in dicts] if name in fastjson.NAN_WATCH else []
        if all(v is None for v in values) and not any(flagged):
            continue
        try:
            cols[name] = np.array(values, dtype=np.float64)
        except (TypeError, ValueError):
            cols[name] = np.array([_number(v) for v in values], dtype=np.float64)
        if flagged:
            cols[name + fastjson.NAN_SUFFIX] = np.array(
                [(isinstance(v, float) and math.isnan(v)) or f for v, f in zip(values, flagged, strict=True)],
                dtype=np.float64,
            )
    return cols


def _build_table(
    fast: fastjson.FastRows | None,
    step_dicts: list[tuple[int, dict[str, Any]]],
    records: dict[str, list[dict[str, Any]]],
    data: bytes | None = None,
) -> StepTable:
    """Merge fast-parsed and json-parsed step rows back into file order."""
    slow_cols = _slow_columns(step_dicts)
    slow_lines = np.array([n for n, _ in step_dicts], dtype=np.int64)
    slow_single = np.full(len(step_dicts), MISSING_BUCKET, dtype=np.int64)
    multi: dict[int, list[int]] = {}
    n_fast = len(fast.lines) if fast is not None else 0
    for i, (_, d) in enumerate(step_dicts):
        items = _bucket_list(d.get("buckets"))
        if len(items) == 1:
            slow_single[i] = items[0]
        elif items:
            multi[n_fast + i] = items
    if fast is not None and n_fast and not step_dicts:
        lines, cols, single = fast.lines, dict(fast.cols), fast.single_bucket
        for i, items in enumerate(fast.multi_buckets or []):
            if len(items) > 1:
                multi[i] = items
    elif fast is not None and n_fast:
        lines = np.concatenate([fast.lines, slow_lines])
        n_slow = len(slow_lines)
        cols = {
            name: np.concatenate(
                [
                    fast.cols.get(name, np.full(n_fast, np.nan)),
                    slow_cols.get(name, np.full(n_slow, np.nan)),
                ]
            )
            for name in set(fast.cols) | set(slow_cols)
        }
        single = np.concatenate([fast.single_bucket, slow_single])
        for i, items in enumerate(fast.multi_buckets or []):
            if len(items) > 1:
                multi[i] = items
    else:
        lines, cols, single = slow_lines, slow_cols, slow_single
    order = np.argsort(lines, kind="stable")
    inverse = np.empty(len(order), dtype=np.int64)
    inverse[order] = np.arange(len(order))
    if not np.array_equal(order, np.arange(len(order))):
        cols = {name: col[order] for name, col in cols.items()}
    lazy = {name: _lazy_column(data, cols, name) for name in fastjson.LAZY if name + fastjson.SPAN_START in cols}
    if "step" not in cols or not np.isfinite(cols["step"]).any():
        cols["step"] = np.arange(1, len(order) + 1, dtype=np.float64)
    bucket, bucket_seq, bucket_row = _bucket_columns(single[order], {int(inverse[i]): v for i, v in multi.items()})
    world = _world_sizes(lines[order], records)
    if world is not None:
        cols["world_size"] = world

    reasons = {
        int(inverse[n_fast + i]): str(d["skip_reason"]) for i, (_, d) in enumerate(step_dicts) if d.get("skip_reason")
    }
    acc_pos = fast.acc_per_pos if fast is not None else None
    if acc_pos is None:
        acc_pos = _mean_profile([d.get("acc_per_pos") for _, d in step_dicts[-500:]])
    return StepTable(
        cols=cols,
        bucket=bucket,
        bucket_seq=bucket_seq,
        bucket_row=bucket_row,
        segment=_segments(cols["step"], lines[order], records),
        skip_reasons=reasons,
        acc_per_pos=acc_pos,
        lazy=lazy,
    )


def _lazy_column(data: bytes | None, cols: dict[str, np.ndarray], name: str) -> Callable[[], np.ndarray]:
    """Take a lazy column's byte spans out of `cols`; the thunk parses them (rows from json keep theirs)."""
    starts, ends = cols.pop(name + fastjson.SPAN_START), cols.pop(name + fastjson.SPAN_END)
    parsed = cols.pop(name, None)

    def load() -> np.ndarray:
        out = parsed.copy() if parsed is not None else np.full(len(starts), np.nan)
        rows = np.flatnonzero(np.isfinite(starts))
        if len(rows) and data is not None:
            out[rows] = fastjson.parse_spans(data, starts[rows], ends[rows], name)
        return out

    return load


def _bucket_list(value: Any) -> list[int]:
    if isinstance(value, list):
        return [int(v) for v in value if isinstance(v, int | float) and not isinstance(v, bool)]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return [int(value)]
    return []


def _bucket_columns(single: np.ndarray, multi: dict[int, list[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-row bucket (or MIXED_BUCKET) and the flat micro-batch bucket sequence with its rows."""
    bucket = single.copy()
    if not multi:
        rows = np.flatnonzero(bucket >= 0)
        return bucket, bucket[rows], rows
    seq: list[int] = []
    rows_out: list[int] = []
    for i, b in enumerate(single.tolist()):
        items = multi.get(i)
        if items is None:
            if b >= 0:
                seq.append(b)
                rows_out.append(i)
            continue
        bucket[i] = items[0] if all(x == items[0] for x in items) else MIXED_BUCKET
        seq.extend(items)
        rows_out.extend([i] * len(items))
    return bucket, np.array(seq, dtype=np.int64), np.array(rows_out, dtype=np.int64)


def _mean_profile(profiles: list[Any]) -> np.ndarray | None:
    good = [p for p in profiles if isinstance(p, list) and p]
    if not good:
        return None
    width = len(good[-1])
    rows = [[_number(v) for v in p] for p in good if len(p) == width]
    return np.nanmean(np.array(rows, dtype=np.float64), axis=0)


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
