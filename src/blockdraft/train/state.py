"""The trainer's stateful parts besides the weights: each owns its state (`state_dict` /
`load_state_dict`) and the checkpointer saves them by name, so a resume restores every one alike."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from blockdraft.data.batching import BatchSampler
from blockdraft.data.prefetch import Batch, Prefetcher


@dataclass
class TrainState:
    """Progress: optimizer updates applied, and the real tokens and epoch they reached."""

    step: int = 0
    tokens: int = 0
    epoch: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "tokens": self.tokens, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.tokens, self.epoch = int(state["step"]), int(state["tokens"]), int(state["epoch"])


class RngState:
    """torch, numpy and Python generators, and this device's CUDA one (the world size may differ)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device if device.type == "cuda" else None

    def state_dict(self) -> dict[str, Any]:
        rng = {"torch": torch.get_rng_state(), "numpy": list(np.random.get_state()), "python": list(random.getstate())}
        rng["numpy"][1] = torch.from_numpy(rng["numpy"][1].astype(np.int64))
        if self.cuda is not None:
            rng["cuda"] = torch.cuda.get_rng_state(self.cuda)
        return rng

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        np.random.set_state(tuple(state["numpy"]))
        random.setstate(tuple(state["python"]))
        if "cuda" in state and self.cuda is not None:
            torch.cuda.set_rng_state(state["cuda"], self.cuda)


class DataFeed:
    """An update's micro-batches: the data position (the prefetcher's) and the skip list (batches a
    rollback put aside). Batch ids name batches of one world size's plan, so a resume on another
    world size continues the position by `carry_over` and drops the skip list (`world_note` says so)."""

    def __init__(self, prefetcher: Prefetcher, sampler: BatchSampler, world: int, grad_accum: int,
                 to_device: Callable[[Batch], Batch]) -> None:
        self.prefetcher, self.sampler, self.world = prefetcher, sampler, world
        self.grad_accum, self.to_device = grad_accum, to_device
        self.skip_list: set[str] = set()
        self.world_note: str | None = None

    def next_update(self, on_skip: Callable[[Batch], None]) -> list[Batch]:
        """`grad_accum` micro-batches on the device; each one on the skip list goes to `on_skip` instead."""
        micro: list[Batch] = []
        while len(micro) < self.grad_accum:
            batch = self.prefetcher.next()
            if batch.batch_id in self.skip_list:
                on_skip(batch)
            else:
                micro.append(self.to_device(batch))
        return micro

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.prefetcher.state_dict(), "world_size": self.world,
                "skip_list": sorted(self.skip_list)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = int(state["world_size"])
        self.prefetcher.load_state_dict(self.sampler.carry_over(state["position"], saved))
        self.skip_list = set(state["skip_list"]) if saved == self.world else set()
        if saved != self.world:
            self.world_note = (
                f"checkpoint written by {saved} ranks, resumed on {self.world}: weights, optimizer, step and LR "
                f"schedule continue exactly; the batch plan continues with the same update if world_size x "
                f"grad_accum is unchanged, else from the same fraction of epoch {state['position']['epoch']}; the "
                f"skip list ({len(state['skip_list'])} batches of the old plan) is dropped")
