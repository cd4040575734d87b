"""Greedy speculative decoding with a DFlash drafter: the measured acceptance length (tau).

One round: the drafter sees the context features of every committed token (its own K/V cache of
them) and drafts B-1 tokens after the anchor (the last committed token) in one pass; the target
verifies [anchor, drafts] in one pass with its KV cache; the longest prefix of drafts equal to the
target's argmax is accepted, plus the target's next token as the bonus. tau = accepted + 1.
Every emitted token is a target argmax, so the output equals target-only greedy decoding.
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


@torch.no_grad()
def target_greedy(target: Target, prompt: list[int], max_new_tokens: int, eos_id: int | None) -> Generation:
    """Target-only greedy decoding with a KV cache: the reference output and the speed baseline."""
    device = target.embed_tokens.weight.device
    _sync(device)
    t0 = time.perf_counter()
    cache = DynamicCache()
    ids = torch.tensor([prompt], device=device)
    logits = target.model(input_ids=ids, past_key_values=cache, use_cache=True).logits
    out: list[int] = []
    pos = len(prompt)
    while True:
        tok = int(logits[0, -1].argmax())
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


@torch.no_grad()
def speculative_greedy(
    target: Target, drafter: DFlashDrafter, prompt: list[int], max_new_tokens: int, eos_id: int | None
) -> Generation:
    device = target.embed_tokens.weight.device
    dtype = next(drafter.parameters()).dtype
    block = drafter.block_size
    embed, lm_head = target.embed_tokens, target.lm_head
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
        block_ids = torch.full((1, block), drafter.mask_token_id, device=device)
        block_ids[0, 0] = anchor
        hidden = drafter(
            embed(block_ids).to(dtype),
            _positions(start, block, device),
            drafter.fuse(new_ctx.to(dtype)),
            _positions(new_ctx_start, new_ctx.shape[1], device),
            mask=None,
            cache=draft_cache,
        )
        draft = lm_head(hidden[0, 1:].to(lm_head.weight.dtype)).argmax(-1)  # [B-1]
        block_ids[0, 1:] = draft
        logits, taps = target.step(block_ids, _positions(start, block, device), cache)
        verified = logits[0].argmax(-1)  # [B]: target's token after each prefix of the block
        matches = (draft == verified[:-1]).to(torch.int64)
        accepted = int(matches.cumprod(0).sum())
        emitted = draft[:accepted].tolist() + [int(verified[accepted])]
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


@dataclass
class TauReport:
    tau: float
    tau_hist: list[int]
    prompts: int
    tokens: int
    rounds: int
    per_prompt: list[float]
    spec_seconds: float
    target_seconds: float | None
    lossless: bool | None

    @property
    def speedup(self) -> float | None:
        if not self.target_seconds or not self.spec_seconds:
            return None
        return self.target_seconds / self.spec_seconds


def measure_tau(
    target: Target,
    drafter: DFlashDrafter,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos_id: int | None,
    compare_with_target: bool = True,
) -> TauReport:
    """Mean tau over prompts (each prompt's mean over its rounds), its histogram, and, when
    compare_with_target, whether every output equals target-only greedy decoding and the speedup."""
    drafter.eval()
    per_prompt, hist, tokens, rounds = [], [0] * (drafter.block_size + 1), 0, 0
    spec_s, target_s, lossless = 0.0, 0.0, True
    for prompt in prompts:
        gen = speculative_greedy(target, drafter, prompt, max_new_tokens, eos_id)
        spec_s += gen.seconds
        tokens += len(gen.tokens)
        rounds += len(gen.acceptance)
        for a in gen.acceptance:
            hist[a] += 1
        if gen.acceptance:
            per_prompt.append(gen.tau)
        if compare_with_target:
            ref = target_greedy(target, prompt, max_new_tokens, eos_id)
            target_s += ref.seconds
            lossless = lossless and ref.tokens == gen.tokens
    tau = sum(per_prompt) / len(per_prompt) if per_prompt else 0.0
    return TauReport(
        tau=tau,
        tau_hist=hist,
        prompts=len(prompts),
        tokens=tokens,
        rounds=rounds,
        per_prompt=per_prompt,
        spec_seconds=spec_s,
        target_seconds=target_s if compare_with_target else None,
        lossless=lossless if compare_with_target else None,
    )
