"""Greedy speculative decoding with a DFlash drafter: the measured acceptance length (tau).

One round: the drafter sees the context features of every committed token (its own K/V cache of
them) and drafts B-1 tokens after the anchor (the last committed token) in one pass; the target
verifies [anchor, drafts] in one pass with its KV cache; the longest prefix of drafts equal to the
target's argmax is accepted, plus the target's next token as the bonus. tau = accepted + 1.
Every emitted token is a target argmax, so the output equals target-only greedy decoding.
Sweeps over prompts and modes (and the target-only baseline) live in `evaluate/runner.py`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from blockdraft.model.drafter import DFlashDrafter
from blockdraft.model.target import Target


@dataclass
class Generation:
    tokens: list[int]
    acceptance: list[int] = field(default_factory=list)  # tau of each round (speculative only)
    seconds: float = 0.0

    @property
    def tau(self) -> float:
        return sum(self.acceptance) / len(self.acceptance) if self.acceptance else 0.0


def _positions(start: int, length: int, device: torch.device) -> torch.Tensor:
    return torch.arange(start, start + length, device=device)[None, :]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def draft_block(
    drafter: DFlashDrafter,
    embed: torch.nn.Module,
    anchor: int,
    start: int,
    new_ctx: torch.Tensor,
    new_ctx_start: int,
    draft_cache: list[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """One drafting pass: [anchor, MASK...] at positions start.. -> (block ids [1, B], hidden [1, B, H]).
    new_ctx: [1, C, N*H] taps of the tokens committed since the last pass, which extend `draft_cache`."""
    device, dtype = new_ctx.device, next(drafter.parameters()).dtype
    block_ids = torch.full((1, drafter.block_size), drafter.mask_token_id, device=device)
    block_ids[0, 0] = anchor
    hidden = drafter(
        embed(block_ids).to(dtype),
        _positions(start, drafter.block_size, device),
        drafter.fuse(new_ctx.to(dtype)),
        _positions(new_ctx_start, new_ctx.shape[1], device),
        mask=None,
        cache=draft_cache,
    )
    return block_ids, hidden


@torch.no_grad()
def speculative_greedy(
    target: Target, drafter: DFlashDrafter, prompt: list[int], max_new_tokens: int, eos_id: int | None
) -> Generation:
    device = target.embed_tokens.weight.device
    block = drafter.block_size
    lm_head = target.lm_head
    _sync(device)
    t0 = time.perf_counter()

    cache = DynamicCache()
    logits, taps = target.step(torch.tensor([prompt], device=device), _positions(0, len(prompt), device), cache)
    anchor = int(logits[0, -1].argmax())
    out, acceptance = [anchor], []
    new_ctx, new_ctx_start = taps, 0  # context features not yet in the drafter's cache
    draft_cache: list[tuple[torch.Tensor, torch.Tensor]] = []
    start = len(prompt)  # absolute position of the anchor
    while len(out) < max_new_tokens and anchor != eos_id:
        block_ids, hidden = draft_block(drafter, target.embed_tokens, anchor, start, new_ctx, new_ctx_start,
                                        draft_cache)
        draft = lm_head(hidden[0, 1:].to(lm_head.weight.dtype)).argmax(-1)  # [B-1]
        block_ids[0, 1:] = draft
        logits, taps = target.step(block_ids, _positions(start, block, device), cache)
        verified = logits[0].argmax(-1)  # [B]: target's token after each prefix of the block
        accepted_t = (draft == verified[:-1]).to(torch.int64).cumprod(0).sum()
        round_ = torch.cat([accepted_t[None], draft, verified]).tolist()  # the round's one host sync
        accepted = round_[0]
        emitted = round_[1 : 1 + accepted] + [round_[block + accepted]]
        out.extend(emitted)
        acceptance.append(accepted + 1)
        rejected = block - accepted - 1
        if rejected:
            cache.crop(-rejected)  # keep the anchor and the accepted drafts
        new_ctx, new_ctx_start = taps[:, : accepted + 1], start
        start += accepted + 1
        anchor = emitted[-1]
        if eos_id is not None and eos_id in emitted:
            out = out[: len(out) - len(emitted) + emitted.index(eos_id) + 1]
            break
    _sync(device)
    return Generation(out[:max_new_tokens], acceptance, time.perf_counter() - t0)
