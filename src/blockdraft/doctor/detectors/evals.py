"""Detector comparing the training-time acceptance estimate with real speculative decoding."""

from __future__ import annotations

import numpy as np

from blockdraft.doctor.context import Context
from blockdraft.doctor.findings import Finding

WARN_RATIO = 1.3
INFO_RATIO = 1.15


def tau_gap(ctx: Context) -> list[Finding]:
    pairs = []
    for rec in ctx.run.of_kind("eval"):
        tau, step = rec.get("tau"), rec.get("step")
        if not isinstance(tau, int | float) or tau <= 0 or not isinstance(step, int | float):
            continue
        train = rec.get("tau_est_train")
        if not isinstance(train, int | float):
            rows = np.flatnonzero((ctx.step <= step) & (ctx.step > step - 100))
            vals = ctx.t.get("tau_est")[rows] if len(rows) else np.zeros(0)
            vals = vals[np.isfinite(vals)]
            if not len(vals):
                continue
            train = float(np.median(vals))
        pairs.append((int(step), float(tau), float(train)))
    if not pairs:
        return []
    ratios = np.array([train / tau for _, tau, train in pairs])
    ratio = float(np.median(ratios))
    if ratio < INFO_RATIO:
        return []
    last_step, last_tau, last_train = pairs[-1]
    return [
        Finding(
            code="tau_gap",
            severity="warning" if ratio >= WARN_RATIO else "info",
            steps=(pairs[0][0], last_step),
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
    ]
