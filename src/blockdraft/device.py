"""The one place that turns `auto`, `cpu` or `cuda` into a device: train, eval, bench and regenerate agree."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

from blockdraft.errors import UserError

if TYPE_CHECKING:
    import torch

DeviceName = Literal["auto", "cpu", "cuda"]
DEVICES: tuple[str, ...] = get_args(DeviceName)  # the config's train.device and every verb's --device


def pick_device(name: str) -> torch.device:
    """`auto` takes the GPU when one is visible; asking for `cuda` without one is a user error."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("device cuda was asked for, but no CUDA device is visible")
    return torch.device(name)
