"""Matplotlib figures for the HTML report, each returned as PNG bytes (Agg backend, no display).

Long logs are reduced to at most ~MAX_POINTS per series (block medians plus block maxima) so a
million-step report stays small and quick to draw, while single-step spikes remain visible.
"""

from __future__ import annotations

import io
import math

import numpy as np

from blockdraft.doctor import schedule, stats
from blockdraft.doctor.context import Context
from blockdraft.doctor.findings import Finding
from blockdraft.doctor.run import LoggedRun

MAX_POINTS = 6000
SHADE = {"error": "#d62728", "warning": "#ff9f1c", "info": "#4ea8de"}
BUCKET_COLORS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
METRIC_CODES = {  # the findings shaded on each metric's chart
    "loss": ("loss_spike", "window_artifact", "accuracy_cliff", "nonfinite", "checkpoint_stall", "logging_gap",
             "skipped_steps", "plateau"),
    "acc": ("accuracy_cliff", "loss_spike", "nonfinite", "plateau"),
    "grad_norm": ("loss_spike", "nonfinite", "skipped_steps"),
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _color(bucket: int) -> str:
    return BUCKET_COLORS[int(bucket) % len(BUCKET_COLORS)]


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    _plt().close(fig)
    return buf.getvalue()


def _reduce(x: np.ndarray, y: np.ndarray, how: str = "median") -> tuple[np.ndarray, np.ndarray]:
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) <= MAX_POINTS:
        return x, y
    size = math.ceil(len(x) / MAX_POINTS)
    full = len(x) // size * size
    xb = x[:full].reshape(-1, size)[:, size // 2]
    yb = y[:full].reshape(-1, size)
    return xb, (np.max(yb, axis=1) if how == "max" else np.median(yb, axis=1))


def _shade(ax, findings: list[Finding], codes: tuple[str, ...] | None = None) -> None:
    for f in findings:
        if f.severity == "info" or (codes is not None and f.code not in codes):
            continue
        spans = f.spans or [f.steps]
        if len(spans) == 1 and spans[0] == f.steps and f.steps[1] - f.steps[0] > 0.5 * np.ptp(ax.get_xlim()):
            continue  # a finding about most of the run would shade it all
        for a, b in spans[:100]:
            ax.axvspan(a - 0.5, b + 0.5, color=SHADE[f.severity], alpha=0.25, lw=0)
            if b - a < 1:
                ax.axvline(a, color=SHADE[f.severity], alpha=0.6, lw=0.8)


def _axes(title: str, ylabel: str, height: float = 3.0):
    fig, ax = _plt().subplots(figsize=(11, height))
    fig.subplots_adjust(left=0.08, right=0.92, top=0.88, bottom=0.17)
    ax.set_title(title, loc="left", fontsize=11)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def metric_chart(run: LoggedRun, findings: list[Finding], name: str, title: str, log_y: bool = False) -> bytes | None:
    t = run.steps
    if not t.has(name):
        return None
    fig, ax = _axes(title, name)
    x, y = t.steps, t.get(name)
    buckets = t.bucket
    labels = [b for b in np.unique(buckets) if b >= 0]
    if 1 < len(labels) <= len(BUCKET_COLORS) and len(x) <= 4 * MAX_POINTS:
        for b in labels:
            sel = buckets == b
            ax.plot(x[sel], y[sel], ".", ms=1.5, color=_color(b), label=f"bucket {b}", alpha=0.6)
        rest = buckets < 0
        if rest.any():
            ax.plot(x[rest], y[rest], ".", ms=1.5, color="#444444", label="mixed buckets", alpha=0.6)
        ax.legend(loc="upper right", fontsize=7, markerscale=5, ncol=min(7, len(labels) + 1))
    else:
        xm, ym = _reduce(x, y)
        ax.plot(xm, ym, lw=0.8, color="#1f77b4", label="median per point")
        xs, ys = _reduce(x, y, "max")
        if len(xs) < np.isfinite(y).sum():
            ax.plot(xs, ys, lw=0.5, color="#1f77b4", alpha=0.35, label="max per point")
            ax.legend(loc="upper right", fontsize=7)
    if log_y and np.nanmin(np.where(y > 0, y, np.nan)) > 0:
        ax.set_yscale("log")
    _shade(ax, findings, METRIC_CODES.get(name))
    return _png(fig)


def lr_chart(run: LoggedRun, findings: list[Finding]) -> bytes | None:
    t = run.steps
    if not t.has("lr"):
        return None
    fig, ax = _axes("learning rate: logged vs configured schedule", "lr")
    x, y = _reduce(t.steps, t.get("lr"))
    ax.plot(x, y, lw=1.2, label="logged")
    expected = schedule.expected_lr(run, x)
    if expected is not None:
        ax.plot(x, expected, lw=1.0, ls="--", color="black", label="configured")
    noise_std = t.get("noise_std")
    if t.has("noise_std") and (np.nanmax(np.abs(noise_std)) > 0 or (run.setting("noise", "std") or 0) > 0):
        ax2 = ax.twinx()
        xn, yn = _reduce(t.steps, noise_std)
        ax2.plot(xn, yn, lw=0.8, color="#2ca02c", label="noise std (logged)")
        noise = schedule.expected_noise(run, xn)
        if noise is not None:
            ax2.plot(xn, noise, lw=0.8, ls=":", color="#2ca02c", label="noise std (configured)")
        ax2.set_ylabel("noise std")
        ax2.set_ylim(bottom=0)
        ax2.legend(loc="lower right", fontsize=7)
    ax.legend(loc="upper right", fontsize=7)
    _shade(ax, findings, ("warmup_first_step", "lr_schedule_mismatch"))
    return _png(fig)


def timing_chart(run: LoggedRun, findings: list[Finding]) -> bytes | None:
    """Wall time between records (shows stalls) next to step_time and data_wait (show where it went)."""
    t = run.steps
    if not (t.has("time") or t.has("step_time")):
        return None
    fig, ax = _axes("time: wall clock between records and per step, step_time, data wait", "seconds (log)")
    if t.has("time") and len(t) > 1:
        between = np.concatenate([[np.nan], np.diff(t.get("time"))])
        per_step = between / np.concatenate([[np.nan], np.maximum(np.diff(t.steps), 1)])
        x, y = _reduce(t.steps, between, "max")
        ax.plot(x, y, lw=0.7, color="#ff7f0e", alpha=0.8, label="wall s between records (gaps show here)")
        x, y = _reduce(t.steps, per_step, "max")
        ax.plot(x, y, lw=0.7, color="black", alpha=0.7, label="wall s per step")
    for name, color in (("step_time", "#1f77b4"), ("data_wait", "#d62728")):
        if t.has(name):
            x, y = _reduce(t.steps, t.get(name), "max")
            ax.plot(x, np.where(y > 0, y, np.nan), lw=0.7, color=color, alpha=0.8, label=f"{name} (s)")
    for step in Context(run).marker_steps("checkpoint")[:500]:
        ax.axvline(step, color="grey", lw=0.4, alpha=0.5)
    ax.set_yscale("log")
    ax.legend(loc="upper right", fontsize=7)
    _shade(ax, findings, ("checkpoint_stall", "logging_gap", "data_wait", "throughput_drift"))
    return _png(fig)


def series_chart(
    run: LoggedRun, findings: list[Finding], name: str, title: str, ylabel: str, codes: tuple[str, ...],
    height: float = 3.0, from_zero: bool = False,
) -> bytes | None:
    """One logged field over the steps (its median per point), shaded by the findings about it."""
    t = run.steps
    if not t.has(name):
        return None
    fig, ax = _axes(title, ylabel, height)
    x, y = _reduce(t.steps, t.get(name))
    ax.plot(x, y, lw=0.7)
    if from_zero:
        ax.set_ylim(bottom=0)
    _shade(ax, findings, codes)
    return _png(fig)


def bucket_chart(run: LoggedRun) -> bytes | None:
    """The bucket of each micro-batch over the busiest window, plus each bucket's share."""
    t = run.steps
    seq = t.bucket_seq
    if len(seq) < 10:
        return None
    fig, (ax, ax2) = _plt().subplots(1, 2, figsize=(11, 2.8), gridspec_kw={"width_ratios": [4, 1]})
    fig.subplots_adjust(left=0.08, right=0.97, top=0.88, bottom=0.17, wspace=0.2)
    starts, lengths, _ = stats.runs(seq)
    centre = int(starts[np.argmax(lengths)] + lengths.max() // 2)
    lo = max(0, min(centre - 200, len(seq) - 400))
    hi = min(len(seq), lo + 400)
    steps = t.steps[t.bucket_row[lo:hi]]
    colors = [_color(b) for b in seq[lo:hi]]
    ax.scatter(steps + np.linspace(0, 0.8, hi - lo) % 1, seq[lo:hi], c=colors, s=8, marker="s")
    title = f"bucket of each batch, micro-batches {lo}..{hi} (around the longest same-bucket run, {lengths.max()} long)"
    ax.set_title(title, loc="left", fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("bucket")
    ax.grid(alpha=0.3)
    counts = np.bincount(seq[seq >= 0])
    ax2.bar(np.arange(len(counts)), counts / counts.sum(), color=[_color(i) for i in range(len(counts))])
    ax2.set_title("share of batches", fontsize=10)
    ax2.set_xlabel("bucket")
    return _png(fig)


def bucket_hist_chart(run: LoggedRun) -> bytes | None:
    """Per-bucket histograms of loss relative to the run's shared trend: separate humps are loss modes."""
    fit = Context(run).loss_fit
    if fit is None or len(fit.labels) < 2:
        return None
    fig, ax = _axes("loss by length bucket (relative to the run's trend)", "steps", 2.8)
    ax.set_xlabel("loss / trend")
    rel = np.exp(fit.offset + fit.resid)
    ok = np.isfinite(rel)
    hi = np.nanpercentile(rel[ok], 99.5) if ok.any() else 2.0
    bins = np.linspace(max(0.0, np.nanpercentile(rel[ok], 0.5)), hi, 60)
    for j, label in enumerate(fit.labels):
        if label < 0:
            continue
        sel = ok & (fit.groups == j)
        label_text = f"bucket {label} (n={int(sel.sum())})"
        ax.hist(rel[sel], bins=bins, histtype="step", lw=1.2, color=_color(label), label=label_text)
    ax.legend(fontsize=7)
    return _png(fig)


def eval_chart(run: LoggedRun) -> bytes | None:
    evals = [r for r in run.of_kind("eval") if isinstance(r.get("tau"), int | float)]
    if not evals and not run.steps.has("tau_est"):
        return None
    fig, ax = _axes("acceptance length: training estimate vs measured", "tau")
    if run.steps.has("tau_est"):
        x, y = _reduce(run.steps.steps, run.steps.get("tau_est"))
        ax.plot(x, y, lw=0.7, label="tau_est (training)")
    if evals:
        steps, taus = [r["step"] for r in evals], [r["tau"] for r in evals]
        ax.plot(steps, taus, "o-", color="black", ms=4, label="tau (speculative decoding)")
    ax.legend(fontsize=7)
    return _png(fig)
