"""An untrained tiny drafter beside the tiny target, built directly (no trainer: fast)."""

from __future__ import annotations

import pytest
import torch

from blockdraft.model.drafter import DFlashDrafter, drafter_config
from blockdraft.model.target import load_target


@pytest.fixture(scope="session")
def tiny_pair(tiny_target):
    """(target, drafter, tokenizer) with block size 4, taps [0, 2], fp32 on CPU."""
    target, tokenizer, hf_cfg = load_target(tiny_target, [0, 2], torch.device("cpu"), "float32")
    torch.manual_seed(1)
    drafter = DFlashDrafter(drafter_config(hf_cfg, 1, 4, [0, 2], tokenizer.mask_token_id)).eval()
    return target, drafter, tokenizer
