"""Choosing the target's next token: argmax at temperature 0, a sample from softmax(logits / T) above
(why sampled decoding stays lossless: evaluate/ddtree.py)."""

from __future__ import annotations

import torch


def next_tokens(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """logits: [L, V] -> one token per row, [L]."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
