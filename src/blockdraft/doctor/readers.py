"""Find and read the training log a user points at, whichever trainer wrote it.

Formats: blockdraft's log.jsonl; any JSONL of per-step (or windowed) records with common field names
(see `fields.ALIASES`, `--map` for the rest); a Hugging Face `trainer_state.json`, checkpoint folder or
output folder; a W&B CSV export or `wandb-history.jsonl`; TensorBoard event files (needs the optional
`tensorboard` package). Each reader turns its format into plain records for `records.run_from_records`.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

from blockdraft.doctor.records import FORMATS, parse_log_bytes, run_from_records
from blockdraft.doctor.run import LoggedRun
from blockdraft.errors import UserError

TB_PREFIX = "events.out.tfevents"
HF_SKIP = ("train_runtime", "eval_runtime", "eval_loss")  # keys of summary and eval entries, not training steps


def load_run(path: str | Path, mapping: dict[str, str] | None = None) -> LoggedRun:
    """Read a log file or run folder of any supported format; a truncated last line is dropped, not fatal."""
    kind, target = locate(Path(path))
    mapping = mapping or {}
    if kind in READERS:
        run = READERS[kind](target, mapping)
    else:
        run = parse_log_bytes(_read_bytes(target), mapping, source=str(target))
        if target.name.endswith("wandb-history.jsonl"):
            run.log_format = "wandb"
    if not len(run.steps) and not run.records:
        raise UserError(f"{target}: no training records found; blockdraft doctor reads {FORMATS}")
    return run


def locate(path: Path) -> tuple[str, Path]:
    """(format, file or folder to read) for what the user named."""
    if not path.exists():
        raise UserError(f"{path}: no such file or folder")
    if path.is_dir():
        return _locate_in(path)
    if not path.is_file():
        raise UserError(f"{path}: not a regular file")
    if path.name.startswith(TB_PREFIX):
        return "tensorboard", path
    if path.suffix == ".csv":
        return "csv", path
    if path.suffix == ".json" and _is_trainer_state(path):
        return "hf", path
    return "jsonl", path


def resolve_log_path(path: str | Path) -> Path:
    """The JSONL file behind a path (for --follow, which tails a growing JSONL log)."""
    kind, target = locate(Path(path))
    if kind != "jsonl":
        raise UserError(f"{target}: --follow needs a JSONL log, this is a {kind} log")
    return target


def _locate_in(folder: Path) -> tuple[str, Path]:
    for name in ("log.jsonl", "wandb-history.jsonl", "files/wandb-history.jsonl"):
        if (folder / name).is_file():
            return "jsonl", folder / name
    if (folder / "trainer_state.json").is_file():
        return "hf", folder / "trainer_state.json"
    checkpoints = sorted(
        (int(m.group(1)), p / "trainer_state.json")
        for p in folder.glob("checkpoint-*")
        if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and (p / "trainer_state.json").is_file()
    )
    if checkpoints:
        return "hf", checkpoints[-1][1]
    if any(folder.rglob(f"{TB_PREFIX}*")):
        return "tensorboard", folder
    for suffix, kind in ((".jsonl", "jsonl"), (".csv", "csv")):
        found = sorted(folder.glob(f"*{suffix}"))
        if len(found) == 1:
            return kind, found[0]
    raise UserError(f"{folder}: no training log in this folder; blockdraft doctor reads {FORMATS}")


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror}") from None


def _is_trainer_state(path: Path) -> bool:
    data = _read_bytes(path)
    return data.lstrip().startswith(b"{") and b'"log_history"' in data


def _read_hf(path: Path, mapping: dict[str, str]) -> LoggedRun:
    """A Trainer's `log_history`: one entry per logging step (losses averaged over logging_steps)."""
    try:
        state = json.loads(_read_bytes(path))
    except ValueError as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise UserError(f"{path}: no log_history; blockdraft doctor reads {FORMATS}")
    steps = [entry for entry in history if isinstance(entry, dict) and not any(k in entry for k in HF_SKIP)]
    return run_from_records([_hf_run_start(state), *steps], mapping, source=str(path), log_format="hf")


def _hf_run_start(state: dict[str, Any]) -> dict[str, Any]:
    train: dict[str, Any] = {}
    if isinstance(state.get("num_train_epochs"), int | float):
        train["epochs"] = state["num_train_epochs"]
    if isinstance(state.get("save_steps"), int | float) and state["save_steps"] > 0:
        train["save_every"] = state["save_steps"]
    start: dict[str, Any] = {"kind": "run_start", "step": 0, "config": {"train": train}}
    if isinstance(state.get("max_steps"), int | float) and state["max_steps"] > 0:
        start["total_steps"] = int(state["max_steps"])
    return start


def _read_csv(path: Path, mapping: dict[str, str]) -> LoggedRun:
    """A W&B export: run history (`_step`, metric columns) or a chart export (`Step`, `run - metric`)."""
    text = _read_bytes(path).decode("utf-8", errors="replace")
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames or len(reader.fieldnames) < 2:
        raise UserError(f"{path}: not a CSV with a header row; blockdraft doctor reads {FORMATS}")
    names = {col: col.rsplit(" - ", 1)[-1] for col in reader.fieldnames if not col.endswith(("__MIN", "__MAX"))}
    cells = ({name: _cell(row.get(col)) for col, name in names.items()} for row in reader)
    records = [{k: v for k, v in rec.items() if v is not None} for rec in cells]
    return run_from_records(records, mapping, source=str(path), log_format="wandb-csv")


def _cell(text: str | None) -> Any:
    if text is None or text.strip() in ("", "null", "None"):
        return None
    try:
        return float(text)
    except ValueError:
        return text


def _read_tensorboard(path: Path, mapping: dict[str, str]) -> LoggedRun:
    """Scalars of every event file under `path`, one record per step (wall time of its last scalar)."""
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        from tensorboard.util import tensor_util
    except ImportError:
        raise UserError(
            "reading TensorBoard event files needs the tensorboard package: pip install 'blockdraft[tensorboard]'"
        ) from None
    files = [path] if path.is_file() else sorted(path.rglob(f"{TB_PREFIX}*"))
    by_step: dict[int, dict[str, Any]] = {}
    for file in files:
        try:
            events = list(EventFileLoader(str(file)).Load())
        except Exception as exc:  # the loader raises its own error types for a damaged file
            raise UserError(f"{file}: not a readable TensorBoard event file ({exc})") from None
        for event in events:
            for value in event.summary.value:
                number = _tb_scalar(value, tensor_util)
                if number is None:
                    continue
                rec = by_step.setdefault(int(event.step), {"step": int(event.step)})
                rec[value.tag] = number
                rec["time"] = max(float(event.wall_time), rec.get("time", 0.0))
    records = [by_step[s] for s in sorted(by_step)]
    return run_from_records(records, mapping, source=str(path), log_format="tensorboard")


def _tb_scalar(value: Any, tensor_util: Any) -> float | None:
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if value.HasField("tensor"):
        array = tensor_util.make_ndarray(value.tensor)
        if array.size == 1 and array.dtype.kind in "fiu":
            return float(array.reshape(()))
    return None


READERS = {"hf": _read_hf, "csv": _read_csv, "tensorboard": _read_tensorboard}  # any other kind is JSONL
