"""Terminal rendering of findings: a ranked, coloured summary that fits one screen."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from blockdraft.doctor.findings import Finding
from blockdraft.doctor.records import RunLog

STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}

# Fields or records each check needs; shown when a log lacks them so nobody mistakes silence for health.
NEEDS: dict[str, tuple[str, ...]] = {
    "accuracy_cliff": ("acc",),
    "checkpoint_stall": ("checkpoint records",),
    "homogeneous_batches": ("buckets",),
    "warmup_first_step": ("lr",),
    "lr_schedule_mismatch": ("lr",),
    "noise_schedule_flat": ("noise_std", "config"),
    "optimizer_betas": ("config",),
    "loss_decay_gamma": ("config",),
    "queue_drain": ("queue_depth",),
    "data_wait": ("data_wait", "step_time"),
    "epoch_accounting": ("epoch_progress",),
    "tau_gap": ("eval records",),
    "logging_gap": ("time",),
}


def unchecked(run: RunLog) -> dict[str, str]:
    """Checks that could not run on this log, with the missing input."""
    have = {name for name in run.steps.cols if run.steps.has(name)}
    if len(run.steps.bucket_seq):
        have.add("buckets")
    if run.config:
        have.add("config")
    for kind in ("checkpoint", "eval"):
        if run.of_kind(kind):
            have.add(f"{kind} records")
    out = {}
    for code, needs in NEEDS.items():
        missing = [n for n in needs if n not in have]
        if missing:
            out[code] = ", ".join(missing)
    return out


def describe(run: RunLog) -> str:
    t = run.steps
    parts = [f"{len(t)} step records"]
    if len(t):
        parts[0] += f" (steps {int(t.steps[0])}..{int(t.steps[-1])})"
    for kind in ("checkpoint", "eval", "skip", "rollback"):
        if run.of_kind(kind):
            parts.append(f"{len(run.of_kind(kind))} {kind}")
    if run.run_start is None:
        parts.append("no run_start (config checks off)")
    if run.truncated_tail:
        parts.append("last line truncated (ignored)")
    if run.bad_lines:
        parts.append(f"{run.bad_lines} unreadable lines skipped")
    return ", ".join(parts)


def print_report(run: RunLog, findings: list[Finding], console: Any = None) -> None:
    console = console or Console(highlight=False, width=None if sys.stdout.isatty() else 140)
    console.print(Text(f"{run.source}: ", style="bold") + Text(describe(run)))
    if not findings:
        console.print(Text("no findings: nothing unusual in what this log records", style="green"))
    else:
        table = Table(show_header=True, header_style="bold", expand=False, show_lines=False)
        table.add_column("severity")
        table.add_column("code")
        table.add_column("steps", justify="right")
        table.add_column("finding")
        for f in findings:
            steps = f"{f.steps[0]}" if f.steps[0] == f.steps[1] else f"{f.steps[0]}-{f.steps[1]}"
            table.add_row(
                Text(f.severity, style=STYLE[f.severity]),
                f.code,
                steps,
                Text(f.summary) + Text(f"\n-> {f.advice}", style="dim"),
            )
        console.print(table)
        counts = {s: sum(f.severity == s for f in findings) for s in ("error", "warning", "info")}
        console.print(", ".join(f"{n} {s}" for s, n in counts.items() if n))
    missing = unchecked(run)
    if missing:
        console.print(Text("not checked: " + "; ".join(f"{c} (needs {m})" for c, m in missing.items()), style="dim"))


def finding_line(f: Finding) -> str:
    """One plain line per finding, for --follow and the trainer's console."""
    return f"[doctor] {f.severity.upper()} {f.code} @ steps {f.steps[0]}-{f.steps[1]}: {f.summary}"
