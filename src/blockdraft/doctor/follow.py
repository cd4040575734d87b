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
from blockdraft.telemetry.log import decode_record


def follow(
    path: str, mapping: dict[str, str], as_json: bool = False, poll_s: float = 1.0,
    stop: Callable[[], bool] | None = None, emit: Callable[[str], Any] = print, settings: dict[str, Any] | None = None,
) -> list[Finding]:
    """Print findings as they appear until the run writes run_end (or `stop()` says so).

    `settings` (from --config) are laid over the log's own config for every analysis."""
    log_path = resolve_log_path(path)
    data = log_path.read_bytes()
    offset = data.rfind(b"\n") + 1
    head = data[:offset]  # the complete lines: a partial last one is read again by the tail
    shown: list[Finding] = []

    def show(found: list[Finding]) -> None:
        shown.extend(found)
        for f in found:
            emit(json.dumps(f.to_dict()) if as_json else finding_line(f))

    doctor = LiveDoctor(config=settings, mapping=mapping, min_severity="info")
    if offset:
        run = parse_log_bytes(head, mapping, source=str(log_path))
        if settings:
            run.config = merge(run.config, settings)
        show(diagnose(run))
        doctor = LiveDoctor(config=run.config, run_start=run.run_start, mapping=mapping, min_severity="info")
        doctor.mark_reported(shown)
        doctor.prime([rec for line in head.splitlines()[-doctor.window :] if (rec := decode_record(line)) is not None])
        if run.of_kind("run_end") and run.of_kind("run_end")[-1].get("_line", -1) >= head.count(b"\n") - 1:
            return shown  # the run ended on the last line: nothing more will come
    for rec in tail_records(log_path, poll_s=poll_s, stop=stop, start_at=offset):
        show(doctor.observe(rec))
        if rec.get("kind") == "run_end":
            break
    return shown
