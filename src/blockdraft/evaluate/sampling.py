"""Choosing the target's next token: argmax at temperature 0, a sample from softmax(logits / T) above.

Sampled speculative decoding stays lossless by drawing exactly one token from the target's own
distribution at each verified prefix and accepting a draft only when it equals that draw.
"""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache

from blockdraft.evaluate.speculative import Generation, _positions, _sync
from blockdraft.model.target import Target


def next_tokens(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """logits: [L, V] -> one token per row, [L]."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


@torch.no_grad()
def target_sample(
    target: Target,
    prompt: list[int],
    max_new_tokens: int,
    eos_id: int | None,
    temperature: float,
    generator: torch.Generator | None = None,
) -> Generation:
    """Target-only decoding at a temperature: the reference distribution and the speed baseline."""
    device = target.embed_tokens.weight.device
    _sync(device)
    t0 = time.perf_counter()
    cache = DynamicCache()
    logits = target.model(input_ids=torch.tensor([prompt], device=device), past_key_values=cache, use_cache=True).logits
    out: list[int] = []
    pos = len(prompt)
    while True:
        tok = int(next_tokens(logits[0, -1:], temperature, generator)[0])
        out.append(tok)
        if len(out) >= max_new_tokens or tok == eos_id:
            break
        logits = target.model(
            input_ids=torch.tensor([[tok]], device=device),
            position_ids=_positions(pos, 1, device),
            past_key_values=cache,
            use_cache=True,
        ).logits
        pos += 1
    _sync(device)
    return Generation(out, seconds=time.perf_counter() - t0)
