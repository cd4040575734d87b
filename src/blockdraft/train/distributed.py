"""Data parallelism under torchrun: joining the job, wrapping the drafter's training forward (DDP
or FSDP2), moving weights between world sizes, and the few collectives the loop itself needs.

Why these choices:
- One process per GPU, launched by `torchrun` (its env vars say rank, world size, local rank):
  NCCL on CUDA (device = LOCAL_RANK), gloo on CPU, so the same code runs in CI on a laptop.
- Only the drafter is data-parallel. The frozen target has no gradients and no optimizer state, so
  every rank keeps a full copy (bf16: 16 GB for an 8B target): sharding it with FSDP2 would add an
  all-gather per target layer per micro-batch to save memory that a drafter run does not need on
  80-141 GB GPUs. A target too big for one GPU needs tensor-parallel inference: not built yet.
- DDP by default (the drafter is small: replicated weights and AdamW state fit, and one
  all-reduce per update is the cheapest sync); FSDP2 (`train.parallel=fsdp`) shards the drafter's
  weights, gradients and AdamW state (16 bytes per parameter) when those crowd the GPU.
- Gradients are reduced once per update: every micro-batch but the last runs under `defer_sync`.
- A rank that dies: torchrun sees its exit and stops the others at once (the job exits non-zero,
  naming the rank and its signal); a rank that hangs is bounded by `train.dist_timeout_s`, after
  which every collective waiting for it fails with a timeout error.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.nn.parallel import DistributedDataParallel

from blockdraft.train.checkpoint import LoadedCheckpoint, load_into


@dataclass(frozen=True)
class World:
    """This process's place in the job; `ckpt_group`: under a process group (a torchrun job, one
    process included), the gloo group that checkpoint writes use (DCP stages and writes on the CPU)."""

    rank: int = 0
    size: int = 1
    ckpt_group: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def init(device: torch.device, timeout_s: float) -> tuple[World, torch.device]:
    """Join the torchrun job, if launched by one (or use the group a caller already made).

    Returns the world and this rank's device (cuda:LOCAL_RANK under NCCL)."""
    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) == 1:
            return World(), device
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if device.type == "cuda":
            device = torch.device("cuda", local)
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    return World(dist.get_rank(), dist.get_world_size(), group), device


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap(module: nn.Module, mode: str, world: World, device: torch.device
         ) -> tuple[nn.Module, Callable[[], AbstractContextManager]]:
    """(the module to call in the training forward, the context that defers the gradient sync).

    FSDP2 shards the drafter as one unit: its layers' context K/V (KV injection) are computed
    outside each layer's forward, where a per-layer group would not be gathered yet. The drafter
    is small next to the target, so gathering it whole per forward costs little; what sharding
    saves is the gradients and the AdamW state. The optimizer must be built after this: FSDP2
    swaps the parameters for sharded DTensors in place."""
    if not world.distributed:
        return module, contextlib.nullcontext
    if mode == "ddp":
        ddp = DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None,
                                      broadcast_buffers=False)  # buffers are constants (RoPE)
        return ddp, ddp.no_sync
    fully_shard(module)
    return module, lambda: _fsdp_no_sync(module)


@contextlib.contextmanager
def _fsdp_no_sync(module: FSDPModule) -> Iterator[None]:
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


def sum_over_ranks(values: list[int | bool], device: torch.device) -> list[int]:
    """Each value summed over the ranks (one small all-reduce), on every rank."""
    if not dist.is_initialized():
        return [int(v) for v in values]
    t = torch.tensor([int(v) for v in values], dtype=torch.int64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def rank_major(values: list[int], device: torch.device) -> list[int]:
    """Every rank's values (the same count on each), concatenated in rank order, on every rank."""
    if not dist.is_initialized():
        return [int(v) for v in values]
    n, rank = len(values), dist.get_rank()
    placed = [0] * (n * dist.get_world_size())
    placed[rank * n : (rank + 1) * n] = values
    return sum_over_ranks(placed, device)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


@contextlib.contextmanager
def main_rank_first(is_main: bool) -> Iterator[None]:
    """The body runs on rank 0 first, then on the other ranks: rank 0 fills a shared on-disk cache (the
    tokenised dataset) that the others then only read."""
    if not is_main:
        barrier()
    yield
    if is_main:
        barrier()


def state_dicts(drafter: nn.Module, optimizer: torch.optim.Optimizer, with_optim: bool | None = None
                ) -> dict[str, dict[str, Any]]:
    """{"model", "optim"}: this rank's live state, keyed by parameter name (sharded under FSDP2), what
    a checkpoint stores at any world size. Before AdamW's first update there is no "optim" (unless
    `with_optim` asks for it): torch would make one by running a zero-LR step, which counts in Adam's
    bias correction."""
    state = {"model": get_model_state_dict(drafter)}
    if with_optim is None:
        with_optim = bool(optimizer.state)
    if with_optim:
        state["optim"] = get_optimizer_state_dict(drafter, optimizer)
    return state


def full_drafter_state(drafter: nn.Module) -> dict[str, torch.Tensor]:
    """The whole drafter on every rank, on its device (a collective under FSDP2; with cpu_offload,
    torch would give it to rank 0 alone)."""
    return get_model_state_dict(drafter, options=StateDictOptions(full_state_dict=True))


def load_weights(drafter: nn.Module, optimizer: torch.optim.Optimizer, ckpt: LoadedCheckpoint) -> None:
    """Put a checkpoint's drafter and AdamW state into this run, whatever world size wrote it: dcp.load
    reads into this run's own layout (each rank the slices it holds)."""
    state = state_dicts(drafter, optimizer, with_optim="optim" in ckpt.parts)
    load_into(state, ckpt.path)
    set_model_state_dict(drafter, state["model"])
    if "optim" in state:
        set_optimizer_state_dict(drafter, optimizer, state["optim"])
    else:  # saved before AdamW's first update
        optimizer.state.clear()
