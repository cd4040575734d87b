"""FP8 matmuls for the frozen target's training forward (`target.fp8_features`).

The target is frozen and only its tapped hidden states reach the drafter, so its linear layers can run
as e4m3 matmuls with per-row scales: each weight row quantised once, each token's activations at every
call, products summed in fp32 (torch._scaled_mm), bf16 out. The bf16 weights stay: decoding and the
drafter's shared embedding and lm_head never see FP8.
"""

from __future__ import annotations

import torch
from torch import nn

from blockdraft.errors import UserError

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


def fp8_linears(layers: list[nn.Module]) -> dict[nn.Linear, FP8Linear]:
    """Every nn.Linear inside `layers` with its FP8 twin; a clear error where the device has no FP8 matmul."""
    linears = [m for layer in layers for m in layer.modules() if isinstance(m, nn.Linear)]
    if not linears:
        return {}
    probe = linears[0].weight
    try:
        torch._scaled_mm(torch.zeros(16, 16, dtype=E4M3, device=probe.device),
                         torch.zeros(16, 16, dtype=E4M3, device=probe.device).t(),
                         scale_a=torch.ones(16, 1, device=probe.device), scale_b=torch.ones(1, 16, device=probe.device),
                         out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError) as exc:
        raise UserError(f"target.fp8_features: this device ({probe.device}) has no FP8 matmul with per-row scales "
                        f"(CUDA needs compute capability 8.9 or later): {str(exc).splitlines()[0]}") from None
    odd = [tuple(m.weight.shape) for m in linears if m.in_features % 16 or m.out_features % 16]
    if odd:
        raise UserError(f"target.fp8_features: FP8 matmuls need layer sizes divisible by 16; this target has {odd[0]}")
    return {m: FP8Linear(m) for m in linears}
