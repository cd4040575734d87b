"""Target-only greedy decoding the plainest way: the whole sequence re-run each step, no cache, no
mask; the reference every decoder's output must equal."""

from __future__ import annotations

import torch

from blockdraft.evaluate.ddtree import TreeDecoder


@torch.no_grad()
def greedy_reference(target, prompt: list[int], max_new_tokens: int, eos_id: int | None = None) -> list[int]:
    ids, out = list(prompt), []
    while len(out) < max_new_tokens:
        tok = int(target.model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        out.append(tok)
        ids.append(tok)
        if tok == eos_id:
            break
    return out


def tree_decode(target, drafter, prompt: list[int], max_new_tokens: int, eos_id: int | None,
                budget: int | None = None, temperature: float = 0.0, generator: torch.Generator | None = None):
    """One prompt through a TreeDecoder sized for it, eagerly."""
    decoder = TreeDecoder(target, drafter, budget, len(prompt), max_new_tokens)
    return decoder.decode(prompt, max_new_tokens, eos_id, temperature, generator)
