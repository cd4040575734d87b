"""Terminal rendering of findings: a ranked, coloured summary that fits one screen."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from blockdraft.doctor import schedule
from blockdraft.doctor.findings import Finding, severity_counts
from blockdraft.doctor.run import LoggedRun

STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}

def unchecked(run: LoggedRun) -> dict[str, str]:
    """Checks that could not run (or ran only in part) on this log, with what they lack.

    Shown under every report so nobody mistakes silence for health.
    """
    t = run.steps
    has = {name for name in t.cols if t.has(name)}
    config_hint = " (pass --config)" if run.config_source is None else ""
    needs: dict[str, list[str]] = {}

    def need(code: str, ok: bool, what: str) -> None:
        if not ok:
            needs.setdefault(code, []).append(what)

    need("accuracy_cliff", "acc" in has, "an accuracy field")
    need("warmup_first_step", "lr" in has, "an lr field")
    first = t.steps[0] if len(t) else 0
    need("warmup_first_step", first <= 1, f"the first updates (log starts at step {int(first)})")
    need("lr_schedule_mismatch", "lr" in has, "an lr field")
    need("lr_schedule_mismatch", schedule.expected_lr(run, np.ones(1)) is not None,
         "peak lr, warmup and total steps" + config_hint + "; only restarts were looked for")
    need("noise_schedule_flat", "noise_std" in has, "a noise_std field")
    noise_known = isinstance(run.setting("noise", "std"), int | float)
    need("noise_schedule_flat", noise_known, "the noise settings" + config_hint)
    need("optimizer_betas", run.setting("optim", "betas") is not None, "the Adam betas" + config_hint)
    gamma_known = isinstance(run.setting("loss", "gamma"), int | float) or (run.ours and run.config is not None)
    need("loss_decay_gamma", gamma_known, "the loss decay gamma" + config_hint)
    need("loss_decay_gamma", run.block_size is not None, "the block size" + config_hint)
    need("queue_drain", "queue_depth" in has, "a queue depth field")
    need("data_wait", {"data_wait", "step_time"} <= has, "data_wait and step_time fields")
    need("late_recompile", "graphs_compiled" in has, "a graphs_compiled field")
    need("epoch_accounting", bool(has & {"epoch", "epoch_pos", "epoch_progress", "progress"}), "an epoch field")
    need("tau_gap", bool(run.of_kind("eval")), "eval records")
    need("data_repetition", "epoch" in has, "an epoch field")
    need("checkpoint_stall", bool(run.of_kind("checkpoint")) or "time" in has, "checkpoint records or time stamps")
    need("logging_gap", "time" in has, "time stamps (only step gaps were looked for)")
    need("homogeneous_batches", "loss" in has or len(t.bucket_seq) > 0, "bucket ids or a loss field")
    single = int(np.sum(np.diff(t.steps) == 1)) if len(t) > 1 else 0
    need("homogeneous_batches", len(t.bucket_seq) > 0 or "loss" not in has or single >= 200,
         "bucket ids, or 200+ records of one step each (a window's average blurs the loss levels)")
    return {code: "; ".join(what) for code, what in needs.items()}


def describe(run: LoggedRun) -> str:
    t = run.steps
    parts = [f"{len(t)} step records"]
    if len(t):
        parts[0] += f" (steps {int(t.steps[0])}..{int(t.steps[-1])})"
    for kind in ("checkpoint", "eval", "skip", "rollback"):
        if run.of_kind(kind):
            parts.append(f"{len(run.of_kind(kind))} {kind}")
    if run.log_format != "jsonl":
        parts.append(f"read as {run.log_format}")
    if run.mapped:
        parts.append("fields read as " + ", ".join(f"{ours}<-{theirs}" for ours, theirs in run.mapped.items()))
    if run.config_source:
        read = ", ".join(f"{ours}<-{key}" for ours, key in run.config_read.items()) or "none recognised"
        parts.append(f"settings from {run.config_source}: {read}")
    elif run.config is None:
        parts.append("no config (settings checks off; pass --config)")
    if run.truncated_tail:
        parts.append("last line truncated (ignored)")
    if run.bad_lines:
        parts.append(f"{run.bad_lines} unreadable lines skipped")
    return ", ".join(parts)


def print_report(run: LoggedRun, findings: list[Finding], console: Any = None) -> None:
    console = console or Console(highlight=False, width=None if sys.stdout.isatty() else 140)
    console.print(Text(f"{run.source}: ", style="bold") + Text(describe(run)))
    if not findings:
        console.print(Text("no findings: nothing unusual in what this log records", style="green"))
    else:
        table = Table(show_header=True, header_style="bold", expand=False, show_lines=False)
        for column in ("severity", "code", "steps", "finding"):
            table.add_column(column, justify="right" if column == "steps" else "left")
        for f in findings:
            finding = Text(f.summary) + Text(f"\n-> {f.advice}", style="dim")
            table.add_row(Text(f.severity, style=STYLE[f.severity]), f.code, f.step_text(), finding)
        console.print(table)
        console.print(", ".join(f"{n} {s}" for s, n in severity_counts(findings).items()))
    missing = unchecked(run)
    if missing:
        console.print(Text("not checked:", style="dim"))
        for code, what in missing.items():
            console.print(Text(f"  {code}: needs {what}", style="dim"))


def finding_line(f: Finding) -> str:
    """One plain line per finding, for `doctor --follow` (the trainer's console writes its own)."""
    return f"[doctor] {f.severity.upper()} {f.code} @ step {f.step_text()}: {f.summary}"
