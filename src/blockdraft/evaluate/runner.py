"""One evaluation sweep: every prompt decoded by each mode (single path, tree budgets) and once by
the target alone, so tau, acceptance per position, tokens/s and speedup come from the same prompts
(batching and CUDA graphs: docs/evaluation.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from blockdraft.evaluate.ddtree import TreeDecoder
from blockdraft.evaluate.recurrent import RecurrentSpeculativeDecoder, RecurrentTargetDecoder
from blockdraft.evaluate.speculative import Generation, SpeculativeDecoder, TargetDecoder
from blockdraft.model.drafter import DFlashDrafter
from blockdraft.model.target import Target, require_decodable


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

    def eval_record(self, prompts: int, tau_est_train: float | None) -> dict[str, Any]:
        """This single-path or tree result as the fields of an `eval` record in log.jsonl: one definition for
        the trainer's evaluations and the demo's measurement of its export."""
        return {"tau": self.tau, "tau_hist": self.tau_hist, "prompts": prompts, "mode": self.mode,
                "budget": self.budget, "tokens": self.tokens, "speedup": self.speedup, "lossless": self.lossless,
                "tau_est_train": tau_est_train}


def tokens_per_s(gens: list[Generation]) -> float:
    seconds = sum(g.seconds for g in gens)
    return sum(len(g.tokens) for g in gens) / seconds if seconds else 0.0


def summarize(
    gens: list[Generation], refs: list[Generation], block: int, budget: int | None, greedy: bool
) -> ModeResult:
    counts = Counter(a for gen in gens for a in gen.acceptance)
    hist = [counts[a] for a in range(block + 1)]
    rounds = sum(hist)
    per_prompt = [g.tau for g in gens if g.acceptance]
    rate, ref_rate = tokens_per_s(gens), tokens_per_s(refs)
    return ModeResult(
        mode="path" if budget is None else "tree",
        budget=budget,
        tau=sum(per_prompt) / len(per_prompt) if per_prompt else 0.0,
        tau_hist=hist,
        per_prompt=per_prompt,
        accept_per_pos=[sum(hist[k + 1 :]) / rounds if rounds else 0.0 for k in range(1, block)],
        tokens=sum(len(g.tokens) for g in gens),
        rounds=rounds,
        seconds=sum(g.seconds for g in gens),
        tokens_per_s=rate,
        speedup=rate / ref_rate if rate and ref_rate else None,
        lossless=all(g.tokens == r.tokens for g, r in zip(gens, refs, strict=True)) if greedy else None,
    )


def decoding_setup(target: Target, batch_size: int, temperature: float, cuda_graphs: bool) -> tuple[int, bool]:
    """(prompts decoded at once, CUDA graphs on) on the single path, as `evaluate` decodes it and `eval`
    reports it: sampled decoding and recurrent targets take one prompt at a time, recurrent ones eagerly."""
    one_at_a_time = temperature > 0 or target.recurrent
    on_cuda = target.embed_tokens.weight.device.type == "cuda"
    return (1 if one_at_a_time else batch_size), cuda_graphs and on_cuda and not target.recurrent


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
    cuda_graphs: bool = True,
) -> tuple[list[ModeResult], float]:
    """Results for the single path then each budget, and target-only tokens/s (batched as the path).
    `progress` gets (line, last of its mode) after the baseline and each prompt (or batch) of every mode.
    With CUDA graphs each decoder first runs once untimed on the first prompts: capture is not measured.
    A target with recurrent layers decodes greedily on the single path alone (evaluate/recurrent.py)."""
    drafter.eval()
    device = target.embed_tokens.weight.device
    greedy = temperature <= 0
    batch, graphs = decoding_setup(target, batch_size, temperature, cuda_graphs)
    chunks = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
    singles = [[p] for p in prompts]
    longest = max(len(p) for p in prompts)
    gen = torch.Generator(device=device).manual_seed(seed)
    report = progress or (lambda _line, _final: None)

    def sweep(name: str, decode: Callable[[list[list[int]]], list[Generation]], parts=chunks) -> list[Generation]:
        if graphs:
            decode(parts[0])  # warm-up: captures the graphs, fills the allocator
        gens: list[Generation] = []
        for chunk in parts:
            gens += decode(chunk)
            done = [g for g in gens if g.acceptance]
            tau = f", tau so far {sum(g.tau for g in done) / len(done):.2f}" if done else ""
            report(f"{name}: {len(gens)}/{len(prompts)} prompts{tau}, {sum(g.seconds for g in gens):.1f} s",
                   len(gens) == len(prompts))
        return gens

    if target.recurrent:  # the greedy single path only, one prompt at a time, eagerly
        require_decodable(target.config.get_text_config(), "evaluation", tree=bool(budgets), sampled=not greedy)
        own = RecurrentTargetDecoder(target)
        refs = sweep("target-only", lambda c: own.decode(c, max_new_tokens, eos_id), singles)
        rolled = RecurrentSpeculativeDecoder(target, drafter, longest, max_new_tokens)
        gens = sweep("path", lambda c: rolled.decode(c, max_new_tokens, eos_id), singles)
        return [summarize(gens, refs, drafter.block_size, None, greedy)], tokens_per_s(refs)
    baseline = TargetDecoder(target, batch, longest, max_new_tokens, graphs)
    refs = sweep("target-only", lambda c: baseline.decode(c, max_new_tokens, eos_id, temperature, gen))
    tree_refs = refs
    if budgets and batch > 1:  # trees decode one prompt at a time: their baseline does too
        single = TargetDecoder(target, 1, longest, max_new_tokens, graphs)
        tree_refs = sweep("target-only, one at a time", lambda c: single.decode(c, max_new_tokens, eos_id), singles)
    results = []
    for budget in [None, *budgets]:
        if greedy and budget is None:
            path = SpeculativeDecoder(target, drafter, batch, longest, max_new_tokens, graphs)
            gens = sweep("path", lambda c, d=path: d.decode(c, max_new_tokens, eos_id))
        else:
            tree = TreeDecoder(target, drafter, budget, longest, max_new_tokens, graphs)
            gens = sweep("path" if budget is None else f"tree {budget}",
                         lambda c, d=tree: [d.decode(c[0], max_new_tokens, eos_id, temperature, gen)], singles)
        results.append(summarize(gens, refs if budget is None else tree_refs, drafter.block_size, budget, greedy))
    return results, tokens_per_s(refs)
