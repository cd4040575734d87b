"""Detectors on what the batches contain: same-bucket runs and updates, loss modes by bucket."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from blockdraft.config import DataConfig
from blockdraft.data.interleave import lag1_autocorr
from blockdraft.doctor import stats
from blockdraft.doctor.context import Context, shared
from blockdraft.doctor.findings import Finding
from blockdraft.doctor.run import MIXED_BUCKET

DEFAULT_MAX_RUN: int = DataConfig.model_fields["max_same_bucket_run"].default  # a log whose config omits it
MIN_LEVEL_SPREAD = 1.25
INTERLEAVED_MAX_R1 = -0.05


@shared
def _batch_order(ctx: Context) -> dict[str, float] | None:
    """Same-bucket run statistics of the micro-batch sequence, shared with bucket_loss_modes."""
    seq = ctx.t.bucket_seq
    if len(seq) < 50:
        if ctx.loss_levels is not None:
            return _level_order(ctx, ctx.loss_levels)
        lengths = ctx.t.get("seq_len_max")
        if np.isfinite(lengths).sum() < 100:
            return None
        r1 = lag1_autocorr(lengths[np.isfinite(lengths)])
        return {"lag1_autocorr": r1, "violated": float(math.isfinite(r1) and r1 >= 0.5)}
    limit = ctx.run.setting("data", "max_same_bucket_run")
    limit = int(limit) if isinstance(limit, int | float) and limit >= 1 else DEFAULT_MAX_RUN
    # when one bucket holds most batches, the sampler can only bound runs at `run_bound` (its `data`
    # record says so): runs the counts force are a property of the data, not a batching bug
    forced = [r.get("run_bound") for r in ctx.run.of_kind("data") if isinstance(r.get("run_bound"), int)]
    limit = max([limit, *forced])
    _, lengths, _ = stats.runs(seq)
    over = lengths > limit
    counts = np.bincount(seq[seq >= 0]) if (seq >= 0).any() else np.zeros(1)
    shares = counts / max(1, counts.sum())
    r1 = lag1_autocorr(seq)
    share_long = float(lengths[over].sum() / len(seq))
    return {
        "limit": limit, "max_run": int(lengths.max()), "runs_over_limit": int(over.sum()),
        "share_in_long_runs": share_long, "top_share": float(shares.max()), "top_bucket": int(np.argmax(shares)),
        "buckets": int((counts > 0).sum()), "lag1_autocorr": r1, "mean_run": float(lengths.mean()),
        "violated": float(share_long >= 0.05 or lengths.max() >= 3 * limit or (math.isfinite(r1) and r1 >= 0.5)),
    }


def _level_order(ctx: Context, levels: stats.Levels) -> dict[str, float]:
    """Whether loss levels alternate like interleaved buckets, for a log without bucket ids: interleaved, a
    high-loss batch is followed by another bucket's, so the detrended loss is anti-correlated from one record
    to the next; drawn at random (or in runs) it is not."""
    keep = (levels.labels >= 0) & ~ctx.unreliable & ctx.first_fall_done
    seq = levels.labels[keep]
    _, lengths, _ = stats.runs(seq)
    shares = np.bincount(seq, minlength=len(levels.means)) / max(1, len(seq))
    resid = ctx.pooled_loss_resid[~ctx.unreliable]
    r1 = lag1_autocorr(resid[np.isfinite(resid)])
    spread = math.exp(float(levels.means[-1] - levels.means[0]))
    return {
        "from_loss_levels": 1,
        "levels": len(levels.means),
        "level_ratios": [float(math.exp(m - levels.means[0])) for m in levels.means],
        "level_shares": shares.tolist(),
        "max_run": int(lengths.max()) if len(lengths) else 0,
        "top_share": float(shares.max()),
        "lag1_autocorr": r1,
        "spread": spread,
        "violated": float(len(seq) >= 200 and spread >= MIN_LEVEL_SPREAD and r1 >= INTERLEAVED_MAX_R1),
    }


def _homogeneous_updates(ctx: Context) -> Finding | None:
    """Updates of several micro-batches (ranks x accumulation) that each hold one length bucket:
    the interleave holds across updates, yet every update's gradient and loss are one bucket's."""
    t = ctx.t
    counts = np.bincount(t.bucket_row, minlength=ctx.n)
    multi = np.flatnonzero(counts >= 2)
    if len(multi) < 50 or len(np.unique(t.bucket_seq)) < 2:
        return None
    one = multi[t.bucket[multi] != MIXED_BUCKET]
    share = len(one) / len(multi)
    if share < 0.5:
        return None
    return Finding(
        code="homogeneous_batches", severity="warning", steps=(ctx.step_at(int(multi[0])), ctx.step_at(int(multi[-1]))),
        summary=(f"{100 * share:.0f}% of the {len(multi)} updates of several micro-batches hold a single length "
                 "bucket: each update's gradient and loss are one bucket's"),
        evidence={"updates_multi_microbatch": float(len(multi)), "share_single_bucket": share},
        advice=("Draw each update's micro-batches (all ranks, all accumulation steps) from the buckets in "
                "proportion (blockdraft does: data record update_mix); balance ranks by cost, not by homogeneity."),
        weight=share,
    )


def homogeneous_batches(ctx: Context) -> Iterator[Finding]:
    updates = _homogeneous_updates(ctx)
    info = _batch_order(ctx)
    if info and info["violated"]:
        yield _homogeneous_from_levels(ctx, info) if info.get("from_loss_levels") else _long_runs(ctx, info, updates)
    elif updates:
        yield updates


def _long_runs(ctx: Context, info: dict, updates: Finding | None) -> Finding:
    """The finding when the logged bucket ids (or batch lengths) come in runs."""
    parts = []
    if "max_run" in info:
        parts.append(
            f"same-bucket runs up to {info['max_run']} micro-batches (limit {info['limit']}); "
            f"{100 * info['share_in_long_runs']:.0f}% of batches sit in runs over the limit"
        )
        parts.append(f"bucket {info['top_bucket']} holds {100 * info['top_share']:.0f}% of batches")
    if math.isfinite(info["lag1_autocorr"]):
        parts.append(f"lag-1 autocorrelation of batch length (bucket) {info['lag1_autocorr']:.2f}")
    if updates:
        parts.append(updates.summary)
    modes = _bucket_modes(ctx)
    strong = modes is not None and modes["eta2"] >= 0.2 and info.get("max_run", 0) >= 8
    return Finding(
        code="homogeneous_batches", severity="error" if strong else "warning", steps=ctx.whole_log,
        summary="batches come in long runs of one length bucket: " + "; ".join(parts),
        evidence={**{k: v for k, v in info.items() if k != "violated"}, **(updates.evidence if updates else {})},
        advice=(
            f"Interleave buckets proportionally (data.interleave=true, data.max_same_bucket_run={DEFAULT_MAX_RUN}) "
            "so every bucket drains at the same pace; consecutive long batches whip the gradient around."
        ),
        weight=info.get("share_in_long_runs", 0.0)
        + max(0.0, info["lag1_autocorr"] if math.isfinite(info["lag1_autocorr"]) else 0.0),
        spans=_long_run_spans(ctx, info),
    )


def _homogeneous_from_levels(ctx: Context, info: dict) -> Finding:
    pairs = zip(info["level_ratios"], info["level_shares"], strict=True)
    ratios = ", ".join(f"x{r:.2f} ({100 * sh:.0f}%)" for r, sh in pairs)
    return Finding(
        code="homogeneous_batches", severity="warning", steps=ctx.whole_log,
        summary=(
            f"likely: the log names no buckets, but its loss has {info['levels']} distinct levels "
            f"({ratios} of records) that follow each other at random (lag-1 autocorrelation "
            f"{info['lag1_autocorr']:.2f}; interleaved buckets alternate, below {INTERLEAVED_MAX_R1}), runs up to "
            f"{info['max_run']} records: each batch seems drawn from one length bucket, and buckets are not "
            "interleaved"
        ),
        evidence={k: v for k, v in info.items() if isinstance(v, int | float) and k != "violated"},
        advice=(
            f"Interleave length buckets proportionally (at most {DEFAULT_MAX_RUN} same-bucket batches in a row) "
            "so every bucket drains at the same pace; log each step's bucket id to confirm (the doctor then checks "
            "the order itself instead of inferring it from the loss)."
        ),
        weight=info["spread"],
    )


def _long_run_spans(ctx: Context, info: dict[str, float]) -> list[tuple[int, int]]:
    if "limit" not in info:
        return []
    starts, lengths, _ = stats.runs(ctx.t.bucket_seq)
    big = np.argsort(lengths)[::-1][:50]
    rows = ctx.t.bucket_row
    long = [i for i in big if lengths[i] > info["limit"]]
    return sorted((ctx.step_at(rows[starts[i]]), ctx.step_at(rows[starts[i] + lengths[i] - 1])) for i in long)


@shared
def _bucket_modes(ctx: Context) -> dict[str, float] | None:
    """Share of the loss's spread explained by the bucket (eta^2 of the detrended log loss)."""
    fit = ctx.loss_fit
    if fit is None or len(fit.labels) < 2:
        return None
    ok = np.isfinite(fit.resid) & (ctx.groups >= 0)
    if ok.sum() < 100:
        return None
    var_total = float(np.var(fit.offset[ok] + fit.resid[ok]))
    var_between = float(np.var(fit.offset[ok]))
    present = [j for j, label in enumerate(fit.labels) if label >= 0 and (fit.groups == j).any()]
    offsets = {int(fit.labels[j]): float(fit.offset[fit.groups == j][0]) for j in present}
    spread = math.exp(max(offsets.values()) - min(offsets.values())) if offsets else 1.0
    return {"eta2": var_between / var_total if var_total > 0 else 0.0, "spread": spread, "offsets": offsets}


def bucket_loss_modes(ctx: Context) -> Iterator[Finding]:
    modes = _bucket_modes(ctx)
    if modes is None or modes["eta2"] < 0.25 or modes["spread"] < 1.15:
        return
    order = _batch_order(ctx)
    homogeneous = bool(order and order["violated"])
    inferred = ctx.loss_levels is not None
    name = "level" if inferred else "bucket"
    ratios = ", ".join(f"{name[0]}{b}: {math.exp(o):.2f}x" for b, o in sorted(modes["offsets"].items()))
    share = 100 * min(1.0, modes["eta2"])
    evidence = {"eta2": min(1.0, modes["eta2"]), "spread": modes["spread"], "inferred_levels": int(inferred)}
    evidence.update({f"bucket_{b}_ratio": math.exp(o) for b, o in modes["offsets"].items()})
    if inferred:
        summary = (
            f"loss jumps between {len(modes['offsets'])} levels ({ratios}; they explain {share:.0f}% of its "
            "spread), most likely one per length bucket (the log names none)"
            + (": with batches not mixed the 'resets' are buckets, not the model" if homogeneous else "")
        )
        advice = "Log each step's bucket id; judge progress per level, not on the raw curve."
    elif homogeneous:
        summary = (
            f"loss has one mode per length bucket ({ratios}; bucket explains "
            f"{share:.0f}% of its spread) and batches are not mixed, so the curve jumps "
            "between modes: the 'resets' are buckets, not the model"
        )
        advice = "Fix the batch order (see homogeneous_batches); judge progress per bucket, not on the raw curve."
    else:
        summary = (
            f"loss level differs by length bucket ({ratios}); bucket explains {share:.0f}% "
            "of the step-to-step spread, so the bands in the curve are buckets, not instability"
        )
        advice = "Nothing to fix; read the loss per bucket (the report's per-bucket plot) when comparing runs."
    yield Finding(
        code="bucket_loss_modes", severity="warning" if homogeneous else "info", steps=ctx.whole_log,
        summary=summary, evidence=evidence, advice=advice,
        weight=modes["eta2"],
    )
