"""Detectors on time the loop lost: checkpoint stalls, logging gaps, metric windows that span them,
graphs compiled after warm-up."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from blockdraft.doctor import stats
from blockdraft.doctor.context import Context, shared
from blockdraft.doctor.findings import Finding, plural

UNEXPLAINED_STALL_S = 30.0
BIG_STALL_S = 300.0
COSTLY_STALL_S = 120.0
CHECKPOINT_STALL_S = 10.0
ROUND_STEPS = 500
WARMUP_UPDATES = 20  # a process compiles its graphs in its first updates; later growth is a recompile


def checkpoint_stall_limit(seconds_per_step: float) -> float:
    """How long a checkpoint may hold the loop before it is a stall: 10 s, or 5 typical updates."""
    return max(CHECKPOINT_STALL_S, 5.0 * seconds_per_step) if math.isfinite(seconds_per_step) else CHECKPOINT_STALL_S


@shared
def _gaps(ctx: Context) -> dict[str, np.ndarray]:
    """Per row: records missing before it, and wall time beyond what its steps should have taken."""
    missing = np.where(ctx.gap_rows, np.nan_to_num(ctx.dstep - ctx.stride, nan=0.0), 0.0)
    excess = np.zeros(ctx.n)
    sec = ctx.seconds_per_step
    if math.isfinite(sec) and np.isfinite(ctx.dtime).any():
        excess = np.nan_to_num(ctx.dtime - ctx.dstep * sec, nan=0.0)
    return {"missing": missing, "excess": excess}


def _at_gap_start(markers: np.ndarray, prev_step: np.ndarray, stride: float) -> np.ndarray:
    """For each gap after record `prev_step`, whether scheduled work (a marker step) began right there."""
    if not len(markers):
        return np.zeros(len(prev_step), dtype=bool)
    lo = np.searchsorted(markers, prev_step, side="left")
    hi = np.searchsorted(markers, prev_step + max(1.0, stride), side="right")
    return hi > lo


def checkpoint_stall(ctx: Context) -> Iterator[Finding]:
    ckpts = [r for r in ctx.run.of_kind("checkpoint") if isinstance(r.get("step"), int | float)]
    if not ckpts or ctx.n < 2:
        return
    threshold = checkpoint_stall_limit(ctx.seconds_per_step)
    gaps, prev = _gaps(ctx), ctx.prev_step
    ck_steps = np.array([float(r["step"]) for r in ckpts])
    row_after = np.searchsorted(ctx.step, ck_steps, side="right")
    stalls, missing, logging_only, spans = [], 0, 0, []
    for rec, s, row in zip(ckpts, ck_steps, row_after, strict=True):
        stall = rec.get("stall_s")
        stall = float(stall) if isinstance(stall, int | float) else math.nan
        at_gap = row < ctx.n and s - max(1.0, ctx.stride) <= prev[row] <= s
        lost = float(gaps["missing"][row]) if at_gap else 0.0
        excess = float(gaps["excess"][row]) if at_gap else 0.0
        held = stall if math.isfinite(stall) else excess
        if held >= threshold or lost > 0:
            stalls.append(max(held, 0.0))
            missing += int(lost)
            if lost > 0 and held < threshold:
                logging_only += 1
            spans.append((int(s), int(ctx.step[row]) if row < ctx.n else int(s)))
    if not spans:
        return
    total_time = _run_seconds(ctx)
    worst = max(stalls)
    held = [f"worst {worst:.0f} s"] if worst > 0 else []
    if missing:
        held.append(f"{missing} step records lost")
    parts = [f"{len(spans)} of {len(ckpts)} checkpoints held things up ({', '.join(held)})"]
    if logging_only:
        parts.append(f"in {logging_only} only logging stopped while training went on")
    yield Finding(
        code="checkpoint_stall", severity="warning", steps=(spans[0][0], spans[-1][1]),
        summary="; ".join(parts),
        evidence={
            "stalls": len(spans), "checkpoints": len(ckpts), "max_stall_s": worst,
            "median_stall_s": float(np.median(stalls)), "total_stall_s": float(np.sum(stalls)),
            "share_of_run_time": float(np.sum(stalls)) / total_time if total_time > 0 else math.nan,
            "missing_records": missing, "logging_only": logging_only, "threshold_s": threshold,
        },
        advice=(
            "Stage the state between steps and write it in the background (train.save_every can also "
            "be raised); never let a save block the logger, or the next metric window will mislead."
        ),
        weight=float(np.sum(stalls)) + missing,
        spans=spans,
    )


def _run_seconds(ctx: Context) -> float:
    d = ctx.dtime[np.isfinite(ctx.dtime)]
    return float(d.sum()) if len(d) else math.nan


def logging_gap(ctx: Context) -> Iterator[Finding]:
    """Lost step records and unexplained stalls; pauses on a fixed step period are scheduled work (info)."""
    if ctx.n < 3:
        return
    gaps = _gaps(ctx)
    prev = ctx.prev_step
    explained = _at_gap_start(ctx.marker_steps("checkpoint"), prev, ctx.stride)
    explained |= _at_gap_start(ctx.marker_steps("eval"), prev, ctx.stride)
    explained |= _compiled(ctx) > 0  # late_recompile reports these
    lost = gaps["missing"] > 0
    stalled = gaps["excess"] >= _unexplained_stall_s(ctx)
    rows = np.flatnonzero((lost | stalled) & ~explained)
    pure_stall = rows[~lost[rows]]
    periodic, period = _periodic(prev[pure_stall], ctx.stride)
    scheduled = pure_stall[periodic]
    rest = np.setdiff1d(rows, scheduled)
    if len(rest):
        yield _gap_finding(ctx, rest, _gap_severity(ctx, rest), None)
    if len(scheduled):
        yield _gap_finding(ctx, scheduled, "info", period)


def _gap_severity(ctx: Context, rows: np.ndarray) -> str:
    """Lost records always warn; pure stalls warn when long (5 min, 100 steps' time), frequent, or costly
    (5% of the run's wall time and at least two minutes)."""
    gaps = _gaps(ctx)
    if (gaps["missing"][rows] > 0).any():
        return "warning"
    excess = gaps["excess"][rows]
    sec = ctx.seconds_per_step
    long_stall = max(BIG_STALL_S, 100.0 * sec) if math.isfinite(sec) else BIG_STALL_S
    total = _run_seconds(ctx)
    costly = math.isfinite(total) and excess.sum() >= max(0.05 * total, COSTLY_STALL_S)
    return "warning" if (excess.max() >= long_stall or len(rows) >= 3 or costly) else "info"


def _unexplained_stall_s(ctx: Context) -> float:
    """Excess seconds over a gap's expected time that make it a stall of training, not of logging
    (a checkpoint's stall has its own limit, `checkpoint_stall_limit`)."""
    sec = ctx.seconds_per_step
    return max(UNEXPLAINED_STALL_S, 10.0 * sec) if math.isfinite(sec) else math.inf


def _gap_finding(ctx: Context, rows: np.ndarray, severity: str, period: int | None) -> Finding:
    gaps, prev = _gaps(ctx), ctx.prev_step
    lost = gaps["missing"][rows] > 0
    missing = int(gaps["missing"][rows].sum())
    stall_rows = rows[gaps["excess"][rows] >= _unexplained_stall_s(ctx)]
    only_logging = int(np.sum(lost & ~np.isin(rows, stall_rows)))
    spans = [(int(prev[r]), int(ctx.step[r])) for r in rows]
    gap_s = ctx.dtime[rows]
    longest = float(np.nanmax(gap_s)) if np.isfinite(gap_s).any() else math.nan
    parts = [plural(len(rows), "gap") + " in the log"]
    if math.isfinite(longest):
        parts[0] += f" (longest {longest:.0f} s)"
    if missing:
        went_on = f" ({plural(only_logging, 'gap')} where training went on and only logging stopped)"
        parts.append(plural(missing, "step record") + " missing" + (went_on if only_logging else ""))
    if len(stall_rows):
        parts.append(f"training stalled {len(stall_rows)}x, worst {gaps['excess'][stall_rows].max():.0f} s")
    advice = (
        "Every step must reach the log: write records from the training loop (not a monitor thread) "
        "and flush each line; for stalls, look at what else ran at that time (eval, saves, data)."
    )
    saves = _at_saves(ctx, prev[rows])
    if period:
        parts.append(f"on a {period}-step period, so most likely scheduled evals or saves that wrote no record")
        advice = "Write an eval/checkpoint record for scheduled work so its pauses are accounted for."
    elif saves:
        parts.append(saves)
        advice = (
            "Save in the background (stage the state between steps, write it from another thread) and never "
            "let a save block the logger; a windowed monitor's next record after such a gap misleads."
        )
    return Finding(
        code="logging_gap", severity=severity, steps=(spans[0][0], spans[-1][1]),
        summary="; ".join(parts),
        evidence={
            "gaps": len(rows), "missing_records": missing, "stalls": len(stall_rows),
            "max_stall_s": float(gaps["excess"][stall_rows].max()) if len(stall_rows) else 0.0,
            "logging_only": only_logging, "period_steps": period or math.nan, "longest_gap_s": longest,
        },
        advice=advice,
        weight=float(missing + len(stall_rows) * 10),
        spans=spans,
    )


def _at_saves(ctx: Context, starts: np.ndarray) -> str:
    """Where gaps began at checkpoint steps (save_every, else round multiples of 500), say so."""
    every = ctx.run.setting("train", "save_every")
    tol = 2 * ctx.stride + 1
    if isinstance(every, int | float) and every > 0:
        resid = np.mod(starts, every)
        on = np.minimum(resid, every - resid) <= tol
        if on.any():
            return f"{int(on.sum())} of them at checkpoint steps (save_every={every:g}): the save blocked the logger"
        return ""
    resid = np.mod(starts, ROUND_STEPS)
    if len(starts) and bool(np.all(np.minimum(resid, ROUND_STEPS - resid) <= tol)):
        at = ", ".join(str(int(s)) for s in starts[:5])
        return f"all at round steps ({at}): most likely checkpoint saves that blocked the logger"
    return ""


def _periodic(starts: np.ndarray, stride: float) -> tuple[np.ndarray, int | None]:
    """Gap steps on one lattice k*P + phase: the largest period P >= 100 steps holding >= 3 and >= 75% of them.

    Candidate periods are the spacings between gaps and their integer fractions (evals every 500 steps
    can be seen only at 1000, 3000 and 4500 when the shorter pauses stay under the stall threshold).
    """
    n = len(starts)
    none = np.zeros(n, dtype=bool)
    if n < 3:
        return none, None
    pairs = np.unique(np.abs(starts[:, None] - starts[None, :])[np.triu_indices(n, k=1)])
    candidates = np.unique(np.round((pairs[:, None] / np.arange(1, 9)[None, :]).ravel()))
    candidates = candidates[candidates >= 100][::-1][:400]
    tol = 2 * stride + 2
    for p in candidates:
        resid = np.mod(starts, p)
        dist = np.abs(resid[:, None] - resid[None, :])
        on = np.minimum(dist, p - dist) <= tol + 0.02 * p
        best = int(np.argmax(on.sum(axis=1)))
        if on[best].sum() >= 3 and on[best].sum() >= 0.75 * n:
            return on[best], int(p)
    return none, None


def _compiled(ctx: Context) -> np.ndarray:
    """Graphs each row's update compiled: the growth of `graphs_compiled` (per process) since the row
    before, 0 where it did not grow (a fall starts a new process, a resume, whose count starts again)."""
    if not ctx.t.has("graphs_compiled") or ctx.n < 2:
        return np.zeros(ctx.n)
    with np.errstate(invalid="ignore"):
        growth = np.concatenate([[np.nan], np.diff(ctx.t.get("graphs_compiled"))])
        return np.where(np.isfinite(growth) & (growth > 0), growth, 0.0)


def late_recompile(ctx: Context) -> Iterator[Finding]:
    """Graphs compiled after a process's warm-up: each is a stall (seconds to a minute on a GPU), and a
    run whose shapes keep changing never stops paying them. The warm-up is the process's first
    WARMUP_UPDATES updates, or, when it logged a `warmup` record (the trainer's compile of every
    pass shape of its plan before update 1), nothing after its first update."""
    compiled = _compiled(ctx)
    if not compiled.any():
        return
    g = ctx.t.get("graphs_compiled")
    with np.errstate(invalid="ignore"):
        new_process = np.concatenate([[True], ~(g[1:] >= g[:-1])])  # the first row, and after a fall
    starts = ctx.marker_steps("run_start")  # a resume's first row, even if its count did not fall
    if len(starts):
        before = np.searchsorted(starts, ctx.prev_step, side="left")
        new_process |= np.searchsorted(starts, ctx.step, side="left") > before
    first = np.maximum.accumulate(np.where(new_process, np.arange(ctx.n), 0))  # each row's process start
    since = np.arange(ctx.n) - first
    # a process that logged a `warmup` record just before its first update compiled its graphs there
    warmed = np.isin(ctx.step[first] - 1, ctx.marker_steps("warmup"))
    rows = np.flatnonzero((compiled > 0) & (since >= np.where(warmed, 1, WARMUP_UPDATES)))
    if not len(rows):
        return
    st = ctx.t.get("step_time")
    typical = stats.typical_step_time(st)
    lost = float(np.nansum(np.maximum(st[rows] - typical, 0.0))) if math.isfinite(typical) else 0.0
    graphs = int(compiled[rows].sum())
    last = ctx.step_at(rows[-1])
    severity = "warning" if len(rows) >= 3 or lost >= COSTLY_STALL_S / 2 else "info"
    yield Finding(
        code="late_recompile", severity=severity, steps=(ctx.step_at(rows[0]), last),
        summary=(f"{plural(graphs, 'graph')} compiled after warm-up in {plural(len(rows), 'update')}, "
                 f"the last at step {last}" + (f", about {lost:.0f} s lost" if lost >= 1 else "")),
        evidence={"graphs": graphs, "updates": len(rows), "last_step": last, "lost_s": lost,
                  "warmup_updates": WARMUP_UPDATES, "after_logged_warmup": int(warmed[rows].any())},
        advice=("New shapes keep reaching the compiled forward: keep train.shape_classes on (it pads each pass "
                "to a bounded ladder of sizes and the warm-up compiles every class of the plan before update "
                "1), and look for what else changes late (noise switched off, a pass with no blocks, a "
                "longer sequence than any before)."),
        weight=lost + len(rows),
        spans=[(ctx.step_at(r - 1), ctx.step_at(r)) for r in rows],
    )


def window_artifact(ctx: Context) -> Iterator[Finding]:
    """A windowed monitor's record that averaged only a few steps (often right after a stalled
    logger) and so shows one batch's loss as if it were the model's."""
    fit = ctx.loss_fit
    suspect = ctx.unreliable
    if fit is None or not suspect.any():
        return
    loss = ctx.t.get("loss")
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.log(np.maximum(loss, 1e-6))
    dev = y - fit.trend - fit.offset
    z = dev / fit.sigma
    rows = np.flatnonzero(suspect & np.isfinite(z) & (np.abs(z) >= 6.0) & (np.abs(dev) >= 0.4))
    if not len(rows):
        return
    worst = rows[np.argmax(np.abs(z[rows]))]
    window = ctx.dstep[worst]
    gap_before = [r for r in rows if ctx.after_gap[r]]
    earlier_gaps = np.flatnonzero(ctx.gap_rows[:worst])
    gap_steps = float(ctx.dstep[earlier_gaps[-1]]) if len(earlier_gaps) else math.nan
    spans = [(ctx.step_at(r - 1), ctx.step_at(r)) for r in rows]
    level = math.exp(fit.trend[worst] + fit.offset[worst])
    where = f"(usual window {ctx.stride:.0f})"
    if gap_before:
        records = plural(len(gap_before), "record")
        where = f"right after a logging gap ({records}; the gap's own record averaged {gap_steps:.0f} steps)"
    yield Finding(
        code="window_artifact", severity="warning", steps=(spans[0][0], spans[-1][1]),
        summary=(
            f"{plural(len(rows), 'logged value')} averaged only {window:.0f} steps {where}; "
            f"one shows loss {loss[worst]:.3g} vs level {level:.3g} at step {ctx.step_at(worst)}"
        ),
        evidence={
            "rows": len(rows), "window_steps": float(window), "usual_window": ctx.stride,
            "loss": float(loss[worst]), "level": level, "after_gap": len(gap_before), "gap_window_steps": gap_steps,
        },
        advice=(
            "This is the monitor, not the model: a short window after a stalled logger lets one batch "
            "dominate. Log every step (or weight windows by their step count) and never let a checkpoint "
            "save block the logger before acting on it."
        ),
        weight=float(np.abs(z[worst])),
        spans=spans,
    )
