"""The epoch bookkeeping detector: progress and epoch counters against the batches the log shows."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from blockdraft.doctor import schedule, stats
from blockdraft.doctor.context import Context
from blockdraft.doctor.findings import Finding


def epoch_accounting(ctx: Context) -> Iterator[Finding]:
    t = ctx.t
    rows = np.flatnonzero(t.first_segment & np.isfinite(ctx.step))
    if len(rows) < 50:
        return
    if t.has("epoch_pos"):
        yield from _fractional_epoch(ctx, rows)
        return
    steps = ctx.step[rows]
    problems: list[str] = []
    evidence: dict[str, float] = {}
    epochs_cfg = ctx.run.setting("train", "epochs")
    epoch, ep, prog = t.get("epoch")[rows], t.get("epoch_progress")[rows], t.get("progress")[rows]
    implied_spe = math.nan
    if np.isfinite(ep).sum() >= 50:
        if np.nanmax(ep) > 1.0001 or np.nanmin(ep) < -1e-6:
            problems.append(f"epoch_progress leaves [0, 1] (range {np.nanmin(ep):.3g}..{np.nanmax(ep):.3g})")
        if np.isfinite(epoch).any() and (np.diff(epoch[np.isfinite(epoch)]) < 0).any():
            problems.append("the epoch counter goes backwards within one run segment")
        slope = schedule.epochs_per_step(ctx.run)
        if slope > 0:
            implied_spe = 1.0 / slope
            evidence["steps_per_epoch_from_epoch"] = implied_spe
    implied_total = math.nan
    epoch_is_progress = False
    if np.isfinite(prog).sum() >= 50:
        slope = stats.slope(steps[np.isfinite(prog)], prog[np.isfinite(prog)])
        if slope > 0:
            implied_total = 1.0 / slope
            evidence["total_steps_from_progress"] = implied_total
        if np.isfinite(ep).sum() >= 50:
            both = np.isfinite(ep) & np.isfinite(prog)
            same = np.nanmax(np.abs(ep[both] - prog[both])) < 1e-6
            epoch_is_progress = bool(same and isinstance(epochs_cfg, int | float) and epochs_cfg > 1)
            if epoch_is_progress:
                problems.append(f"epoch_progress equals progress of the whole run although epochs={epochs_cfg:g}")
    total = ctx.run.run_value("total_steps")
    replanned = bool(ctx.run.schedule_plans)  # progress counted against each plan in turn, by design
    if isinstance(total, int | float) and total > 0 and math.isfinite(implied_total) and not replanned:
        evidence["total_steps"] = float(total)
        if abs(implied_total / total - 1) > 0.1:
            problems.append(f"progress implies {implied_total:.0f} total steps but run_start says {total:.0f}")
    start = (ctx.run.of_kind("run_start") or [{}])[0]  # the segment checked here is the first run's
    bpe = start.get("batches_per_epoch")
    if isinstance(bpe, int | float) and bpe > 0 and math.isfinite(implied_spe):
        accum = ctx.run.setting("train", "grad_accum") or 1
        world = start.get("world_size") or 1
        candidates = {float(bpe), bpe / accum, bpe / world, bpe / (accum * world)}
        evidence["batches_per_epoch"] = float(bpe)
        if min(abs(implied_spe / c - 1) for c in candidates if c > 0) > 0.1:
            problems.append(
                f"epochs advance every {implied_spe:.0f} steps but batches_per_epoch={bpe:g} "
                f"(grad_accum={accum}, world_size={world})"
            )
    # not after a re-plan: a time budget ends the run before its epochs, by design
    implied = math.isfinite(implied_spe) and math.isfinite(implied_total) and not replanned
    if isinstance(epochs_cfg, int | float) and ctx.run.setting("train", "max_steps") is None and implied:
        expected_total = implied_spe * epochs_cfg
        evidence["total_steps_from_epochs"] = expected_total
        if abs(expected_total / implied_total - 1) > 0.1 and not epoch_is_progress:
            problems.append(
                f"{epochs_cfg:g} epochs of {implied_spe:.0f} steps make {expected_total:.0f} steps, "
                f"but progress counts to {implied_total:.0f}"
            )
    yield from _finding(
        ctx, rows, problems, "epoch bookkeeping is inconsistent: " + "; ".join(problems), evidence,
        "Count epochs in optimizer steps of this run (batches / grad_accum / world size) and log "
        "epoch_progress per epoch and progress per run; LR schedules and ETAs built on a wrong count "
        "are wrong too.",
    )


def _finding(
    ctx: Context, rows: np.ndarray, problems: list[str], summary: str, evidence: dict[str, float], advice: str
) -> Iterator[Finding]:
    """The epoch_accounting finding over the checked rows, weighted by its problems; none without any."""
    if problems:
        yield Finding(
            code="epoch_accounting", severity="warning", steps=(ctx.step_at(rows[0]), ctx.step_at(rows[-1])),
            summary=summary, evidence=evidence, advice=advice, weight=float(len(problems)),
        )


def _fractional_epoch(ctx: Context, rows: np.ndarray) -> Iterator[Finding]:
    """A foreign log's fractional `epoch`: which fraction it is (of one epoch or of the run), said plainly.
    Steps per epoch come from its slope, the run's length from the config or else from where the logged LR
    decay ends. A value below 1 while the run has several epochs is the fraction of ONE epoch."""
    pos = ctx.t.get("epoch_pos")[rows]
    updates = ctx.update[rows]
    ok = np.isfinite(pos)
    slope = schedule.epochs_per_step(ctx.run)
    if not slope > 0:
        return
    per_epoch = 1.0 / slope
    last_row = rows[np.flatnonzero(ok)[-1]]
    last, at = float(ctx.t.get("epoch_pos")[last_row]), ctx.step_at(last_row)
    total = schedule.total_steps(ctx.run)
    total_from = "the run's settings"
    if total is None and math.isfinite(ctx.lr_schedule_end):
        total, total_from = int(ctx.lr_schedule_end), "the LR schedule's decay"
    epochs_cfg = ctx.run.setting("train", "epochs")
    epochs_cfg = float(epochs_cfg) if isinstance(epochs_cfg, int | float) and epochs_cfg > 0 else None
    evidence: dict[str, float] = {"steps_per_epoch_from_epoch": per_epoch, "epoch_at_last": last}
    if total:
        evidence["total_steps"] = float(total)
    if epochs_cfg:
        evidence["configured_epochs"] = epochs_cfg
    cumulative = ctx.run.from_hf_trainer or float(np.nanmax(pos)) > 1.0001
    problems = []
    partial_last = epochs_cfg is not None and total is not None and math.ceil(total / per_epoch) == epochs_cfg
    if epochs_cfg and total and abs(per_epoch * epochs_cfg / total - 1) > 0.15 and not partial_last:
        if abs(per_epoch / total - 1) <= 0.15 and epochs_cfg > 1:
            problems.append(
                f"`epoch` reaches 1 at ~{per_epoch:.0f} steps, the whole run ({total} steps by {total_from}): "
                f"it is the run's progress, not epochs, although the run has {epochs_cfg:g} epochs"
            )
        else:
            problems.append(
                f"`epoch` advances one per {per_epoch:.0f} steps, so {epochs_cfg:g} epochs make "
                f"{per_epoch * epochs_cfg:.0f} steps, but {total_from} says {total}"
            )
    elif not cumulative:
        epochs = epochs_cfg or (total / per_epoch if total else None)
        if epochs is not None and epochs >= 1.5:
            run_share = 100.0 * float(updates[np.flatnonzero(ok)[-1]]) / (per_epoch * epochs)
            source = f"epochs={epochs_cfg:g}" if epochs_cfg else f"{total_from} (~{total} steps)"
            problems.append(
                f"`epoch` = {last:.2f} at step {at} is the fraction of ONE epoch, not of the run: "
                f"{per_epoch:.0f} steps per epoch and {epochs:.0f} epochs by {source}, so the run is "
                f"{run_share:.1f}% done, not {100 * last:.0f}%"
            )
            evidence["run_progress_pct"] = run_share
    yield from _finding(
        ctx, rows, problems, "; ".join(problems), evidence,
        "Log the epoch as an integer plus epoch_progress (0..1 of this epoch) and progress (0..1 of the "
        "run), counted in optimizer steps (batches / grad_accum / world size); warmup, LR schedule and ETA "
        "estimates built on a misread epoch are off by the number of epochs.",
    )
