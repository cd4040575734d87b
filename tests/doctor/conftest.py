"""Shared helpers: synthetic runs written to tmp files and analysed through the public loader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blockdraft.doctor.detectors import diagnose
from blockdraft.doctor.fields import parse_mapping
from blockdraft.doctor.findings import Finding
from blockdraft.doctor.readers import load_run
from blockdraft.doctor.records import parse_log_bytes
from blockdraft.doctor.run import LoggedRun
from tests.doctor import synthetic


def analyse(tmp_path: Path, run: synthetic.SyntheticRun) -> tuple[LoggedRun, list[Finding]]:
    path = run.write(tmp_path / "log.jsonl")
    log = load_run(path, parse_mapping(run.mapping))
    return log, diagnose(log)


def write_records(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def find(findings: list[Finding], code: str) -> list[Finding]:
    return [f for f in findings if f.code == code]


def log_of(records: list[dict]) -> LoggedRun:
    """A LoggedRun parsed from records in memory, as the doctor reads a log file."""
    return parse_log_bytes("".join(json.dumps(r) + "\n" for r in records).encode(), {})


def step_records(n: int, dt: float = 1.0, start: int = 1, t0: float = 0.0) -> list[dict]:
    """n `step` records, one every dt seconds, each with a loss of 1."""
    return [
        {"kind": "step", "step": i, "time": t0 + dt * (i - start), "step_time": dt, "loss": 1.0}
        for i in range(start, start + n)
    ]


def codes(findings: list[Finding], at_least: str = "info") -> set[str]:
    from blockdraft.doctor.findings import at_least as level_ok

    return {f.code for f in findings if level_ok(f.severity, at_least)}


@pytest.fixture
def run_factory(tmp_path: Path):
    def make(seed: int, anomalies: tuple[str, ...] = (), n_steps: int = 2500, style: str | None = "ours"):
        run = synthetic.generate(seed, anomalies=anomalies, n_steps=n_steps, style=style)
        log, findings = analyse(tmp_path, run)
        return run, log, findings

    return make
