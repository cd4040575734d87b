"""FP8 against bf16 for the frozen target's linear layers, one matmul at a time.

FP8 here is e4m3 with per-row scales (torch._scaled_mm): each weight row quantised once, each token's
activations at every call, fp32 sums, bf16 out. Issue 19 evaluated it for the target's training forward
(benchmarks/2026-12-01-h200-fp8-target.md): 1.13x on a full-length 8B-shaped update, but held-out tau
fell beyond the seed spread on the demo and on SmolLM2, so it is not a training setting.

For each (M, K, N): an nn.Linear in bf16 and its `FP8Linear` twin (activation quantisation included),
both compiled, timed as the median of 50 calls after 3 between CUDA events; prints TFLOP/s, the ratio
and the relative error.
The default shapes are a Qwen3-8B layer's on 6,144 tokens (two 3,072-token rows): MLP up and down, q/o,
and k/v on a token count that is not a multiple of 16. CUDA with compute capability 8.9 or later.

    PYTHONPATH=src python3 bench/fp8_matmul.py [--shapes 6144x4096x12288,...]
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from blockdraft.bench.measure import cuda_median_ms

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max  # 448


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] -> (q e4m3 [M, K], scale fp32 [M, 1]) with x ~= q * scale: each row's largest entry
    lands on the format's largest value, so a row of small activations keeps its precision."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX  # [M, 1]
    return (x.float() / scale).to(E4M3), scale


class FP8Linear(nn.Module):
    """The forward of a frozen nn.Linear as one FP8 matmul, beside the original (which it leaves as is)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight, scale = quantize_rows(linear.weight.detach())  # [N, K], [N, 1]
        self.register_buffer("weight_e4m3", weight)
        self.register_buffer("weight_scale", scale.t().contiguous())  # [1, N]
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., K] -> [..., N] in x's dtype."""
        q, scale = quantize_rows(x.reshape(-1, x.shape[-1]))  # [M, K], [M, 1]
        out = torch._scaled_mm(q, self.weight_e4m3.t(), scale_a=scale, scale_b=self.weight_scale,
                               out_dtype=torch.bfloat16)  # [M, N]; the weight's transpose is column-major
        out = out.to(x.dtype).view(*x.shape[:-1], -1)
        return out if self.bias is None else out + self.bias


SHAPES = "6144x4096x12288,6144x12288x4096,6144x4096x4096,6001x4096x1024"


def seconds_per_call(f, x: torch.Tensor, calls: int = 50) -> float:
    """Median seconds of one call, between CUDA events, after 3."""
    with torch.no_grad():
        return cuda_median_ms(lambda: f(x), calls) / 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=SHAPES, help="comma-separated MxKxN")
    args = p.parse_args()
    torch.manual_seed(0)
    for shape in args.shapes.split(","):
        m, k, n = map(int, shape.split("x"))
        linear = nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        bf16, fp8 = torch.compile(linear), torch.compile(FP8Linear(linear))
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        t_bf16, t_fp8 = seconds_per_call(bf16, x), seconds_per_call(fp8, x)
        with torch.no_grad():
            exact = bf16(x).float()
            err = ((fp8(x).float() - exact).norm() / exact.norm()).item()
        flops = 2 * m * k * n
        print(f"M={m} K={k} N={n}: bf16 {flops / t_bf16 / 1e12:.0f} TFLOP/s, fp8 {flops / t_fp8 / 1e12:.0f} TFLOP/s "
              f"(activation quantisation included), {t_bf16 / t_fp8:.2f}x, relative error {err:.4f}")


if __name__ == "__main__":
    main()
