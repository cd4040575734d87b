"""`blockdraft bench --profile DIR`: two whole updates under the torch profiler, and where their GPU time went.

An update is profiled as training runs it: forward and backward, the step's one host synchronisation,
then the optimizer step. Writes `{lengths}-ops.txt` (the profiler's op table), `{lengths}-trace.json`
(a Chrome trace) and, on a GPU, `{lengths}-kernels.txt` / `.json`: kernel time per update by kind
(GEMM, attention, fused elementwise, ...) and by the part of the update that launched it, then the GPU's
idle time by what the host was doing when it ended, then the kernels that took the most time, by name.
The parts are the hot path's `record_function` ranges (train/hotpath.py: target, mask, drafter, loss,
clip) and the optimizer's own. Backward kernels run on autograd's device thread, outside those ranges,
so they fall in "backward and unranged". Kinds are read from kernel names (cuBLAS, cuDNN, Triton as
inductor names them, the loss's own Triton kernels): a heuristic.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections import defaultdict
from pathlib import Path
from typing import Any

UNRANGED = "backward and unranged"
GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCHES = ("cuda_runtime", "cuda_driver")  # the host calls that enqueue GPU work (Triton's go through the driver)
MIN_GAP_US = 10.0  # shorter gaps are the launch latency between back-to-back kernels
KINDS = ("GEMM", "flex attention", "SDPA attention", "fused elementwise", "cross-entropy (Triton)",
         "foreach (norm, optimizer)", "other")


def kernel_kind(name: str) -> str:
    """One of KINDS for a CUDA kernel's name."""
    s = name.lower()
    if s.startswith("triton_tem") and "flex_attention" in s:
        return "flex attention"
    if s.startswith("triton"):
        return "fused elementwise"
    if s.startswith("cross_entropy_"):  # train/cross_entropy_kernel.py's two passes
        return "cross-entropy (Triton)"
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


def top_kernels(trace: dict[str, Any], updates: int, top: int = 20) -> list[dict[str, Any]]:
    """A Chrome trace's kernels by name, the most time first: the whole name (which the op table cuts at
    55 characters), its kind, ms and launches per update. Names inductor's fused kernels, casts included."""
    ms: dict[str, float] = defaultdict(float)
    launches: dict[str, int] = defaultdict(int)
    for k in trace["traceEvents"]:
        if k.get("cat") == "kernel" and "dur" in k:
            ms[k["name"]] += k["dur"] / 1e3 / updates
            launches[k["name"]] += 1
    names = sorted(ms, key=lambda n: -ms[n])[:top]
    return [{"kernel": n, "kind": kernel_kind(n), "ms": ms[n], "launches": launches[n] / updates} for n in names]


def top_kernels_table(kernels: list[dict[str, Any]], updates: int) -> str:
    """`top_kernels` as plain text, one kernel a line."""
    lines = [f"top kernels by time per update over {updates} updates (ms, launches, kind, name):"]
    lines += [f"{k['ms']:8.2f} {k['launches']:6.1f}  {k['kind']:<24}  {k['kernel']}" for k in kernels]
    return "\n".join(lines) + "\n"


def _innermost(spans: list[dict[str, Any]], starts: list[float], t: float) -> dict[str, Any] | None:
    """The span of `spans` (one thread's, nested, sorted by start) that covers time t and starts last."""
    for i in range(bisect_right(starts, t) - 1, -1, -1):
        if spans[i]["ts"] + spans[i]["dur"] > t:
            return spans[i]
    return None


class _HostSpans:
    """A trace's host-side spans of one category, per thread, for `_innermost` lookups."""

    def __init__(self, events: list[dict[str, Any]], category: str) -> None:
        by_thread: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for e in events:
            if e.get("cat") == category and "dur" in e:
                by_thread[e.get("tid")].append(e)
        self.spans = {tid: sorted(v, key=lambda e: e["ts"]) for tid, v in by_thread.items()}
        self.starts = {tid: [e["ts"] for e in v] for tid, v in self.spans.items()}

    def name_at(self, tid: Any, t: float, default: str) -> str:
        found = _innermost(self.spans.get(tid, []), self.starts.get(tid, []), t)
        return found["name"] if found is not None else default


def idle_gaps(trace: dict[str, Any], updates: int, top: int = 10) -> dict[str, Any]:
    """The GPU's idle gaps (over MIN_GAP_US) between the first and last piece of GPU work, each put down
    to the host op that launched the work ending it, and the range that op ran in: a gap ends when the
    host enqueues the next kernel, so that op is what the GPU waited for (the host's own work, or the
    host waiting at a synchronisation before it). Returns ms per update by (range, op), the most first,
    and the `top` longest gaps."""
    events = trace["traceEvents"]
    work = sorted((e for e in events if e.get("cat") in GPU_WORK and "dur" in e), key=lambda e: e["ts"])
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in LAUNCHES and "correlation" in e.get("args", {})}
    ops, ranges = _HostSpans(events, "cpu_op"), _HostSpans(events, "user_annotation")
    by_cause: dict[tuple[str, str], float] = defaultdict(float)
    gaps = []
    busy_until = work[0]["ts"] + work[0]["dur"] if work else 0.0
    for before, after in zip(work, work[1:], strict=False):
        gap = after["ts"] - busy_until
        busy_until = max(busy_until, after["ts"] + after["dur"])
        if gap < MIN_GAP_US:
            continue
        launch = launches.get(after.get("args", {}).get("correlation"))
        op, where = "(launch not in the trace)", UNRANGED
        if launch is not None:
            op = ops.name_at(launch.get("tid"), launch["ts"], launch["name"])
            where = ranges.name_at(launch.get("tid"), launch["ts"], UNRANGED)
        by_cause[(where, op)] += gap / 1e3 / updates
        gaps.append({"ms": gap / 1e3, "range": where, "op": op, "before": before["name"], "after": after["name"]})
    gaps.sort(key=lambda g: -g["ms"])
    causes = sorted(by_cause.items(), key=lambda x: -x[1])
    return {"updates": updates, "idle_ms": sum(by_cause.values()), "min_gap_us": MIN_GAP_US,
            "by_cause": [{"range": r, "op": o, "ms": ms} for (r, o), ms in causes], "longest": gaps[:top]}


def gaps_table(gaps: dict[str, Any], rows: int = 15) -> str:
    """`idle_gaps` as plain text: idle ms per update by the range and op that ended each gap."""
    causes = gaps["by_cause"][:rows]
    width = max([len(c["range"]) for c in causes + gaps["longest"]] + [len("range")])
    lines = [f"GPU idle per update over {gaps['updates']} updates, gaps over {gaps['min_gap_us']:.0f} us: "
             f"{gaps['idle_ms']:.1f} ms, by what the host launched to end each gap",
             f"{'ms':>8}  {'range':<{width}}  op"]
    lines += [f"{c['ms']:8.2f}  {c['range']:<{width}}  {c['op']}" for c in causes]
    lines.append("longest gaps (ms, range, op, kernel before -> kernel after):")
    lines += [f"{g['ms']:8.2f}  {g['range']:<{width}}  {g['op']}: {g['before'][:60]} -> {g['after'][:60]}"
              for g in gaps["longest"]]
    return "\n".join(lines) + "\n"


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


def write_profile(hot, optimizer, micro: list, out_dir: str, lengths: str, updates: int = 2) -> None:
    """`updates` updates of the micro-batches `micro` under the torch profiler, as `Trainer.train_step`
    runs them (the stats' host copy, then the optimizer step), written to out_dir."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    out = Path(out_dir)  # made by the bench verb before it measures
    cuda = hot.device.type == "cuda"
    with torch_profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for k in range(updates):
            hot.update_figures(micro, 1000 + k, 0, 0.0)
            optimizer.step()  # its own range: "Optimizer.step#AdamW.step"
            optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(hot.device)
    sort = "cuda_time_total" if cuda else "cpu_time_total"
    (out / f"{lengths}-ops.txt").write_text(prof.key_averages().table(sort_by=sort, row_limit=40))
    trace = out / f"{lengths}-trace.json"
    prof.export_chrome_trace(str(trace))
    if cuda:
        events = json.loads(trace.read_text())
        summary = kernel_summary(events, updates)
        summary["idle_gaps"] = idle_gaps(events, updates)
        summary["top_kernels"] = top_kernels(events, updates)
        (out / f"{lengths}-kernels.json").write_text(json.dumps(summary, indent=1))
        (out / f"{lengths}-kernels.txt").write_text(summary_table(summary) + "\n" + gaps_table(summary["idle_gaps"])
                                                    + "\n" + top_kernels_table(summary["top_kernels"], updates))
