"""A drafter layer's seven projections in FP8 against bf16, forward + backward: what the casts cost.

`train.fp8_linears` runs the drafter's linear layers as torchao's Float8Linear (tensorwise scales). On the
mix the FP8 GEMMs saved 59 ms an update and the casts around them took back 49
(benchmarks/2026-12-07-h100-fp8-on-the-mix-profiled.md). This times one Qwen3-8B drafter layer's
projections alone, attention left out (q, k, v summed into o's input; SwiGLU MLP), on `--rows` query
rows, compiled, as the median of 20 forward + backward calls between CUDA events, and lists the GPU
kernels of 3 calls under the profiler by name and time, so the casts can be named. Variants: bf16, FP8
as the trainer converts (`train/fp8.py`, torchao's tensorwise recipe), and three other scalings:
tensorwise with the weight-gradient GEMM in bf16 (`tensorwise_gw_hp`: no transposed casts of the input
and output gradient), torchao's `rowwise` (one scale per row: an amax that parallelizes over rows) and
its `rowwise_with_gw_hp`; each with the projections as the drafter has them,
compiled static and dynamic (on a length mix the drafter runs its most frequent block class's static
graph and a dynamic one for the others: train/hotpath.py), and with q/k/v and gate/up merged into one
layer each (an input cast once, not three times and twice). CUDA with compute capability 8.9 or later;
one JSON line per variant.

    PYTHONPATH=src python3 bench/fp8_casts.py [--rows 17792] [--top 12] [--scalings ...] [--merged]
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
from blockdraft.train.fp8 import to_fp8_linears

SCALINGS = ("tensorwise", "bf16", "tensorwise_gw_hp", "rowwise", "rowwise_with_gw_hp")
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


def fp8_config(scaling: str) -> object:
    """torchao's Float8LinearConfig for a recipe name, or tensorwise_gw_hp: tensorwise scales for the
    forward and input-gradient GEMMs, the weight-gradient GEMM left in high precision."""
    from torchao.float8 import CastConfig, Float8LinearConfig, ScalingType

    if scaling != "tensorwise_gw_hp":
        return Float8LinearConfig.from_recipe_name(scaling)
    return Float8LinearConfig(cast_config_input_for_grad_weight=CastConfig(scaling_type=ScalingType.DISABLED),
                              cast_config_grad_output_for_grad_weight=CastConfig(scaling_type=ScalingType.DISABLED))


def measure(scaling: str | None, merged: bool, dynamic: bool, rows: int, top: int) -> dict:
    """`scaling`: an FP8 scaling (`fp8_config`), or None for bf16."""
    torch.manual_seed(0)
    layer = Projections(merged).cuda()
    swapped = to_fp8_linears(layer, fp8_config(scaling)) if scaling else 0
    compiled = torch.compile(layer, dynamic=dynamic)
    x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def step() -> None:
        x.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = compiled(x)
        out.float().square().mean().backward()

    median = cuda_median_ms(step)
    flops = 6 * rows * sum(p.numel() for p in layer.parameters())  # forward + both backward GEMMs
    return {"fp8": scaling, "merged": merged, "dynamic": dynamic, "rows": rows, "fp8_layers": swapped,
            "ms": round(median, 3), "tflops": round(flops / median / 1e9, 1), "kernels": kernel_table(step, top)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=17792, help="query rows of one pass (the mix's: 1,112 blocks x 16)")
    p.add_argument("--top", type=int, default=12, help="kernels listed per variant")
    p.add_argument("--scalings", nargs="+", default=list(SCALINGS), choices=SCALINGS,
                   help="bf16, or an FP8 scaling (fp8_config); each compiled static and dynamic")
    p.add_argument("--merged", action="store_true", help="also each scaling with q/k/v and gate/up merged")
    args = p.parse_args()
    scalings = [None if name == "bf16" else name for name in args.scalings]
    variants = [(scaling, False, dynamic) for scaling in scalings for dynamic in (False, True)]
    if args.merged:
        variants += [(scaling, True, False) for scaling in scalings]
    for scaling, merged, dynamic in variants:
        print(json.dumps(measure(scaling, merged, dynamic, args.rows, args.top)), flush=True)


if __name__ == "__main__":
    main()
