"""The one place that turns `auto`, `cpu` or `cuda` into a device, and says whether a model fits on it:
train, eval, bench and regenerate agree."""

from __future__ import annotations

from pathlib import Path
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


def free_memory_bytes(device: torch.device) -> int | None:
    """What new tensors can take on the device: the GPU's free memory, or the host's available memory
    (Linux's MemAvailable); None where it cannot be read."""
    import torch

    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    kib = next((line.split()[1] for line in meminfo.splitlines() if line.startswith("MemAvailable:")), None)
    return int(kib) * 1024 if kib is not None else None


def require_room(need: int, device: torch.device, what: str, remedy: str) -> None:
    """Refuse in one line, before loading, `need` bytes (`what`: what takes them) that exceed the device's
    free memory: a process that runs the host out of memory is killed with no message at all, and one that
    runs the GPU out of it ends in a traceback."""
    free = free_memory_bytes(device)
    if free is not None and need > free:
        where = "GPU" if device.type == "cuda" else "machine"
        raise UserError(f"{what} take {need / 1e9:.1f} GB and this {where} has {free / 1e9:.1f} GB free: {remedy}")
