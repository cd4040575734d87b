"""Choosing the target's next token: argmax at temperature 0, a sample from softmax(logits / T) above.

Sampled speculative decoding stays lossless by drawing exactly one token from the target's own
distribution at each verified prefix and accepting a draft only when it equals that draw.
"""

from __future__ import annotations

import torch


def next_tokens(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """logits: [L, V] -> one token per row, [L]."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
