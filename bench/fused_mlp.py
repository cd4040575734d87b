"""SwiGLU inside the GEMMs (quack-kernels) against the compiled PyTorch MLP, one MLP at a time.

Why: SwiGLU's elementwise pass between the GEMMs is memory traffic the GEMMs could absorb; on an H100
the fused MLP saves about 3 ms of a full-length Qwen3-8B-shaped update
(benchmarks/2026-12-06-h100-flash-attention-4-and-quack-mlp.md). quack-kernels' gated GEMM
applies SwiGLU in the gate|up GEMM's epilogue, and its backward applies dSwiGLU in the down projection's
input-gradient GEMM. This times both MLPs on the shapes of the update and checks that they compute the
same thing:
- drafter: forward and backward, fp32 weights under bf16 autocast, as the drafter trains;
- target: forward only, bf16 weights, gate|up concatenated once, as the frozen target would hold them.
Median of 20 calls after 3, CUDA events; relative errors of the output and of every gradient.

Needs a Hopper or newer GPU and quack-kernels with its CuTe-DSL wheels (bench/README.md says how to
carry them; S is the site-packages folder they went into). Prints one JSON object.

    PYTHONPATH=src:$S:$S/nvidia_cutlass_dsl/dsl_packages python3 bench/fused_mlp.py [--rows 16384] [--target-rows 6144]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

import torch
import torch.nn.functional as F

from blockdraft.bench.measure import cuda_median_ms

HIDDEN, INTERMEDIATE = 4096, 12288  # Qwen3-8B's MLP


def swiglu_mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """transformers' Qwen3MLP: x [M, H]; gate, up [I, H]; down [H, I] -> [M, H]."""
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def fused_swiglu_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """The same MLP with SwiGLU in quack's GEMMs; gate_up [2I, H] is gate's rows, then up's."""
    from quack.mlp import mlp_func

    return mlp_func(x, gate_up, down, activation="swiglu", concat_layout=True, tuned=False)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def drafter_case(rows: int) -> dict[str, object]:
    """Forward and backward under bf16 autocast on fp32 weights."""
    x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gate, up = (torch.randn(INTERMEDIATE, HIDDEN, device="cuda") * 0.02 for _ in range(2))
    down = torch.randn(HIDDEN, INTERMEDIATE, device="cuda") * 0.02
    leaves = [x, *(w.requires_grad_(True) for w in (gate, up, down))]
    grad_out = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(swiglu_mlp)

    def plain():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return compiled(x, gate, up, down)

    def fused():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return fused_swiglu_mlp(x, torch.cat([gate, up]), down)

    outputs, ms = {}, {}
    for name, fn in (("compiled", plain), ("quack", fused)):
        for leaf in leaves:
            leaf.grad = None
        out = fn()
        out.backward(grad_out)
        outputs[name] = (out.detach(), [leaf.grad.clone() for leaf in leaves])
        ms[name] = cuda_median_ms(lambda fn=fn: fn().backward(grad_out))
    (out_c, grads_c), (out_q, grads_q) = outputs["compiled"], outputs["quack"]
    names = ("x", "gate", "up", "down")
    grad_errors = {name: relative(q, c) for name, q, c in zip(names, grads_q, grads_c, strict=True)}
    return {"rows": rows, "forward_backward_ms": ms, "speedup": ms["compiled"] / ms["quack"],
            "out_rel_err": relative(out_q, out_c), "grad_rel_err": grad_errors}


@torch.no_grad()
def target_case(rows: int) -> dict[str, object]:
    """Forward only, bf16 weights."""
    x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
    gate, up = (torch.randn(INTERMEDIATE, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(2))
    down = torch.randn(HIDDEN, INTERMEDIATE, device="cuda", dtype=torch.bfloat16) * 0.02
    gate_up = torch.cat([gate, up])
    compiled = torch.compile(swiglu_mlp)
    out_c, out_q = compiled(x, gate, up, down), fused_swiglu_mlp(x, gate_up, down)
    ms = {"compiled": cuda_median_ms(lambda: compiled(x, gate, up, down)),
          "quack": cuda_median_ms(lambda: fused_swiglu_mlp(x, gate_up, down))}
    return {"rows": rows, "forward_ms": ms, "speedup": ms["compiled"] / ms["quack"],
            "out_rel_err": relative(out_q, out_c)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=16384, help="the drafter's block tokens (2 x 512 anchors x B=16)")
    p.add_argument("--target-rows", type=int, default=6144, help="the target's tokens (2 x 3,072)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        print("error: fused_mlp.py needs a Hopper or newer GPU", file=sys.stderr)
        return 2
    if importlib.util.find_spec("quack") is None:
        print("error: fused_mlp.py needs quack-kernels (pip install quack-kernels; bench/README.md)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "drafter": drafter_case(args.rows), "target": target_case(args.target_rows)}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
