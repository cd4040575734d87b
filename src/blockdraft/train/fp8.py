"""FP8 matmuls for the drafter's linear layers while training (`train.fp8_linears`).

torchao's float8 training with tensorwise scales: each linear's input and weight are cast to e4m3 and its
output gradient to e5m2, one scale per tensor from its absolute maximum, and the three GEMMs of a layer
(forward, input gradient, weight gradient) run as FP8 `_scaled_mm`, their outputs in the input's dtype
(bf16 under autocast). The weights stay the same fp32 Parameters, so AdamW, checkpoints and exports do
not change; only the arithmetic of the matmuls does. Decoding (the trainer's held-out evaluation,
export, serving) runs plain layers.
"""

from __future__ import annotations

import importlib.util

import torch
from torch import nn

from blockdraft.errors import UserError, first_line

FP8_MIN_CAPABILITY = (8, 9)  # Ada and newer have FP8 tensor cores


def require_fp8(device: torch.device) -> None:
    """Refuse `train.fp8_linears` in one line where it cannot run: before minutes of loading."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < FP8_MIN_CAPABILITY:
        need = ".".join(map(str, FP8_MIN_CAPABILITY))
        raise UserError(f"train.fp8_linears: FP8 matmuls need a GPU of compute capability {need} or newer "
                        f"(this device: {device})")
    if importlib.util.find_spec("torchao") is None:
        raise UserError("train.fp8_linears needs torchao: pip install 'blockdraft[fp8]'")


def fits_fp8(module: nn.Module, _name: str = "") -> bool:
    """`_scaled_mm` takes both dims of a weight only in multiples of 16."""
    return isinstance(module, nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0


def to_fp8_linears(module: nn.Module, config: object | None = None) -> int:
    """Swap the module's linear layers that fit for torchao's Float8Linear, in place and keeping their
    Parameters; returns how many multiply in FP8. `config`: a torchao Float8LinearConfig (bench/fp8_casts.py
    compares others); None is the tensorwise recipe. Before the optimizer, torch.compile and DDP or FSDP2."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        from torchao.float8.float8_linear import Float8Linear
    except Exception as e:  # a torchao built for another torch fails in many ways
        raise UserError(f"train.fp8_linears: torchao does not import ({type(e).__name__}: {first_line(e)})") from None
    config = config or Float8LinearConfig.from_recipe_name("tensorwise")
    convert_to_float8_training(module, config=config, module_filter_fn=fits_fp8)
    return sum(isinstance(m, Float8Linear) for m in module.modules())
