"""The self-contained HTML report: findings table plus charts embedded as base64 PNGs (no network)."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from blockdraft.doctor import charts
from blockdraft.doctor.console import describe, unchecked
from blockdraft.doctor.context import Context
from blockdraft.doctor.findings import Finding, severity_counts
from blockdraft.doctor.run import LoggedRun

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:24px auto;max-width:1120px;color:#222}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.meta{color:#666;margin-bottom:16px} table{border-collapse:collapse;width:100%}
th,td{border-bottom:1px solid #eee;padding:6px 8px;text-align:left;vertical-align:top}
th{background:#f6f6f6;font-weight:600} .sev{font-weight:700;text-transform:uppercase;font-size:12px}
.error{color:#c62828} .warning{color:#b26a00} .info{color:#1565c0}
.advice{color:#555;margin-top:4px} .ev{color:#777;font:12px ui-monospace,monospace;margin-top:4px}
.chart{margin:10px 0} .chart img{max-width:100%} .ok{color:#2e7d32;font-weight:600}
.counts span{margin-right:14px}
"""


def write_report(run: LoggedRun, findings: list[Finding], path: str | Path) -> Path:
    """Write the report and return its path."""
    path = Path(path)
    path.write_text(render(run, findings), encoding="utf-8")
    return path


def render(run: LoggedRun, findings: list[Finding]) -> str:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>blockdraft doctor: {html.escape(run.source)}</title><style>{CSS}</style></head><body>",
        f"<h1>blockdraft doctor</h1><div class='meta'>{html.escape(run.source)}<br>{html.escape(describe(run))}</div>",
        _counts(findings),
        "<h2>Findings</h2>",
        _table(findings),
    ]
    missing = unchecked(run)
    if missing:
        items = "; ".join(f"{html.escape(c)} (needs {html.escape(m)})" for c, m in missing.items())
        parts.append(f"<p class='meta'>Not checked on this log: {items}</p>")
    parts.append("<h2>Charts</h2><p class='meta'>Shaded: the steps of warning (orange) and error (red) findings.</p>")
    for caption, png in _charts(run, findings):
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<div class='chart'><img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'></div>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _counts(findings: list[Finding]) -> str:
    if not findings:
        return "<p class='ok'>No findings: nothing unusual in what this log records.</p>"
    spans = "".join(f"<span class='{sev}'>{n} {sev}</span>" for sev, n in severity_counts(findings).items())
    return f"<div class='counts'>{spans}</div>"


def _table(findings: list[Finding]) -> str:
    if not findings:
        return ""
    rows = ["<table><tr><th>severity</th><th>code</th><th>steps</th><th>finding</th></tr>"]
    for f in findings:
        steps = f.step_text("&ndash;")
        evidence = ", ".join(f"{html.escape(k)}={_fmt(v)}" for k, v in f.evidence.items())
        rows.append(
            f"<tr><td class='sev {f.severity}'>{f.severity}</td><td><code>{f.code}</code></td><td>{steps}</td>"
            f"<td>{html.escape(f.summary)}<div class='advice'>&rarr; {html.escape(f.advice)}</div>"
            f"<div class='ev'>{evidence}</div></td></tr>"
        )
    rows.append("</table>")
    return "\n".join(rows)


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else html.escape(str(value))


def _charts(run: LoggedRun, findings: list[Finding]) -> list[tuple[str, bytes]]:
    per = "per record (each the average of a window of steps)" if Context(run).windowed else "per step"
    coloured = " (colour = length bucket)" if (run.steps.bucket >= 0).any() else ""
    made = [
        ("loss", charts.metric_chart(run, findings, "loss", f"loss {per}{coloured}", log_y=True)),
        ("accuracy", charts.metric_chart(run, findings, "acc", f"accuracy {per}{coloured}")),
        ("acceptance", charts.eval_chart(run)),
        ("learning rate", charts.lr_chart(run, findings)),
        ("grad norm", charts.metric_chart(run, findings, "grad_norm", "gradient norm (before clipping)", log_y=True)),
        ("step time", charts.timing_chart(run, findings)),
        ("throughput", charts.series_chart(run, findings, "tok_per_s", "throughput", "tok/s", ("throughput_drift",))),
        ("queue", charts.series_chart(run, findings, "queue_depth", "prefetch queue depth", "batches queued",
                                      ("queue_drain", "data_wait"), height=2.5, from_zero=True)),
        ("buckets", charts.bucket_chart(run)),
        ("loss by bucket", charts.bucket_hist_chart(run)),
    ]
    return [(caption, png) for caption, png in made if png is not None]

