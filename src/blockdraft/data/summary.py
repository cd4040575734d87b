"""The dataset and batch plan as one dict (log record, `data --json`) and as rich tables.

Shown at the start of every run and by `blockdraft data`, so a skewed plan (one bucket holding most
batches, long same-bucket runs, updates of one bucket, batch lengths that follow each other, micro-
batches of unequal cost that make ranks wait) is seen before day four.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from blockdraft.data.reading import REASONS
from blockdraft.data.report import DataReport

if TYPE_CHECKING:
    from rich.console import Console

    from blockdraft.data.batching import BatchSampler


def length_histogram(lengths: np.ndarray, bins: int = 12) -> list[dict[str, int]]:
    """Sample counts over equal-width length bins [lo, hi)."""
    hi = int(lengths.max()) + 1
    edges = np.unique(np.linspace(int(lengths.min()), hi, bins + 1).astype(np.int64))
    counts, _ = np.histogram(lengths, bins=edges)
    return [{"lo": int(edges[k]), "hi": int(edges[k + 1]), "samples": int(c)} for k, c in enumerate(counts)]


def length_stats(lengths: np.ndarray) -> dict[str, float]:
    p50, p90, p99 = (int(p) for p in np.percentile(lengths, [50, 90, 99]))
    return {"min": int(lengths.min()), "mean": round(float(lengths.mean()), 1), "p50": p50, "p90": p90, "p99": p99,
            "max": int(lengths.max())}


def data_record(report: DataReport, sampler: BatchSampler) -> dict[str, Any]:
    """Fields of the `data` record of log.jsonl (the writer adds kind, time and step)."""
    return {**report.as_record(), **sampler.describe(), "lengths": length_stats(sampler.lengths)}


def data_summary(report: DataReport, sampler: BatchSampler) -> dict[str, Any]:
    """The `blockdraft data --json` object: the data record plus the length histogram."""
    return {**data_record(report, sampler), "length_histogram": length_histogram(sampler.lengths)}


def _short(where: str) -> str:
    """`/long/path/data.jsonl:12` -> `data.jsonl:12` for the table (the JSON keeps full paths)."""
    path, _, line = where.rpartition(":")
    return f"{Path(path).name}:{line}"


def print_summary(summary: dict[str, Any], console: Console) -> None:
    from rich.table import Column, Table

    used, total = summary["samples_used"], summary["samples_total"]
    console.print(f"[bold]{used:,}[/] of {total:,} samples usable, {summary['tokens']:,} tokens "
                  f"({summary['loss_tokens']:,} with loss), {summary['truncated']:,} truncated to max_len")
    if summary["skipped"]:
        skips = Table("reason", Column("count", justify="right"), "first lines", title="skipped records",
                      title_justify="left")
        for reason, count in sorted(summary["skipped"].items(), key=lambda kv: -kv[1]):
            lines = ", ".join(_short(w) for w in summary["first_bad_lines"].get(reason, []))
            skips.add_row(reason, f"{count:,}", lines)
        console.print(skips)
        for reason in sorted(summary["skipped"]):
            console.print(f"  [dim]{reason}: {REASONS.get(reason, reason)}[/]")
    if "length_histogram" in summary:
        hist = Table(*(Column(c, justify="right") for c in ("from", "to", "samples")), "",
                     title="sample lengths (tokens)", title_justify="left")
        peak = max(h["samples"] for h in summary["length_histogram"]) or 1
        for h in summary["length_histogram"]:
            hist.add_row(str(h["lo"]), str(h["hi"]), f"{h['samples']:,}", "#" * round(30 * h["samples"] / peak))
        console.print(hist)
    budget = f"at most {summary['tokens_per_batch']:,} padded tokens"
    if summary["batch_cost"] == "flops":
        budget += f" and {summary['cost_budget']:.3g} FLOPs"
    plan = Table(*(Column(c, justify="right") for c in ("bucket", "lengths", "samples", "batches", "token share")),
                 title=f"batch plan ({budget} per micro-batch)", title_justify="left")
    for b, bucket in enumerate(summary["buckets"]):
        plan.add_row(str(b), f"{bucket['lo']}-{bucket['hi'] - 1}", f"{bucket['samples']:,}", f"{bucket['batches']:,}",
                     f"{100 * bucket['token_share']:.1f}%")
    console.print(plan)
    console.print(f"{summary['batches']:,} micro-batches per epoch, padding {100 * summary['pad_frac']:.1f}%, "
                  f"max same-bucket run {summary['max_same_bucket_run']}, "
                  f"lag-1 autocorrelation of batch lengths {summary['length_autocorr_lag1']:+.2f}")
    mix = summary["update_mix"]
    console.print(
        f"{summary['updates_per_epoch']:,} updates of {summary['world_size']} x {summary['grad_accum']} micro-batches: "
        f"{100 * mix['share_multi_bucket']:.0f}% mix 2+ buckets, the largest bucket holds "
        f"{100 * mix['mean_max_bucket_share']:.0f}% of an update on average; buckets drain within "
        f"{100 * summary['drain_lag']:.1f}% of the epoch; micro-batch cost varies {100 * summary['cost_cv']:.0f}% "
        f"(ranks would wait {100 * summary['rank_wait_predicted']:.1f}% of an update)"
    )
    for warning in summary.get("warnings", []):
        console.print(f"[yellow]warning:[/] {warning}")
