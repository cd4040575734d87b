"""Detectors on what the batches contain and how they are counted: bucket runs, loss modes, epochs."""

from __future__ import annotations

import math

import numpy as np

from blockdraft.data.batching import lag1_autocorr
from blockdraft.doctor import stats
from blockdraft.doctor.context import Context
from blockdraft.doctor.findings import Finding

DEFAULT_MAX_RUN = 3


def _batch_order(ctx: Context) -> dict[str, float] | None:
    """Same-bucket run statistics of the micro-batch sequence, shared with bucket_loss_modes."""
    if "batch_order" in ctx.shared:
        return ctx.shared["batch_order"]
    seq = ctx.t.bucket_seq
    out = None
    if len(seq) >= 50:
        limit = ctx.run.setting("data", "max_same_bucket_run")
        limit = int(limit) if isinstance(limit, int | float) and limit >= 1 else DEFAULT_MAX_RUN
        # when one bucket holds most batches, the sampler can only bound runs at `run_bound` (its `data`
        # record says so): runs the counts force are a property of the data, not a batching bug
        forced = [r.get("run_bound") for r in ctx.run.of_kind("data") if isinstance(r.get("run_bound"), int)]
        limit = max([limit, *forced])
        _, lengths, values = stats.runs(seq)
        over = lengths > limit
        counts = np.bincount(seq[seq >= 0]) if (seq >= 0).any() else np.zeros(1)
        shares = counts / max(1, counts.sum())
        r1 = lag1_autocorr(seq)
        out = {
            "limit": limit,
            "max_run": int(lengths.max()),
            "runs_over_limit": int(over.sum()),
            "share_in_long_runs": float(lengths[over].sum() / len(seq)),
            "top_share": float(shares.max()),
            "top_bucket": int(np.argmax(shares)),
            "buckets": int((counts > 0).sum()),
            "lag1_autocorr": r1,
            "mean_run": float(lengths.mean()),
        }
        out["violated"] = float(
            out["share_in_long_runs"] >= 0.05 or out["max_run"] >= 3 * limit or (math.isfinite(r1) and r1 >= 0.5)
        )
    elif np.isfinite(ctx.t.get("seq_len_max")).sum() >= 100:
        lengths = ctx.t.get("seq_len_max")
        r1 = lag1_autocorr(lengths[np.isfinite(lengths)])
        out = {"lag1_autocorr": r1, "violated": float(math.isfinite(r1) and r1 >= 0.5)}
    ctx.shared["batch_order"] = out
    return out


def homogeneous_batches(ctx: Context) -> list[Finding]:
    info = _batch_order(ctx)
    if not info or not info["violated"]:
        return []
    parts = []
    if "max_run" in info:
        parts.append(
            f"same-bucket runs up to {info['max_run']} micro-batches (limit {info['limit']}); "
            f"{100 * info['share_in_long_runs']:.0f}% of batches sit in runs over the limit"
        )
        parts.append(f"bucket {info['top_bucket']} holds {100 * info['top_share']:.0f}% of batches")
    if math.isfinite(info["lag1_autocorr"]):
        parts.append(f"lag-1 autocorrelation of batch length (bucket) {info['lag1_autocorr']:.2f}")
    modes = _bucket_modes(ctx)
    strong = modes is not None and modes["eta2"] >= 0.2 and info.get("max_run", 0) >= 8
    return [
        Finding(
            code="homogeneous_batches",
            severity="error" if strong else "warning",
            steps=(ctx.step_at(0), ctx.step_at(ctx.n - 1)),
            summary="batches come in long runs of one length bucket: " + "; ".join(parts),
            evidence={k: v for k, v in info.items() if k != "violated"},
            advice=(
                "Interleave buckets proportionally (data.interleave=true, data.max_same_bucket_run=3) so every "
                "bucket drains at the same pace; consecutive long batches whip the gradient around."
            ),
            weight=info.get("share_in_long_runs", 0.0)
            + max(0.0, info["lag1_autocorr"] if math.isfinite(info["lag1_autocorr"]) else 0.0),
            spans=_long_run_spans(ctx, info),
        )
    ]


def _long_run_spans(ctx: Context, info: dict[str, float]) -> list[tuple[int, int]]:
    if "limit" not in info:
        return []
    starts, lengths, _ = stats.runs(ctx.t.bucket_seq)
    big = np.argsort(lengths)[::-1][:50]
    rows = ctx.t.bucket_row
    return sorted(
        (ctx.step_at(rows[starts[i]]), ctx.step_at(rows[starts[i] + lengths[i] - 1]))
        for i in big
        if lengths[i] > info["limit"]
    )


def _bucket_modes(ctx: Context) -> dict[str, float] | None:
    """Share of the loss's spread explained by the bucket (eta^2 of the detrended log loss)."""
    if "bucket_modes" in ctx.shared:
        return ctx.shared["bucket_modes"]
    fit = ctx.loss_fit
    out = None
    if fit is not None and len(fit.labels) >= 2:
        ok = np.isfinite(fit.resid) & (ctx.groups >= 0)
        if ok.sum() >= 100:
            total = fit.offset[ok] + fit.resid[ok]
            var_total = float(np.var(total))
            var_between = float(np.var(fit.offset[ok]))
            labels = fit.labels
            present = [int(j) for j in range(len(labels)) if labels[j] >= 0]
            offsets = {
                int(labels[j]): float(fit.offset[fit.groups == j][0]) for j in present if (fit.groups == j).any()
            }
            spread = math.exp(max(offsets.values()) - min(offsets.values())) if offsets else 1.0
            out = {"eta2": var_between / var_total if var_total > 0 else 0.0, "spread": spread, "offsets": offsets}
    ctx.shared["bucket_modes"] = out
    return out


def bucket_loss_modes(ctx: Context) -> list[Finding]:
    modes = _bucket_modes(ctx)
    if modes is None or modes["eta2"] < 0.25 or modes["spread"] < 1.15:
        return []
    order = _batch_order(ctx)
    homogeneous = bool(order and order["violated"])
    ratios = ", ".join(f"b{b}: {math.exp(o):.2f}x" for b, o in sorted(modes["offsets"].items()))
    evidence = {"eta2": modes["eta2"], "spread": modes["spread"]}
    evidence.update({f"bucket_{b}_ratio": math.exp(o) for b, o in modes["offsets"].items()})
    if homogeneous:
        summary = (
            f"loss has one mode per length bucket ({ratios}; bucket explains "
            f"{100 * modes['eta2']:.0f}% of its spread) and batches are not mixed, so the curve jumps "
            "between modes: the 'resets' are buckets, not the model"
        )
        advice = "Fix the batch order (see homogeneous_batches); judge progress per bucket, not on the raw curve."
    else:
        summary = (
            f"loss level differs by length bucket ({ratios}); bucket explains {100 * modes['eta2']:.0f}% "
            "of the step-to-step spread, so the bands in the curve are buckets, not instability"
        )
        advice = "Nothing to fix; read the loss per bucket (the report's per-bucket plot) when comparing runs."
    return [
        Finding(
            code="bucket_loss_modes",
            severity="warning" if homogeneous else "info",
            steps=(ctx.step_at(0), ctx.step_at(ctx.n - 1)),
            summary=summary,
            evidence=evidence,
            advice=advice,
            weight=modes["eta2"],
        )
    ]


def epoch_accounting(ctx: Context) -> list[Finding]:
    t = ctx.t
    seg0 = t.segment == t.segment[0] if ctx.n else np.zeros(0, dtype=bool)
    rows = np.flatnonzero(seg0 & np.isfinite(ctx.step))
    if len(rows) < 50:
        return []
    steps = ctx.step[rows]
    problems: list[str] = []
    evidence: dict[str, float] = {}
    epoch, ep, prog = t.get("epoch")[rows], t.get("epoch_progress")[rows], t.get("progress")[rows]
    implied_spe = math.nan
    if np.isfinite(ep).sum() >= 50:
        if np.nanmax(ep) > 1.0001 or np.nanmin(ep) < -1e-6:
            problems.append(f"epoch_progress leaves [0, 1] (range {np.nanmin(ep):.3g}..{np.nanmax(ep):.3g})")
        pos = (np.nan_to_num(epoch, nan=0.0) if np.isfinite(epoch).any() else 0.0) + ep
        ok = np.isfinite(pos)
        if np.isfinite(epoch).any():
            back = np.diff(epoch[np.isfinite(epoch)]) < 0
            if back.any():
                problems.append("the epoch counter goes backwards within one run segment")
        slope = _slope(steps[ok], pos[ok])
        if slope > 0:
            implied_spe = 1.0 / slope
            evidence["steps_per_epoch_from_epoch"] = implied_spe
    implied_total = math.nan
    if np.isfinite(prog).sum() >= 50:
        slope = _slope(steps[np.isfinite(prog)], prog[np.isfinite(prog)])
        if slope > 0:
            implied_total = 1.0 / slope
            evidence["total_steps_from_progress"] = implied_total
        if np.isfinite(ep).sum() >= 50:
            both = np.isfinite(ep) & np.isfinite(prog)
            epochs_cfg = ctx.run.setting("train", "epochs")
            if (
                np.nanmax(np.abs(ep[both] - prog[both])) < 1e-6
                and isinstance(epochs_cfg, int | float)
                and epochs_cfg > 1
            ):
                problems.append(f"epoch_progress equals progress of the whole run although epochs={epochs_cfg:g}")
    total = ctx.run.run_value("total_steps")
    if isinstance(total, int | float) and total > 0 and math.isfinite(implied_total):
        evidence["total_steps"] = float(total)
        if abs(implied_total / total - 1) > 0.1:
            problems.append(f"progress implies {implied_total:.0f} total steps but run_start says {total:.0f}")
    first = ctx.run.of_kind("run_start")[:1]  # the segment checked here is the first run's
    start = first[0] if first else (ctx.run.run_start or {})
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
    epochs_cfg = ctx.run.setting("train", "epochs")
    max_steps = ctx.run.setting("train", "max_steps")
    if (
        isinstance(epochs_cfg, int | float)
        and max_steps is None
        and math.isfinite(implied_spe)
        and math.isfinite(implied_total)
    ):
        expected_total = implied_spe * epochs_cfg
        evidence["total_steps_from_epochs"] = expected_total
        if abs(expected_total / implied_total - 1) > 0.1 and not any("progress equals" in p for p in problems):
            problems.append(
                f"{epochs_cfg:g} epochs of {implied_spe:.0f} steps make {expected_total:.0f} steps, "
                f"but progress counts to {implied_total:.0f}"
            )
    if not problems:
        return []
    return [
        Finding(
            code="epoch_accounting",
            severity="warning",
            steps=(int(steps[0]), int(steps[-1])),
            summary="epoch bookkeeping is inconsistent: " + "; ".join(problems),
            evidence=evidence,
            advice=(
                "Count epochs in optimizer steps of this run (batches / grad_accum / world size) and log "
                "epoch_progress per epoch and progress per run; LR schedules and ETAs built on a wrong count "
                "are wrong too."
            ),
            weight=float(len(problems)),
        )
    ]


def _slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope over a subsample: epochs and progress are smooth, so this is enough."""
    if len(x) < 2:
        return math.nan
    idx = np.linspace(0, len(x) - 1, num=min(len(x), 2000)).astype(int)
    xs, ys = x[idx], y[idx]
    if np.ptp(xs) == 0:
        return math.nan
    return float(np.polyfit(xs, ys, 1)[0])
