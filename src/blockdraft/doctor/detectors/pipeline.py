"""Detectors on the input pipeline and speed: the prefetch queue, data wait, throughput drift."""

from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import pairwise

import numpy as np

from blockdraft.doctor import stats
from blockdraft.doctor.context import Context
from blockdraft.doctor.findings import Finding


def queue_drain(ctx: Context) -> Iterator[Finding]:
    q = ctx.t.get("queue_depth")
    ok = np.isfinite(q)
    if ok.sum() < 200:
        return
    rows = np.flatnonzero(ok)
    qv = q[rows]
    blocks = list(pairwise(np.linspace(0, len(qv), 21).astype(int)))  # 20 blocks
    means = np.array([qv[a:b].mean() for a, b in blocks])
    centres = np.array([ctx.step[rows[(a + b - 1) // 2]] for a, b in blocks])
    cap = ctx.run.setting("data", "prefetch_depth")
    cap = float(cap) if isinstance(cap, int | float) and cap > 0 else float(np.nanmax(qv))
    if cap <= 0:
        return
    first, last = means[:4].mean(), means[-4:].mean()
    rho = stats.spearman(centres, means)
    if not (rho <= -0.8 and first - last >= 0.2 * cap and last <= 0.85 * first):
        return
    slope = stats.theil_sen(centres, means)
    steps_left = last / -slope if slope < 0 else math.inf
    sec = ctx.seconds_per_step
    total = ctx.run.run_value("total_steps")
    remaining = (float(total) - ctx.step[-1]) if isinstance(total, int | float) else math.inf
    soon = steps_left <= max(remaining, 0.5 * (ctx.step[-1] - ctx.step[0]))
    hours = steps_left * sec / 3600 if math.isfinite(sec) else math.nan
    summary = f"prefetch queue drains steadily from {first:.1f} to {last:.1f} (of {cap:.0f})"
    if math.isfinite(steps_left):
        summary += f"; empty in ~{steps_left:.0f} steps" + (f" (~{hours:.1f} h)" if math.isfinite(hours) else "")
    yield Finding(
        code="queue_drain", severity="warning" if soon else "info", steps=(ctx.step_at(rows[0]), ctx.step_at(rows[-1])),
        summary=summary,
        evidence={
            "depth_start": first, "depth_end": last, "capacity": cap, "slope_per_1k_steps": 1000 * slope,
            "steps_to_empty": steps_left, "hours_to_empty": hours, "spearman": rho,
        },
        advice=(
            "The loader is slower than the trainer: raise data.num_workers or prefetch_depth, cache the "
            "tokenized data, and check that batch building is not redone each epoch."
        ),
        weight=(first - last) / cap,
    )


def data_wait(ctx: Context) -> Iterator[Finding]:
    wait, st = ctx.t.get("data_wait"), ctx.t.get("step_time")
    ok = np.isfinite(wait) & np.isfinite(st) & (st > 0)
    if ok.sum() < 50:
        return
    rows = np.flatnonzero(ok)
    w, s = np.clip(wait[rows], 0, None), st[rows]
    total_share = float(w.sum() / s.sum())
    size = max(25, len(rows) // 100)
    nb = len(rows) // size  # >= 2 blocks: at least 50 rows
    share = w[: nb * size].reshape(nb, size).sum(1) / s[: nb * size].reshape(nb, size).sum(1)
    hot = share >= 0.2
    stretches = [(a, b) for a, b in stats.events(hot, max_gap=1) if (b - a + 1) >= max(2, nb // 20)]
    if not stretches and total_share < 0.03:
        return
    last = len(rows) - 1
    spans = [(ctx.step_at(rows[a * size]), ctx.step_at(rows[min(last, (b + 1) * size - 1)])) for a, b in stretches]
    worst = float(share.max())
    where = f"; above 20% in {len(spans)} stretches, worst {100 * worst:.0f}%" if spans else ""
    q = ctx.t.get("queue_depth")
    evidence = {"share_of_step_time": total_share, "worst_window_share": worst, "stretches": len(spans)}
    if spans and np.isfinite(q).any():
        inside = np.concatenate([np.flatnonzero((ctx.step >= a) & (ctx.step <= b)) for a, b in spans])
        evidence["queue_depth_in_stretches"] = float(np.nanmean(q[inside]))
    yield Finding(
        code="data_wait", severity="warning" if spans or total_share >= 0.1 else "info",
        steps=(spans[0][0], spans[-1][1]) if spans else (ctx.step_at(rows[0]), ctx.step_at(rows[-1])),
        summary=f"the trainer waits for data {100 * total_share:.1f}% of step time{where}",
        evidence=evidence,
        advice=(
            "The GPU idles on input: more loader workers, a deeper prefetch queue, a tokenization cache, "
            "and batch plans built ahead of the epoch boundary."
        ),
        weight=total_share,
        spans=spans,
    )


def throughput_drift(ctx: Context) -> Iterator[Finding]:
    t = ctx.t
    if t.has("tokens") and t.has("step_time"):
        compute = t.get("step_time") - np.nan_to_num(t.get("data_wait"), nan=0.0)
        tp = t.get("tokens") / np.where(compute > 0, compute, np.nan)
    elif t.has("tok_per_s"):
        tp = t.get("tok_per_s")
    elif t.has("step_time"):
        tp = 1.0 / t.get("step_time")
    else:
        tp = ctx.dstep / ctx.dtime
    if t.has("world_size"):  # per GPU: a resume on fewer GPUs is not a drift
        tp = tp / np.nan_to_num(t.get("world_size"), nan=1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.log(np.where(tp > 0, tp, np.nan))
    ok = np.isfinite(y)
    if ok.sum() < 200:
        return
    groups = ctx.groups
    for label in np.unique(groups):
        sel = ok & (groups == label)
        if sel.sum() >= 10:
            y[sel] -= np.median(y[sel])
    rows = np.flatnonzero(ok)
    rows = rows[int(0.02 * len(rows)) :]
    k = len(rows) // 5  # >= 39 rows: at least 196 after the first 2%
    early, late = float(np.median(y[rows[:k]])), float(np.median(y[rows[-k:]]))
    ratio = math.exp(late - early)
    meds, centres = stats.block_medians(y[rows], max(1, len(rows) // 10))
    rho = stats.spearman(centres, meds)
    if ratio > 0.85 or rho > -0.7:
        return
    unit = "tok/s" if (t.has("tokens") or t.has("tok_per_s")) else "steps/s"
    raw = tp[rows]
    first, last = float(np.nanmedian(raw[:k])), float(np.nanmedian(raw[-k:]))
    yield Finding(
        code="throughput_drift", severity="warning", steps=(ctx.step_at(rows[0]), ctx.step_at(rows[-1])),
        summary=f"throughput fell {100 * (1 - ratio):.0f}% over the run ({first:.4g} -> {last:.4g} {unit}, per bucket)",
        evidence={"ratio_late_to_early": ratio, "early": first, "late": last, "spearman": rho},
        advice=(
            "Something grows with time: memory fragmentation (watch mem_gb), a leak in the loop, "
            "thermal throttling, or a neighbour on the machine. Compare a fresh restart's speed."
        ),
        weight=1.0 - ratio,
    )
