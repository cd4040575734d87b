"""`blockdraft doctor --follow`: diagnose what a log holds now, then watch it grow."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from blockdraft.doctor.config_file import merge
from blockdraft.doctor.console import finding_line
from blockdraft.doctor.detectors import diagnose
from blockdraft.doctor.findings import Finding
from blockdraft.doctor.live import LiveDoctor, tail_records
from blockdraft.doctor.readers import resolve_log_path
from blockdraft.doctor.records import parse_log_bytes


def follow(
    path: str,
    mapping: dict[str, str],
    as_json: bool = False,
    poll_s: float = 1.0,
    stop: Callable[[], bool] | None = None,
    emit: Callable[[str], Any] = print,
    settings: dict[str, Any] | None = None,
) -> list[Finding]:
    """Print findings as they appear until the run writes run_end (or `stop()` says so).

    `settings` (from --config) are laid over the log's own config for every analysis."""
    log_path = resolve_log_path(path)
    data = log_path.read_bytes()
    offset = data.rfind(b"\n") + 1
    shown: list[Finding] = []
    doctor = LiveDoctor(config=settings, mapping=mapping, min_severity="info")
    if offset:
        run = parse_log_bytes(data[:offset], mapping, source=str(log_path))
        if settings:
            run.config = merge(run.config, settings)
        shown = diagnose(run)
        for f in shown:
            emit(json.dumps(f.to_dict()) if as_json else finding_line(f))
        doctor = LiveDoctor(config=run.config, run_start=run.run_start, mapping=mapping, min_severity="info")
        doctor.mark_reported(shown)
        tail = data[:offset].splitlines()[-doctor.window :]
        doctor.prime([json.loads(line) for line in tail if line.strip().startswith(b"{") and _valid(line)])
        if run.of_kind("run_end") and run.of_kind("run_end")[-1].get("_line", -1) >= _last_line(data[:offset]):
            return shown
    for rec in tail_records(log_path, poll_s=poll_s, stop=stop, start_at=offset):
        for f in doctor.observe(rec):
            shown.append(f)
            emit(json.dumps(f.to_dict()) if as_json else finding_line(f))
        if rec.get("kind") == "run_end":
            break
    return shown


def _valid(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _last_line(data: bytes) -> int:
    return data.count(b"\n") - 1
