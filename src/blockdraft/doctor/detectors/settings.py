"""Detectors on schedules and settings: LR warmup and curve, noise schedule, AdamW betas, loss gamma."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from blockdraft.config import LR_SHAPES, default_gamma
from blockdraft.doctor import schedule, stats
from blockdraft.doctor.context import Context
from blockdraft.doctor.detectors.training import spike_events
from blockdraft.doctor.findings import Finding

LR_TOLERANCE = 0.05


def _first_rows(ctx: Context) -> np.ndarray | None:
    """Rows of the first segment when the log starts at the first update (step 0 or 1, as it counts)."""
    if not ctx.starts_at_first_update or not ctx.t.has("lr"):
        return None
    return np.flatnonzero(ctx.t.first_segment)


def _lag_one(ctx: Context, rows: np.ndarray) -> bool:
    """True when the logged LR equals the schedule of the previous update (warmup one step late)."""
    lr = ctx.t.get("lr")[rows[1:]]
    prev = schedule.expected_lr(ctx.run, ctx.update[rows[1:]] - 1)
    ok = np.isfinite(lr)
    if prev is None or ok.sum() < 2:
        return False
    rel = np.abs(lr[ok] - prev[ok]) / np.maximum(np.abs(prev[ok]), 1e-12)
    return bool(np.mean(rel <= 0.01) >= 0.99)


def warmup_first_step(ctx: Context) -> Iterator[Finding]:
    rows = _first_rows(ctx)
    if rows is None or len(rows) < 3:
        return
    lr = ctx.t.get("lr")
    lr1, lr2 = float(lr[rows[0]]), float(lr[rows[1]])
    peak = ctx.lr_peak
    warm = schedule.warmup_steps(ctx.run)
    if not math.isfinite(lr1) or not math.isfinite(peak) or peak <= 0:
        return
    first, second = ctx.step_at(rows[0]), ctx.step_at(rows[1])
    evidence = {"lr_step_1": lr1, "lr_step_2": lr2, "peak_lr": peak, "first_step": first, "second_step": second}
    if warm is not None:
        evidence["warmup_steps"] = warm
        if warm < 2:
            return
        expected1 = peak / warm
        evidence["expected_lr_step_1"] = expected1
        at_peak = lr1 >= 0.5 * peak and lr1 >= 1.5 * expected1
    else:
        at_peak = lr1 >= 0.5 * peak and math.isfinite(lr2) and lr2 < 0.5 * lr1
    at_zero = lr1 == 0.0 and math.isfinite(lr2) and lr2 > 0
    if not (at_peak or at_zero):
        return
    if schedule.expected_lr(ctx.run, ctx.update[:1]) is not None:
        evidence["lr_lags_schedule_by_one"] = int(_lag_one(ctx, rows))
    if at_peak:
        summary = (
            f"the first update (step {first}) ran at {lr1:.3g} ({100 * lr1 / peak:.0f}% of peak) before warmup "
            f"started (step {second} used {lr2:.3g})"
        )
        advice = (
            "Compute the LR for update k (1-based) as lr*k/W before the optimizer step; a first Adam step "
            "at full LR moves every weight by ~lr at once."
        )
    else:
        summary = "the first update ran at LR 0 (warmup counted from 0): a wasted step, schedule shifted by one"
        advice = "Count updates from 1 in the schedule (lr*k/W for k = 1..W)."
    yield Finding(
        code="warmup_first_step", severity="warning", steps=(first, first),
        summary=summary, evidence=evidence, advice=advice,
        weight=lr1 / peak if at_peak else 0.5,
    )


def lr_schedule_mismatch(ctx: Context) -> Iterator[Finding]:
    if not ctx.t.has("lr") or ctx.n < 10:
        return
    lr = ctx.t.get("lr")
    if schedule.expected_lr(ctx.run, ctx.update) is None:
        yield from _lr_jumps(ctx, lr)
        return
    configured = ctx.run.setting("optim", "schedule")
    shapes = [configured] if configured else list(LR_SHAPES)
    # every variant is a curve: expected_lr is None only without peak, warmup or total, checked above
    curves = [schedule.expected_lr(ctx.run, ctx.update, decay_from_zero=from_zero, shape=shape)
              for shape in shapes for from_zero in (False, True)]
    fits = [(*_mismatch(ctx, lr, curve), curve) for curve in curves]
    bad, rel, expected = min(fits, key=lambda fit: int(fit[0].sum()))
    ok = np.isfinite(lr) & np.isfinite(expected)
    first_rows = _first_rows(ctx)
    if first_rows is not None and _lag_one(ctx, first_rows):
        return
    if len(bad) and ctx.starts_at_first_update:
        bad[0] = False  # the first update is warmup_first_step's to judge
    count = int(bad.sum())
    if count < max(3, 0.005 * ok.sum()):
        return
    rows = np.flatnonzero(bad)
    warm = schedule.warmup_steps(ctx.run)
    reach = np.flatnonzero(ok & (lr >= 0.99 * np.nanmax(lr[ok])))
    evidence = {
        "mismatched_steps": count, "fraction": count / max(1, ok.sum()), "max_relative_error": float(rel[rows].max()),
        "first_step": ctx.step_at(rows[0]), "configured_warmup_steps": warm if warm is not None else math.nan,
        "observed_peak_step": ctx.step_at(reach[0]) if len(reach) else math.nan,
    }
    worst = rows[np.argmax(rel[rows])]
    yield Finding(
        code="lr_schedule_mismatch", severity="warning", steps=(ctx.step_at(rows[0]), ctx.step_at(rows[-1])),
        summary=(
            f"logged LR departs from the configured schedule on {count} steps from step "
            f"{ctx.step_at(rows[0])} (e.g. {lr[worst]:.3g} vs {expected[worst]:.3g} at step "
            f"{ctx.step_at(worst)}); LR first peaks at step {evidence['observed_peak_step']:.0f}, "
            f"warmup is {warm} steps"
        ),
        evidence=evidence,
        advice=(
            "Check how total_steps and warmup are derived (epochs x steps per epoch, grad_accum), that "
            "the scheduler state is restored on resume, and that the schedule named in the config is used."
        ),
        weight=count / max(1, ok.sum()),
        spans=[(ctx.step_at(a), ctx.step_at(b)) for a, b in stats.events(bad, max_gap=0)[:50]],
    )


def _mismatch(ctx: Context, lr: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Steps whose LR is off by more than LR_TOLERANCE (relative, floored at 2% of peak near zero)."""
    ok = np.isfinite(lr) & np.isfinite(expected)
    scale = np.maximum(np.abs(expected), 0.02 * ctx.lr_peak)
    rel = np.where(ok, np.abs(lr - expected) / scale, 0.0)
    return rel > LR_TOLERANCE, rel


def _lr_jumps(ctx: Context, lr: np.ndarray) -> Iterator[Finding]:
    """Without a config: after the first peak, the LR must not jump back up or restart its warmup."""
    ok = np.isfinite(lr) & (lr > 0)
    if ctx.starts_at_first_update:
        ok[0] = False  # a first update at peak LR is warmup_first_step's finding, not a restart
    if ok.sum() < 20:
        return
    idx = np.flatnonzero(ok)
    v = lr[idx]
    peak_at = int(np.argmax(v >= 0.9 * v.max()))
    after = np.arange(len(v)) > peak_at
    same_seg = np.concatenate([[False], ctx.t.segment[idx[1:]] == ctx.t.segment[idx[:-1]]])
    up, down = np.zeros(len(v), dtype=bool), np.zeros(len(v), dtype=bool)
    move = after[1:] & same_seg[1:]  # a change within one segment, after the peak
    up[1:] = (v[1:] > 1.5 * v[:-1]) & move
    down[1:] = (v[1:] < 0.3 * v[:-1]) & move
    restart = np.array([bool(d) and (v[i + 1 : i + 2000] > 0.8 * v[i - 1]).any() for i, d in enumerate(down)])
    rows = idx[np.flatnonzero(up | restart)]
    if not len(rows):
        return
    rows = rows[np.concatenate([[True], np.diff(rows) > 50])]
    first = ctx.step_at(rows[0])
    yield Finding(
        code="lr_schedule_mismatch", severity="warning", steps=(first, ctx.step_at(rows[-1])),
        summary=f"the LR restarts or jumps back up after its peak {len(rows)}x, first at step {first}",
        evidence={
            "jumps": len(rows), "first_step": first, "lr_before": float(lr[rows[0] - 1]) if rows[0] else math.nan,
            "lr_at": float(lr[rows[0]]),
        },
        advice=(
            "A resume that does not restore the scheduler, or a schedule rebuilt per epoch, restarts the "
            "warmup; restore scheduler state with the optimizer state."
        ),
        weight=float(len(rows)),
        spans=[(ctx.step_at(r), ctx.step_at(r)) for r in rows],
    )


def noise_schedule_flat(ctx: Context) -> Iterator[Finding]:
    logged = ctx.t.get("noise_std")
    expected = schedule.expected_noise(ctx.run, ctx.update)
    if expected is None:
        return
    ok = np.isfinite(logged) & np.isfinite(expected)
    if ok.sum() < 20:
        return
    std = float(ctx.run.setting("noise", "std") or 0.0)
    lo, hi = float(np.min(logged[ok])), float(np.max(logged[ok]))
    e_lo, e_hi = float(np.min(expected[ok])), float(np.max(expected[ok]))
    evidence = {"configured_std": std, "logged_min": lo, "logged_max": hi, "expected_min": e_lo, "expected_max": e_hi}
    scale = max(std, e_hi, 1e-12)
    if e_hi - e_lo >= 0.2 * scale and hi - lo <= 0.02 * scale:
        what = []
        warm = ctx.run.setting("noise", "warmup_steps")
        if warm:
            what.append(f"a {warm}-step warmup from 0")
        if ctx.run.setting("noise", "schedule") == "cosine":
            what.append(f"a cosine to {ctx.run.setting('noise', 'final_std')}")
        summary = (
            f"noise std stays at {lo:.3g} although the config asks for "
            + " and ".join(what or ["a schedule"])
            + f" ({e_lo:.3g}..{e_hi:.3g} over the logged steps)"
        )
    else:
        rel = np.abs(logged[ok] - expected[ok]) / scale
        if float(np.median(rel)) <= 0.2:
            return
        evidence["median_relative_error"] = float(np.median(rel))
        summary = (
            f"noise std does not follow the configured schedule: logged {lo:.3g}..{hi:.3g}, "
            f"expected {e_lo:.3g}..{e_hi:.3g}"
        )
    yield Finding(
        code="noise_schedule_flat", severity="warning", steps=ctx.whole_log,
        summary=summary, evidence=evidence,
        advice=(
            "Compute the noise std from the update count every step (not once at start-up) and log the "
            "value actually applied."
        ),
        weight=1.0,
    )


def optimizer_betas(ctx: Context) -> Iterator[Finding]:
    betas = ctx.run.setting("optim", "betas")
    if not isinstance(betas, list | tuple) or len(betas) != 2:
        return
    try:
        beta1, beta2 = float(betas[0]), float(betas[1])
    except (TypeError, ValueError):
        return
    spikes = len(spike_events(ctx))
    evidence = {"beta1": beta1, "beta2": beta2, "loss_spikes": spikes}
    if beta2 >= 0.995:
        severity = "warning"
        summary = (
            f"AdamW beta2={beta2:g}: the second moment adapts over ~{1 / (1 - beta2):.0f} steps, too slowly "
            "for sudden gradient changes" + (f", and the log has {spikes} loss spikes" if spikes else "")
        )
        advice = "Use betas (0.9, 0.95) for drafter training; beta2 0.999 lets rare large gradients through unscaled."
    elif beta1 < 0.8 or beta1 >= 0.99:
        severity = "info"
        summary = f"AdamW beta1={beta1:g} is unusual (0.9 is the tested value)"
        advice = "Use betas (0.9, 0.95) unless an experiment says otherwise."
    else:
        return
    yield Finding(
        code="optimizer_betas", severity=severity, steps=ctx.whole_log,
        summary=summary, evidence=evidence, advice=advice,
        weight=float(spikes),
    )


def loss_decay_gamma(ctx: Context) -> Iterator[Finding]:
    weighting = ctx.run.setting("loss", "weighting")
    gamma = ctx.run.setting("loss", "gamma")
    block = ctx.run.block_size
    if weighting not in (None, "exp_decay") or not isinstance(gamma, int | float) or block is None:
        return
    expected = default_gamma(block)
    if abs(gamma / expected - 1.0) <= 0.2:
        return
    yield Finding(
        code="loss_decay_gamma", severity="warning", steps=ctx.whole_log,
        summary=(
            f"loss decay gamma={gamma:g} does not match block size {block} (expected ~{expected:g}): "
            + ("later positions are under-weighted" if gamma < expected else "early positions lose weight")
        ),
        evidence={"gamma": float(gamma), "block_size": block, "expected_gamma": expected},
        advice="Leave loss.gamma unset (null) so it is derived from the block size: 7 for B=16, 4 for B=8.",
        weight=abs(gamma / expected - 1.0),
    )
