"""FP8 against bf16 for the frozen target's linear layers (`target.fp8_features`), one matmul at a time.

For each (M, K, N): an nn.Linear in bf16 and its `model.fp8.FP8Linear` twin (activation quantisation
included), both compiled, timed over 50 calls after 3; prints TFLOP/s, the ratio and the relative error.
The default shapes are a Qwen3-8B layer's on 6,144 tokens (two 3,072-token rows): MLP up and down, q/o,
and k/v on a token count that is not a multiple of 16. CUDA with compute capability 8.9 or later.

    PYTHONPATH=src python3 bench/fp8_matmul.py [--shapes 6144x4096x12288,...]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from blockdraft.model.fp8 import FP8Linear

SHAPES = "6144x4096x12288,6144x12288x4096,6144x4096x4096,6001x4096x1024"


def seconds_per_call(f, x: torch.Tensor, calls: int = 50) -> float:
    with torch.no_grad():
        for _ in range(3):
            f(x)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            f(x)
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls


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
