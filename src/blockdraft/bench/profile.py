"""`blockdraft bench --profile DIR`: two updates under the torch profiler, and where their GPU time went.

Writes `{lengths}-ops.txt` (the profiler's op table), `{lengths}-trace.json` (a Chrome trace) and, on a
GPU, `{lengths}-kernels.txt` / `.json`: kernel time per update by kind (GEMM, attention, fused
elementwise, ...) and by the part of the update that launched it. The parts are the hot path's
`record_function` ranges (train/hotpath.py: target, mask, drafter, loss, clip). Backward kernels
run on autograd's device thread, outside those ranges, so they fall in "backward and unranged".
Kinds are read from kernel names (cuBLAS, cuDNN, Triton as inductor names them): a heuristic.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

UNRANGED = "backward and unranged"
KINDS = ("GEMM", "flex attention", "SDPA attention", "fused elementwise", "foreach (norm, optimizer)", "other")


def kernel_kind(name: str) -> str:
    """One of KINDS for a CUDA kernel's name."""
    s = name.lower()
    if s.startswith("triton_tem") and "flex_attention" in s:
        return "flex attention"
    if s.startswith("triton"):
        return "fused elementwise"
    if any(t in s for t in ("flash", "fmha", "sdpa", "attention")):
        return "SDPA attention"
    if any(t in s for t in ("nvjet", "gemm", "cutlass", "xmma", "cublas")):
        return "GEMM"
    if "multi_tensor" in s or "adam" in s:
        return "foreach (norm, optimizer)"
    return "other"


def kernel_summary(trace: dict[str, Any], updates: int) -> dict[str, Any]:
    """A Chrome trace's kernels -> ms per update by kind and by range (the innermost GPU range that
    covers the kernel's start), the GPU's busy time and its idle time between the first and last kernel."""
    events = trace["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    ranges = sorted((e for e in events if e.get("cat") == "gpu_user_annotation" and "dur" in e), key=lambda e: e["dur"])
    by_kind: dict[str, float] = defaultdict(float)
    by_range: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for k in kernels:
        where = next((r["name"] for r in ranges if r["ts"] <= k["ts"] < r["ts"] + r["dur"]), UNRANGED)
        kind = kernel_kind(k["name"])
        ms = k["dur"] / 1e3 / updates
        by_kind[kind] += ms
        by_range[where][kind] += ms
    busy = sum(by_kind.values())
    first, last = min((k["ts"] for k in kernels), default=0), max((k["ts"] + k["dur"] for k in kernels), default=0)
    span = (last - first) / 1e3 / updates
    return {"updates": updates, "busy_ms": busy, "idle_ms": max(0.0, span - busy),
            "by_kind": {k: by_kind[k] for k in KINDS if k in by_kind},
            "by_range": {r: dict(v) for r, v in sorted(by_range.items(), key=lambda x: -sum(x[1].values()))}}


def summary_table(summary: dict[str, Any]) -> str:
    """The summary as a plain-text table: ranges as rows, kinds as columns, ms per update."""
    kinds = list(summary["by_kind"])
    width = max([len(r) for r in summary["by_range"]] + [len("range")])
    col = {k: max(len(k), 8) + 2 for k in kinds}  # wide enough for each kind's name
    head = f"{'range':<{width}}" + "".join(f"{k:>{col[k]}}" for k in kinds) + f"{'total':>10}"
    lines = [f"ms per update over {summary['updates']} updates: GPU busy {summary['busy_ms']:.1f}, "
             f"idle {summary['idle_ms']:.1f}", head]
    for name, row in summary["by_range"].items():
        lines.append(f"{name:<{width}}" + "".join(f"{row.get(k, 0.0):{col[k]}.1f}" for k in kinds)
                     + f"{sum(row.values()):10.1f}")
    busy = max(summary["busy_ms"], 1e-9)
    lines.append(f"{'share':<{width}}" + "".join(f"{100 * summary['by_kind'][k] / busy:{col[k] - 1}.1f}%"
                                                 for k in kinds))
    return "\n".join(lines) + "\n"


def write_profile(hot, micro: list, out_dir: str, lengths: str, updates: int = 2) -> None:
    """`updates` updates of the micro-batches `micro` under the torch profiler, written to out_dir."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    out = Path(out_dir)  # made by the bench verb before it measures
    cuda = hot.device.type == "cuda"
    with torch_profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for k in range(updates):
            hot.accumulate(micro, 1000 + k, 0, 0.0)
            hot.drafter.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(hot.device)
    sort = "cuda_time_total" if cuda else "cpu_time_total"
    (out / f"{lengths}-ops.txt").write_text(prof.key_averages().table(sort_by=sort, row_limit=40))
    trace = out / f"{lengths}-trace.json"
    prof.export_chrome_trace(str(trace))
    if cuda:
        summary = kernel_summary(json.loads(trace.read_text()), updates)
        (out / f"{lengths}-kernels.json").write_text(json.dumps(summary, indent=1))
        (out / f"{lengths}-kernels.txt").write_text(summary_table(summary))
