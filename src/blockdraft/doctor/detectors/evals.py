"""Detectors of a training-time acceptance estimate that will not hold at serving time: one far above
real speculative decoding (tau_gap), and one earned by passing over too little data too often."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from blockdraft.doctor.context import Context
from blockdraft.doctor.findings import Finding
from blockdraft.telemetry.step_record import TAU_EST_WINDOW

WARN_RATIO = 1.3
INFO_RATIO = 1.15
RECIPE_EPOCHS = 6  # the published recipe's passes over ~800K regenerated samples (DFLASH.md)
MANY_EPOCHS = 10
SMALL_DATA = 5_000  # samples: a few passes over fewer than this learns the samples, not the target


def tau_gap(ctx: Context) -> Iterator[Finding]:
    pairs = []
    for rec in ctx.run.of_kind("eval"):
        tau, step = rec.get("tau"), rec.get("step")
        if not isinstance(tau, int | float) or tau <= 0 or not isinstance(step, int | float):
            continue
        # the step records' window first: a log's own `tau_est_train` may be one update's, one batch's
        vals = ctx.t.get("tau_est")[(ctx.step <= step) & (ctx.step > step - TAU_EST_WINDOW)]
        vals = vals[np.isfinite(vals)]
        train = float(np.median(vals)) if len(vals) else rec.get("tau_est_train")
        if not isinstance(train, int | float):
            continue
        pairs.append((int(step), float(tau), float(train)))
    if not pairs:
        return
    ratio = float(np.median([train / tau for _, tau, train in pairs]))
    if ratio < INFO_RATIO:
        return
    last_step, last_tau, last_train = pairs[-1]
    yield Finding(
        code="tau_gap", severity="warning" if ratio >= WARN_RATIO else "info", steps=(pairs[0][0], last_step),
        summary=(
            f"training estimates tau {last_train:.2f} but real speculative decoding measured {last_tau:.2f} "
            f"at step {last_step} (median ratio {ratio:.2f} over {len(pairs)} evals)"
        ),
        evidence={"evals": len(pairs), "median_ratio": ratio, "tau": last_tau, "tau_est_train": last_train},
        advice=(
            "tau_est assumes training-time conditions: check that eval uses the same block size, mask token "
            "and target layers, that labels match the target's own outputs (regenerate data on-policy), and "
            "that noise is off at eval."
        ),
        weight=ratio,
        spans=[(s, s) for s, _, _ in pairs],
    )


def data_repetition(ctx: Context) -> Iterator[Finding]:
    """Many passes over the data, or more than a few over a small set: tau_est on training batches then
    measures memorised samples, not how often the target will accept the drafts."""
    epoch = ctx.t.get("epoch")
    ok = np.isfinite(epoch)
    if not ok.any():
        return
    progress = ctx.t.get("epoch_progress")
    passes = epoch[ok] + np.where(np.isfinite(progress[ok]), progress[ok], 0.0)
    done = float(np.max(passes))
    samples = (ctx.run.of_kind("data") or [{}])[-1].get("samples_used")
    samples = float(samples) if isinstance(samples, int | float) else math.nan
    small = 0 < samples < SMALL_DATA
    if done < MANY_EPOCHS and not (small and done >= RECIPE_EPOCHS * 2 / 3):
        return
    severe = done >= MANY_EPOCHS or (small and done >= 0.95 * RECIPE_EPOCHS)
    tau = ctx.t.get("tau_est")
    rows = np.flatnonzero(ok & np.isfinite(tau))
    last_tau = float(np.median(tau[rows[-50:]])) if len(rows) else math.nan
    of = f" over {int(samples):,} samples" if math.isfinite(samples) else ""
    steps = ctx.step[np.flatnonzero(ok)]
    yield Finding(
        code="data_repetition", severity="warning" if severe else "info", steps=(int(steps[0]), int(steps[-1])),
        summary=(f"{done:.1f} passes{of}: training tau_est ({last_tau:.2f} at the end) is measured on samples "
                 "the drafter has seen many times"),
        evidence={"epochs": done, "samples": samples, "tau_est_last": last_tau},
        advice=(f"Regenerate answers for more prompts (the recipe makes {RECIPE_EPOCHS} passes over ~800K) or "
                "train fewer epochs; measure tau on held-out prompts (eval.prompts with train.eval_every, or "
                "blockdraft eval) rather than trusting tau_est."),
        weight=done / RECIPE_EPOCHS,
    )
