"""Detectors on updates that did not count: non-finite values and skipped steps."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import numpy as np

from blockdraft.doctor import stats
from blockdraft.doctor.context import Context
from blockdraft.doctor.findings import Finding, plural
from blockdraft.doctor.run import GUARDED, NAN_WATCH


def nonfinite(ctx: Context) -> Iterator[Finding]:
    t = ctx.t
    flagged = {name: t.nonfinite(name) for name in NAN_WATCH if name in t.cols}
    per_field = {name: int(rows.sum()) for name, rows in flagged.items() if rows.any()}
    bad = np.any([np.zeros(ctx.n, dtype=bool), *flagged.values()], axis=0)
    if not bad.any():
        return
    rows = np.flatnonzero(bad)
    unguarded = int(np.sum(~(t.get("skipped")[rows] > 0)))  # a missing `skipped` counts as applied
    guarded = unguarded == 0 and "lr" not in per_field
    first, last = ctx.step_at(rows[0]), ctx.step_at(rows[-1])
    fields_text = ", ".join(f"{k} x{v}" for k, v in per_field.items())
    if guarded:
        summary = f"{plural(len(rows), 'step')} had non-finite values ({fields_text}); the guard skipped every one"
        advice = (
            "The guard worked, but find the cause: look at those batches (skip records list them), "
            "lower the LR, or check for an fp16 overflow."
        )
    else:
        summary = (
            f"{plural(len(rows), 'step')} had non-finite values ({fields_text}) and {unguarded} "
            f"{'was' if unguarded == 1 else 'were'} applied"
        )
        advice = (
            "Weights after the first unguarded step may be corrupt: resume from the last checkpoint "
            "before it (run `blockdraft ckpt-scan`), and enable the finite-value guard."
        )
    yield Finding(
        code="nonfinite", severity="warning" if guarded else "error", steps=(first, last),
        summary=summary,
        evidence={"rows": len(rows), "unguarded": unguarded, **{f"{k}_rows": v for k, v in per_field.items()}},
        advice=advice,
        weight=float(len(rows)),
        spans=[(ctx.step_at(r), ctx.step_at(r)) for r in rows[:200]],
    )


def skipped_steps(ctx: Context) -> Iterator[Finding]:
    t = ctx.t
    skipped = t.get("skipped") > 0
    for name in GUARDED:  # a skip for a non-finite loss or grad norm is nonfinite's
        skipped &= ~t.nonfinite(name)
    rows = np.flatnonzero(skipped)
    rollbacks = ctx.run.of_kind("rollback")
    skip_records = [r for r in ctx.run.of_kind("skip") if not _nonfinite_reason(r.get("reason"))]
    if not len(rows) and not rollbacks and not skip_records:
        return
    count = max(len(rows), len(skip_records))
    reasons = Counter(t.skip_reasons.get(int(r), "unknown") for r in rows)
    if not len(rows):
        reasons.update(str(rec.get("reason") or "unknown") for rec in skip_records)
    spans = [(ctx.step_at(a), ctx.step_at(b)) for a, b in stats.events(skipped, max_gap=5)]
    if not spans:
        spans = [(s, s) for s in (int(r.get("step", 0)) for r in skip_records + rollbacks)]
    frac = count / max(1, ctx.n)
    longest = max((b - a + 1 for a, b in spans), default=0)
    # one refused outlier is the guard doing its job, however short the run; repeats are worth a look
    severity = "warning" if (count >= 4 or (count >= 2 and frac >= 1e-3) or rollbacks) else "info"
    reason_text = ", ".join(f"{k} x{v}" for k, v in reasons.most_common(3))
    parts = []
    if count:
        parts.append(
            f"{plural(count, 'update')} skipped by the guard ({reason_text}); "
            f"longest burst spans {plural(longest, 'step')}"
        )
    if rollbacks:
        targets = ", ".join(str(r.get("to_step")) for r in rollbacks[:5])
        parts.append(f"{plural(len(rollbacks), 'rollback')} to an earlier checkpoint (to step {targets})")
    yield Finding(
        code="skipped_steps", severity=severity, steps=(min(a for a, _ in spans), max(b for _, b in spans)),
        summary="; ".join(parts),
        evidence={"skipped": count, "fraction": frac, "bursts": len(spans), "rollbacks": len(rollbacks)},
        advice=(
            "Skips hide bad batches rather than fix them: inspect the skip records' batch ids and buckets; "
            "a burst means the model or the LR, not one batch, is the problem."
        ),
        weight=float(count),
        spans=spans,
    )


def _nonfinite_reason(reason: object) -> bool:
    text = str(reason or "").lower()
    return "nan" in text or "inf" in text or "finite" in text
