"""One evaluation sweep: every prompt decoded by each mode (single path, tree budgets) and once by
the target alone, so tau, acceptance per position, tokens/s and speedup come from the same prompts.
With batch_size > 1 the greedy single path and its target-only baseline decode that many prompts at
once (evaluate/batched.py), so the speedup compares like with like; tree and sampled modes stay
one prompt at a time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from blockdraft.evaluate.batched import speculative_greedy_batch, target_greedy_batch
from blockdraft.evaluate.ddtree import tree_decode
from blockdraft.evaluate.sampling import target_sample
from blockdraft.evaluate.speculative import Generation, speculative_greedy
from blockdraft.model.drafter import DFlashDrafter
from blockdraft.model.target import Target


@dataclass
class ModeResult:
    mode: str  # "path" or "tree"
    budget: int | None
    tau: float
    tau_hist: list[int]
    per_prompt: list[float]
    accept_per_pos: list[float]  # share of rounds that accepted the draft at block position k = 1..B-1
    tokens: int
    rounds: int
    seconds: float
    tokens_per_s: float
    speedup: float | None
    lossless: bool | None  # greedy only: every output equals target-only decoding

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(
    gens: list[Generation], refs: list[Generation], block: int, budget: int | None, greedy: bool
) -> ModeResult:
    hist = [0] * (block + 1)
    for gen in gens:
        for a in gen.acceptance:
            hist[a] += 1
    rounds = sum(hist)
    per_prompt = [g.tau for g in gens if g.acceptance]
    tokens, seconds = sum(len(g.tokens) for g in gens), sum(g.seconds for g in gens)
    ref_tokens, ref_seconds = sum(len(r.tokens) for r in refs), sum(r.seconds for r in refs)
    speedup = None
    if tokens and seconds and ref_tokens and ref_seconds:
        speedup = (ref_seconds / ref_tokens) / (seconds / tokens)
    return ModeResult(
        mode="path" if budget is None else "tree",
        budget=budget,
        tau=sum(per_prompt) / len(per_prompt) if per_prompt else 0.0,
        tau_hist=hist,
        per_prompt=per_prompt,
        accept_per_pos=[sum(hist[k + 1 :]) / rounds if rounds else 0.0 for k in range(1, block)],
        tokens=tokens,
        rounds=rounds,
        seconds=seconds,
        tokens_per_s=tokens / seconds if seconds else 0.0,
        speedup=speedup,
        lossless=all(g.tokens == r.tokens for g, r in zip(gens, refs, strict=True)) if greedy else None,
    )


def evaluate(
    target: Target,
    drafter: DFlashDrafter,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos_id: int | None,
    budgets: list[int],
    temperature: float = 0.0,
    seed: int = 0,
    batch_size: int = 1,
    progress: Callable[[str, bool], None] | None = None,
) -> tuple[list[ModeResult], float]:
    """Results for the single path then each budget, and target-only tokens/s (batched as the path).
    `progress` gets (line, last of its mode) after the baseline and each prompt (or batch) of every mode."""
    drafter.eval()
    device = target.embed_tokens.weight.device
    greedy = temperature <= 0
    batched = greedy and batch_size > 1
    chunks = [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]
    gen = torch.Generator(device=device).manual_seed(seed)

    def one_at_a_time() -> list[Generation]:
        return [target_sample(target, p, max_new_tokens, eos_id, temperature, gen) for p in prompts]

    if batched:  # the path's baseline is batched like it; trees, decoded one at a time, keep their own
        refs = [g for chunk in chunks for g in target_greedy_batch(target, chunk, max_new_tokens, eos_id)]
        tree_refs = one_at_a_time() if budgets else refs
    else:
        refs = tree_refs = one_at_a_time()
    report = progress or (lambda _line, _final: None)
    report(f"target-only: {len(refs)} prompts, {sum(len(r.tokens) for r in refs)} tokens in "
           f"{sum(r.seconds for r in refs):.1f} s", True)
    results = []
    for budget in [None, *budgets]:
        name = "path" if budget is None else f"tree {budget}"
        if batched and budget is None:
            decode = [lambda c=c: speculative_greedy_batch(target, drafter, c, max_new_tokens, eos_id) for c in chunks]
        elif greedy and budget is None:  # the crop-based path decoder: cheaper than a chain tree
            decode = [lambda p=p: [speculative_greedy(target, drafter, p, max_new_tokens, eos_id)] for p in prompts]
        else:
            decode = [lambda p=p, b=budget: [tree_decode(target, drafter, p, max_new_tokens, eos_id, b,
                                                          temperature, gen)] for p in prompts]
        gens: list[Generation] = []
        for part in decode:
            gens += part()
            done = [g for g in gens if g.acceptance]
            report(f"{name}: {len(gens)}/{len(prompts)} prompts, tau so far "
                   f"{sum(g.tau for g in done) / max(1, len(done)):.2f}, {sum(g.seconds for g in gens):.1f} s",
                   len(gens) == len(prompts))
        results.append(summarize(gens, refs if budget is None else tree_refs, drafter.block_size, budget, greedy))
    ref_tokens, ref_seconds = sum(len(r.tokens) for r in refs), sum(r.seconds for r in refs)
    return results, ref_tokens / ref_seconds if ref_seconds else 0.0
