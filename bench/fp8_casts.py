"""A drafter layer's projections in FP8 against bf16, forward + backward: what the casts cost.

`train.fp8_linears` runs the drafter's linear layers as torchao's Float8Linear (tensorwise scales). On the
mix the FP8 GEMMs saved 59 ms an update and the casts around them took back 49
(benchmarks/2026-12-07-h100-fp8-on-the-mix-profiled.md). This times, on `--rows` query rows, either one
Qwen3-8B drafter layer's seven projections alone (`--layer projections`: attention left out, q, k, v
summed into o's input; SwiGLU MLP) or the drafter's own layer (`--layer draft`: its norms, RoPE and
attention over `--context` context rows, everything visible), compiled, as the median of 20 forward +
backward calls between CUDA events, and lists the GPU kernels of 3 calls under the profiler by name and
time, so the casts can be named. Variants: bf16, FP8 as the trainer converts (`train/fp8.py`, torchao's
tensorwise recipe), and three other scalings: tensorwise with the weight-gradient GEMM in bf16
(`tensorwise_gw_hp`: no transposed casts of the input and output gradient), torchao's `rowwise` (one
scale per row: an amax that parallelizes over rows) and its `rowwise_with_gw_hp`; each compiled static
and dynamic (on a length mix the drafter runs its most frequent block class's static graph and a dynamic
one for the others: train/hotpath.py), and with `--merged` the projections with q/k/v and gate/up merged
into one layer each. `--inductor` runs every variant once under each of several sets of
`torch._inductor.config` settings (JSON objects, dotted names), to try settings that change how inductor
fuses the casts: `'{}' '{"triton.tile_reductions": true}'`. TFLOP/s count the linear layers' FLOPs
only. CUDA with compute capability 8.9 or later; one JSON line per variant.

    PYTHONPATH=src python3 bench/fp8_casts.py [--layer projections|draft] [--rows 17792] [--context 6144]
        [--top 12] [--scalings ...] [--merged] [--inductor JSON ...]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import torch._inductor.config as inductor_config
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config

from blockdraft.bench.measure import cuda_median_ms
from blockdraft.bench.profile import top_kernels
from blockdraft.model.drafter import DraftLayer, Float32RotaryEmbedding
from blockdraft.train.fp8 import to_fp8_linears

SCALINGS = ("tensorwise", "bf16", "tensorwise_gw_hp", "rowwise", "rowwise_with_gw_hp")
HIDDEN, HEADS_DIM, KV_DIM, FFN = 4096, 4096, 1024, 12288  # Qwen3-8B: 32 x 128 query, 8 x 128 key/value
HEAD_DIM = 128


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


class DraftLayerPass(nn.Module):
    """The drafter's own layer (model/drafter.py's DraftLayer) on query rows x [1, M, H] with the context
    rows' K/V from ctx [1, T, H], no mask (SDPA): the projections with the norms, RoPE and attention
    that inductor fuses their casts with in the trainer's graph."""

    def __init__(self) -> None:
        super().__init__()
        cfg = Qwen3Config(hidden_size=HIDDEN, intermediate_size=FFN, num_attention_heads=HEADS_DIM // HEAD_DIM,
                          num_key_value_heads=KV_DIM // HEAD_DIM, head_dim=HEAD_DIM, rms_norm_eps=1e-6)
        self.layer = DraftLayer(cfg)
        self.rope = Float32RotaryEmbedding(cfg)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        t, m = ctx.shape[1], x.shape[1]
        rope_q = self.rope(x, torch.arange(t, t + m, device=x.device)[None])  # cos, sin: [1, M, hd]
        rope_ctx = self.rope(x, torch.arange(t, device=x.device)[None])  # [1, T, hd]
        return self.layer(x, rope_q, self.layer.self_attn.kv(ctx, *rope_ctx), None)  # [1, M, H]


def linear_flops(layer: nn.Module, rows: int, context: int) -> int:
    """Forward + both backward GEMMs of every linear layer; k and v also run on the context rows."""
    total = 0
    for name, module in layer.named_modules():
        if isinstance(module, nn.Linear):
            total += 6 * module.weight.numel() * (rows + (context if name.endswith(("k_proj", "v_proj")) else 0))
    return total


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


def inductor_settings(text: str) -> dict[str, object]:
    """One `--inductor` argument: a JSON object of `torch._inductor.config` names (dotted for nested ones)
    and values. Raises ValueError naming what is wrong, before anything compiles."""
    settings = json.loads(text)
    if not isinstance(settings, dict):
        raise ValueError(f"not a JSON object: {text}")
    known = inductor_config.get_config_copy()
    unknown = [name for name in settings if name not in known]
    if unknown:
        raise ValueError(f"torch._inductor.config has no setting {unknown[0]!r}")
    return settings


def measure(kind: str, scaling: str | None, merged: bool, dynamic: bool, rows: int, context: int, top: int) -> dict:
    """`kind`: projections or draft; `scaling`: an FP8 scaling (`fp8_config`), or None for bf16. Compiles
    afresh, under the inductor settings in force."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    if kind == "draft":
        layer, shapes = DraftLayerPass(), [(1, rows, HIDDEN), (1, context, HIDDEN)]
    else:
        layer, shapes, context = Projections(merged), [(rows, HIDDEN)], 0
    layer = layer.cuda()
    swapped = to_fp8_linears(layer, fp8_config(scaling)) if scaling else 0
    compiled = torch.compile(layer, dynamic=dynamic)
    inputs = [torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for shape in shapes]

    def step() -> None:
        for x in inputs:
            x.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = compiled(*inputs)
        out.float().square().mean().backward()

    median = cuda_median_ms(step)
    flops = linear_flops(layer, rows, context)
    return {"layer": kind, "fp8": scaling, "merged": merged, "dynamic": dynamic, "rows": rows, "context": context,
            "fp8_layers": swapped, "ms": round(median, 3), "tflops": round(flops / median / 1e9, 1),
            "kernels": kernel_table(step, top)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layer", choices=("projections", "draft"), default="projections",
                   help="the seven projections alone, or the drafter's layer with its norms and attention")
    p.add_argument("--rows", type=int, default=17792, help="query rows of one pass (the mix's: 1,112 blocks x 16)")
    p.add_argument("--context", type=int, default=6144, help="context rows of one pass (--layer draft)")
    p.add_argument("--top", type=int, default=12, help="kernels listed per variant")
    p.add_argument("--scalings", nargs="+", default=list(SCALINGS), choices=SCALINGS,
                   help="bf16, or an FP8 scaling (fp8_config); each compiled static and dynamic")
    p.add_argument("--merged", action="store_true", help="also each scaling with q/k/v and gate/up merged")
    p.add_argument("--inductor", nargs="+", default=["{}"], metavar="JSON",
                   help="sets of torch._inductor.config settings; every variant runs under each")
    args = p.parse_args()
    try:
        setting_sets = [inductor_settings(text) for text in args.inductor]
    except ValueError as e:
        p.error(f"--inductor: {e}")
    scalings = [None if name == "bf16" else name for name in args.scalings]
    variants = [(scaling, False, dynamic) for scaling in scalings for dynamic in (False, True)]
    if args.merged and args.layer == "projections":
        variants += [(scaling, True, False) for scaling in scalings]
    for settings in setting_sets:
        with inductor_config.patch(settings):
            for scaling, merged, dynamic in variants:
                result = measure(args.layer, scaling, merged, dynamic, args.rows, args.context, args.top)
                print(json.dumps({**result, "inductor": settings}), flush=True)


if __name__ == "__main__":
    main()
