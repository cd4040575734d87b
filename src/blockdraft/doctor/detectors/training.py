"""Detectors on the optimisation itself: loss spikes, accuracy cliffs, plateaus."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from blockdraft.doctor import stats
from blockdraft.doctor.context import Context, shared
from blockdraft.doctor.findings import Finding, plural

SPIKE_Z = 8.0
SPIKE_RATIO = 1.5
BIG_SPIKE_RATIO = 3.0
CLIFF_BLOCK = 10
CLIFF_PRE_BLOCKS = 6
CLIFF_DROP = math.log(2.0)
RECOVERED = math.log(1.0 / 0.9)
DEEP_EXTRA = math.log(1.5)


@dataclass
class Event:
    first_row: int
    last_row: int
    peak_row: int
    ratio: float


@shared
def spike_events(ctx: Context) -> list[Event]:
    """Rows far above their own bucket's level: robust z >= SPIKE_Z and at least SPIKE_RATIO x."""
    fit = ctx.loss_fit
    out: list[Event] = []
    if fit is not None:
        z = fit.resid / fit.sigma
        flags = (z >= SPIKE_Z) & (fit.resid >= math.log(SPIKE_RATIO))
        flags &= ~ctx.unreliable
        flags[: ctx.trend_block] = False
        for a, b in stats.events(flags, max_gap=2):
            seg = fit.resid[a : b + 1]
            peak = a + int(np.nanargmax(seg))
            out.append(Event(a, b, peak, float(math.exp(fit.resid[peak]))))
    return out


@shared
def level_drops(ctx: Context) -> tuple[list[Event], str]:
    """Sustained drops of accuracy (or, without acc, rises of loss) against the recent level."""
    fit, metric = ctx.acc_fit, "acc"
    if fit is None:
        fit, metric = ctx.loss_fit, "loss"
    if fit is None:
        return [], metric
    sign = 1.0 if metric == "acc" else -1.0
    y = sign * (fit.trend + fit.resid)
    drop = CLIFF_DROP if metric == "acc" else math.log(1.6)
    meds, _ = stats.block_medians(y, CLIFF_BLOCK)
    usable = np.ones(len(meds), dtype=bool)
    if metric == "acc":
        acc_level = np.exp(fit.trend)
        top = np.nanmax(acc_level) if np.isfinite(acc_level).any() else 0.0
        block_level, _ = stats.block_medians(acc_level, CLIFF_BLOCK)
        usable = block_level >= max(0.02, 0.25 * top)
    events: list[Event] = []
    if len(meds) > CLIFF_PRE_BLOCKS + 2:
        pre = np.full(len(meds), np.nan)
        with np.errstate(all="ignore"):
            pre[CLIFF_PRE_BLOCKS:] = stats.nanmedian_rows(sliding_window_view(meds, CLIFF_PRE_BLOCKS)[:-1])
        usable_pre = np.zeros(len(meds), dtype=bool)
        usable_pre[CLIFF_PRE_BLOCKS:] = sliding_window_view(usable, CLIFF_PRE_BLOCKS)[:-1].all(axis=1)
        nxt = np.append(meds[1:], np.nan)
        with np.errstate(invalid="ignore"):
            candidate = usable_pre & ((np.fmax(meds, nxt) <= pre - drop) | (meds <= pre - drop - DEEP_EXTRA))
        candidate[-1] = False
        next_free = 0
        for j in np.flatnonzero(candidate):
            if j < next_free:
                continue
            onset = _onset_row(y, j * CLIFF_BLOCK, pre[j] - drop)
            back = np.flatnonzero(meds[j + 1 :] >= pre[j] - RECOVERED)
            end_block = j + 1 + int(back[0]) if len(back) else len(meds)
            trough = float(np.nanmin(meds[j:end_block]))
            last_row = min(ctx.n - 1, end_block * CLIFF_BLOCK) if len(back) else ctx.n - 1
            events.append(Event(onset, last_row, last_row if len(back) else -1, math.exp(trough - pre[j])))
            next_free = end_block + CLIFF_PRE_BLOCKS
    return events, metric


def _onset_row(y: np.ndarray, block_start: int, threshold: float) -> int:
    lo = max(0, block_start - CLIFF_BLOCK)
    seg = y[lo : block_start + CLIFF_BLOCK]
    below = np.flatnonzero(seg <= threshold)
    for i in below:
        if np.mean(seg[i : i + 5] <= threshold) >= 0.6:  # most of the next 5 rows stay down
            return lo + int(i)
    return block_start


def loss_spike(ctx: Context) -> Iterator[Finding]:
    events = spike_events(ctx)
    drops, metric = level_drops(ctx)
    if metric == "acc":
        events = [e for e in events if not any(d.first_row - 5 <= e.first_row <= d.first_row + 60 for d in drops)]
    sustained = drops if metric == "loss" else []
    if not events and not sustained:
        return
    loss = ctx.t.get("loss")
    fit = ctx.loss_fit
    assert fit is not None
    ratios = [e.ratio for e in events]
    skipped = ctx.t.get("skipped") > 0
    after_ckpt = _rows_after_checkpoints(ctx, [e.first_row for e in events], within=30)
    in_run = _in_long_bucket_run(ctx, [e.peak_row for e in events])
    evidence: dict[str, float] = {"spikes": len(events)}
    parts = []
    if events:
        worst = max(events, key=lambda e: e.ratio)
        base = float(np.exp(fit.trend[worst.peak_row] + fit.offset[worst.peak_row]))
        evidence.update({
            "max_ratio": worst.ratio, "max_loss": float(loss[worst.peak_row]), "baseline_at_max": base,
            "max_step": ctx.step_at(worst.peak_row), "per_10k_steps": 1e4 * len(events) / max(1, ctx.n),
            "skipped": int(sum(skipped[e.peak_row] for e in events)), "after_checkpoint": after_ckpt,
            "in_same_bucket_run": in_run,
        })
        grad = ctx.t.get("grad_norm")
        med = stats.finite_median(grad)
        if med > 0 and math.isfinite(grad[worst.peak_row]):
            evidence["grad_norm_ratio_at_max"] = float(grad[worst.peak_row]) / med
        parts.append(
            f"{plural(len(events), 'loss spike')} against the per-bucket baseline, worst {loss[worst.peak_row]:.3g} "
            f"= {worst.ratio:.1f}x at step {ctx.step_at(worst.peak_row)}"
        )
        if after_ckpt:
            parts.append(f"{after_ckpt} right after a checkpoint")
        if in_run:
            parts.append(f"{in_run} inside a long same-bucket run")
    if sustained:
        longest = max(int(ctx.step[e.last_row] - ctx.step[e.first_row]) for e in sustained)
        evidence.update({"sustained": len(sustained), "longest_sustained_steps": longest})
        parts.append(f"{plural(len(sustained), 'sustained loss jump')} (resets) lasting up to {longest} steps")
    big = any(r >= BIG_SPIKE_RATIO for r in ratios) or len(events) >= 5 or bool(sustained)
    spans = [(ctx.step_at(e.first_row), ctx.step_at(e.last_row)) for e in events + sustained]
    yield Finding(
        code="loss_spike", severity="warning" if big else "info",
        steps=(min(a for a, _ in spans), max(b for _, b in spans)),
        summary="; ".join(parts),
        evidence=evidence,
        advice=(
            "Look at the spiking batches (bucket, length, content). If spikes follow long runs of one "
            "bucket, interleave buckets; if they recur, lower the LR or beta2, or let the guard skip them."
        ),
        weight=float(max(ratios, default=2.0) * (len(events) + len(sustained))),
        spans=spans,
    )


def _rows_after_checkpoints(ctx: Context, rows: list[int], within: int) -> int:
    ckpt = ctx.marker_steps("checkpoint")
    if not len(ckpt) or not rows:
        return 0
    steps = ctx.step[np.array(rows)]
    pos = np.searchsorted(ckpt, steps, side="right") - 1
    return int(np.sum((pos >= 0) & (steps - ckpt[np.maximum(pos, 0)] <= within)))


def _in_long_bucket_run(ctx: Context, rows: list[int]) -> int:
    bucket = ctx.t.bucket
    if not rows or not (bucket >= 0).any():
        return 0
    _, lengths, _ = stats.runs(bucket)
    run_len = np.repeat(lengths, lengths)
    return int(sum(1 for r in rows if bucket[r] >= 0 and run_len[r] >= 4))


def accuracy_cliff(ctx: Context) -> Iterator[Finding]:
    drops, metric = level_drops(ctx)
    if metric != "acc" or not drops:
        return
    acc = ctx.t.get("acc")
    loss = ctx.t.get("loss")
    for e in drops:
        recovered = e.peak_row >= 0
        pre, trough = slice(max(0, e.first_row - 60), e.first_row), slice(e.first_row, e.first_row + 40)
        before, after = stats.finite_median(acc[pre]), stats.finite_median(acc[trough])
        recovery = int(ctx.step[e.last_row] - ctx.step[e.first_row]) if recovered else None
        evidence = {
            "acc_before": before, "acc_after": after, "depth_ratio": e.ratio,
            "recovery_steps": recovery if recovery is not None else math.nan, "recovered": int(recovered),
        }
        loss_before, loss_after = stats.finite_median(loss[pre]), stats.finite_median(loss[trough])
        if math.isfinite(loss_before) and math.isfinite(loss_after):
            evidence["loss_before"], evidence["loss_after"] = loss_before, loss_after
        if _rows_after_checkpoints(ctx, [e.first_row], within=30):
            evidence["after_checkpoint"] = 1
        first = ctx.step_at(e.first_row)
        tail = f"recovered after {recovery} steps" if recovered else "not recovered by the end of the log"
        yield Finding(
            code="accuracy_cliff", severity="warning" if recovered else "error", steps=(first, ctx.step_at(e.last_row)),
            summary=f"accuracy fell from {before:.3g} to {after:.3g} at step {first} and {tail}",
            evidence=evidence,
            advice=(
                "A bad update pushed the weights off: check the batches just before (bucket runs, spikes, "
                "grad norm), the LR at that point, and whether a checkpoint or resume happened there."
            ),
            weight=(1.0 - e.ratio) * (recovery or ctx.n),
        )


def plateau(ctx: Context) -> Iterator[Finding]:
    """The loss level stopped improving for the last third of the run while the LR was still high."""
    fit = ctx.loss_fit
    if fit is None or ctx.n < 600:
        return
    level = stats.smooth_trend(fit.trend, max(10, ctx.n // 50))
    w = max(10, ctx.n // 20)
    start = int(0.02 * ctx.n)
    tail_from = int(0.65 * ctx.n)
    learned = float(np.nanmedian(level[start : start + w]) - np.nanmedian(level[tail_from : tail_from + w]))
    meds, centres = stats.block_medians((fit.trend + fit.resid)[tail_from:], max(5, (ctx.n - tail_from) // 20))
    tail_gain = -stats.theil_sen(centres, meds) * (ctx.n - tail_from)
    if not (np.isfinite(learned) and np.isfinite(tail_gain)):
        return
    if tail_gain > 0.015 or learned < 0.1:
        return
    lr = ctx.t.get("lr")
    lr_share = math.nan
    if np.isfinite(lr[tail_from:]).any() and math.isfinite(ctx.lr_peak) and ctx.lr_peak > 0:
        lr_share = float(np.nanmedian(lr[tail_from:])) / ctx.lr_peak
        if lr_share < 0.3:
            return
    final = float(np.nanmedian(level[-w:]))
    flat_rows = np.flatnonzero(level - final > 0.03)
    since = int(flat_rows[-1]) + 1 if len(flat_rows) else 0
    since = min(since, tail_from)
    span = (ctx.step_at(since), ctx.step_at(ctx.n - 1))
    yield Finding(
        code="plateau", severity="info", steps=span,
        summary=(
            f"loss stopped improving at step {span[0]} (level {math.exp(final):.3g}) for the last "
            f"{100 * (ctx.n - since) / ctx.n:.0f}% of the log"
            + (f" while the LR was still {100 * lr_share:.0f}% of peak" if math.isfinite(lr_share) else "")
        ),
        evidence={
            "plateau_from_step": span[0], "loss_level": math.exp(final), "tail_gain_log": tail_gain,
            "lr_share_of_peak": lr_share, "fraction_of_run": (ctx.n - since) / ctx.n,
        },
        advice=(
            "More steps at this LR buy little: decay the LR (cosine), add or refresh data (regenerate "
            "on-policy), or stop early and spend the compute elsewhere."
        ),
        weight=(ctx.n - since) / ctx.n,
    )
