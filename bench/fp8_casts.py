"""A drafter layer's seven projections in FP8 against bf16, forward + backward: what the casts cost.

`train.fp8_linears` runs the drafter's linear layers as torchao's Float8Linear (tensorwise scales). On the
mix the FP8 GEMMs saved 59 ms an update and the casts around them took back 49
(benchmarks/2026-12-07-h100-fp8-on-the-mix-profiled.md). This times one Qwen3-8B drafter layer's
projections alone, attention left out (q, k, v summed into o's input; SwiGLU MLP), on `--rows` query
rows, compiled, as the median of 20 forward + backward calls between CUDA events, and lists the GPU
kernels of 3 calls under the profiler by name and time, so the casts can be named. Variants: bf16, FP8
(the trainer's own conversion, `train/fp8.py`) and FP8 with torchao's rowwise scales (one scale per row,
an amax that parallelizes over rows), each with the projections as the drafter has them,
compiled static and dynamic (on a length mix the drafter runs its most frequent block class's static
graph and a dynamic one for the others: train/hotpath.py), and with q/k/v and gate/up merged into one
layer each (an input cast once, not three times and twice). CUDA with compute capability 8.9 or later;
one JSON line per variant.

    PYTHONPATH=src python3 bench/fp8_casts.py [--rows 17792] [--top 12]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from blockdraft.bench.measure import cuda_median_ms
from blockdraft.bench.profile import top_kernels
from blockdraft.train.fp8 import FP8_RECIPE, to_fp8_linears

HIDDEN, HEADS_DIM, KV_DIM, FFN = 4096, 4096, 1024, 12288  # Qwen3-8B: 32 x 128 query, 8 x 128 key/value


class Projections(nn.Module):
    """x [M, H] -> [M, H] through q/k/v -> o and gate/up -> down, as separate or merged linear layers."""

    def __init__(self, merged: bool) -> None:
        super().__init__()
        self.merged = merged
        if merged:
            self.qkv = nn.Linear(HIDDEN, HEADS_DIM + 2 * KV_DIM, bias=False)
            self.gate_up = nn.Linear(HIDDEN, 2 * FFN, bias=False)
        else:
            self.q = nn.Linear(HIDDEN, HEADS_DIM, bias=False)
            self.k = nn.Linear(HIDDEN, KV_DIM, bias=False)
            self.v = nn.Linear(HIDDEN, KV_DIM, bias=False)
            self.gate = nn.Linear(HIDDEN, FFN, bias=False)
            self.up = nn.Linear(HIDDEN, FFN, bias=False)
        self.o = nn.Linear(HEADS_DIM, HIDDEN, bias=False)
        self.down = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.merged:
            q, k, v = self.qkv(x).split([HEADS_DIM, KV_DIM, KV_DIM], dim=-1)  # [M, 4096], [M, 1024] x 2
            gate, up = self.gate_up(x).chunk(2, dim=-1)  # [M, FFN] x 2
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
            gate, up = self.gate(x), self.up(x)
        groups = HEADS_DIM // KV_DIM
        h = x + self.o(q + (k + v).repeat(1, groups))  # [M, H]: stands in for attention
        return h + self.down(F.silu(gate) * up)  # [M, H]


def kernel_table(step, top: int, calls: int = 3) -> list[dict]:
    """`step` called `calls` times under the profiler, read as `blockdraft bench --profile` reads a trace."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return [{**k, "ms": round(k["ms"], 3)} for k in top_kernels(json.loads(path.read_text()), calls, top)]


def measure(fp8: str | None, merged: bool, dynamic: bool, rows: int, top: int) -> dict:
    """`fp8`: torchao's recipe name, or None for bf16."""
    torch.manual_seed(0)
    layer = Projections(merged).cuda()
    swapped = to_fp8_linears(layer, fp8) if fp8 else 0
    compiled = torch.compile(layer, dynamic=dynamic)
    x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def step() -> None:
        x.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = compiled(x)
        out.float().square().mean().backward()

    median = cuda_median_ms(step)
    flops = 6 * rows * sum(p.numel() for p in layer.parameters())  # forward + both backward GEMMs
    return {"fp8": fp8, "merged": merged, "dynamic": dynamic, "rows": rows, "fp8_layers": swapped,
            "ms": round(median, 3), "tflops": round(flops / median / 1e9, 1), "kernels": kernel_table(step, top)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=17792, help="query rows of one pass (the mix's: 1,112 blocks x 16)")
    p.add_argument("--top", type=int, default=12, help="kernels listed per variant")
    args = p.parse_args()
    for fp8 in (FP8_RECIPE, None, "rowwise"):
        for merged, dynamic in ((False, False), (False, True), (True, False)):
            print(json.dumps(measure(fp8, merged, dynamic, args.rows, args.top)), flush=True)


if __name__ == "__main__":
    main()
