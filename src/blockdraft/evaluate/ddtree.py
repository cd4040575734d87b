"""DDTree: verify a tree of drafts instead of one path (DFLASH.md, "DDTree").

The drafter's one pass gives per-position distributions q_1..q_{B-1}. Treated as independent, the
expected accepted length of a tree is the sum over its nodes of their prefix probabilities, so the
best tree under a node budget is the set of the `budget` most probable prefixes: found best-first with
a max-heap over rank tuples. All nodes are verified in one target pass (ancestor-only mask, positions
start + depth); the walk follows the target's tokens; only the accepted path's KV is kept.
Every emitted token is the target's own choice at its true prefix, so decoding stays lossless.
A single path is the chain tree of the top-1 drafts, so one loop serves both modes.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from blockdraft.evaluate.sampling import next_tokens
from blockdraft.evaluate.speculative import Generation, _positions, _sync, draft_block
from blockdraft.model.drafter import DFlashDrafter
from blockdraft.model.target import Target


@dataclass
class DraftTree:
    """Nodes in pop order (a parent always precedes its children); the root (anchor) is implicit."""

    tokens: list[int]
    parents: list[int]  # index of the parent node, -1 for a child of the root
    depths: list[int]  # 1 for children of the root
    scores: list[float]  # log-probability of the node's prefix


def build_tree(logp: torch.Tensor, budget: int) -> DraftTree:
    """logp: [D, V] per-position log-probabilities. The `budget` most probable prefixes, prefix-closed.

    A node is a rank tuple (r_1..r_d): token of rank r_i at depth i. Popping a node pushes its next
    sibling and its top-1 child; both score no higher than it, so pops come in descending score."""
    depth_max = logp.shape[0]
    k = min(budget, logp.shape[1])
    top_lp, top_ids = logp.topk(k, dim=-1)
    top_lp, top_ids = top_lp.tolist(), top_ids.tolist()
    tree = DraftTree([], [], [], [])
    heap: list[tuple[float, tuple[int, ...], int]] = [(-top_lp[0][0], (0,), -1)]
    while heap and len(tree.tokens) < budget:
        neg, ranks, parent = heapq.heappop(heap)
        d, r = len(ranks), ranks[-1]
        index = len(tree.tokens)
        tree.tokens.append(top_ids[d - 1][r])
        tree.parents.append(parent)
        tree.depths.append(d)
        tree.scores.append(-neg)
        if r + 1 < k:
            sibling = -neg - top_lp[d - 1][r] + top_lp[d - 1][r + 1]
            heapq.heappush(heap, (-sibling, ranks[:-1] + (r + 1,), parent))
        if d < depth_max:
            heapq.heappush(heap, (neg - top_lp[d][0], ranks + (0,), index))
    return tree


def chain_tree(tokens: list[int]) -> DraftTree:
    """The single-path draft as a tree: each token the only child of the previous one."""
    n = len(tokens)
    return DraftTree(list(tokens), list(range(-1, n - 1)), list(range(1, n + 1)), [0.0] * n)


def tree_mask(parents: list[int], past: int, device: torch.device | None = None) -> torch.Tensor:
    """Bool [1, 1, K+1, past+K+1] over [past | root | nodes]: True where attention is allowed.
    Every row sees all past tokens, the root, itself and its ancestors, nothing else."""
    k = len(parents)
    own = torch.eye(k + 1, dtype=torch.bool)  # built on the CPU: K tiny row ops, one copy to the device
    for i, p in enumerate(parents):  # parents precede children: the parent's row is already complete
        own[i + 1] |= own[p + 1]
    full = torch.ones(k + 1, past + k + 1, dtype=torch.bool)
    full[:, past:] = own
    return full[None, None].to(device)


def keep_path(cache: DynamicCache, past: int, keep: torch.Tensor) -> None:
    """Drop every verified entry of the target's cache except those at `keep` (offsets after past)."""
    for layer in cache.layers:
        layer.keys = torch.cat([layer.keys[:, :, :past], layer.keys[:, :, past + keep]], dim=2)
        layer.values = torch.cat([layer.values[:, :, :past], layer.values[:, :, past + keep]], dim=2)


@torch.no_grad()
def tree_decode(
    target: Target,
    drafter: DFlashDrafter,
    prompt: list[int],
    max_new_tokens: int,
    eos_id: int | None,
    budget: int | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> Generation:
    """Speculative decoding verifying a DDTree of `budget` nodes (None: the single top-1 path).
    temperature 0: greedy; > 0: accept while the draft equals the target's sampled token."""
    device = target.embed_tokens.weight.device
    lm_head = target.lm_head
    _sync(device)
    t0 = time.perf_counter()

    cache = DynamicCache()
    logits, taps = target.step(torch.tensor([prompt], device=device), _positions(0, len(prompt), device), cache)
    anchor = int(next_tokens(logits[0, -1:], temperature, generator)[0])
    out, acceptance = [anchor], []
    new_ctx, new_ctx_start = taps, 0
    draft_cache: list[tuple[torch.Tensor, torch.Tensor]] = []
    start = len(prompt)
    while len(out) < max_new_tokens and anchor != eos_id:
        _, hidden = draft_block(drafter, target.embed_tokens, anchor, start, new_ctx, new_ctx_start, draft_cache)
        draft_logits = lm_head(hidden[0, 1:].to(lm_head.weight.dtype)).float()  # [B-1, V]
        if budget is None:
            tree = chain_tree(draft_logits.argmax(-1).tolist())
        else:
            tree = build_tree(draft_logits.log_softmax(-1), budget)
        ids = torch.tensor([[anchor, *tree.tokens]], device=device)
        positions = torch.tensor([[start] + [start + d for d in tree.depths]], device=device)
        slots = torch.cat([torch.arange(start, device=device), positions[0]])[None]  # absolute position of each
        mask = target.layer_masks(tree_mask(tree.parents, start, device), positions, slots)
        logits, taps = _verify(target, ids, positions, mask, cache)
        path, emitted = _walk(tree, logits[0], temperature, generator)
        keep = torch.tensor([0] + [n + 1 for n in path], device=device)
        keep_path(cache, start, keep)
        out.extend(emitted)
        acceptance.append(len(emitted))
        new_ctx, new_ctx_start = taps[:, keep], start
        start += len(emitted)
        anchor = emitted[-1]
        if eos_id is not None and eos_id in emitted:
            out = out[: len(out) - len(emitted) + emitted.index(eos_id) + 1]
            break
    _sync(device)
    return Generation(out[:max_new_tokens], acceptance, time.perf_counter() - t0)


def _verify(target: Target, ids, positions, mask, cache) -> tuple[torch.Tensor, torch.Tensor]:
    """One target pass over [anchor | tree nodes] with the tree mask (HF takes a 4D mask as is)."""
    with target._tapping(stop_early=False) as captured:
        out = target.model(
            input_ids=ids, position_ids=positions, attention_mask=mask, past_key_values=cache, use_cache=True
        )
    return out.logits, torch.cat(captured, dim=-1)


def _walk(
    tree: DraftTree, logits: torch.Tensor, temperature: float, generator: torch.Generator | None
) -> tuple[list[int], list[int]]:
    """From the root, follow the child whose token is the target's choice at the current node.
    Returns the accepted node indices and the emitted tokens (accepted drafts + the bonus)."""
    children: dict[int, dict[int, int]] = {}
    for i, (tok, p) in enumerate(zip(tree.tokens, tree.parents, strict=True)):
        children.setdefault(p, {})[tok] = i
    node, path, emitted = -1, [], []
    while True:
        tok = int(next_tokens(logits[node + 1 : node + 2], temperature, generator)[0])
        emitted.append(tok)
        nxt = children.get(node, {}).get(tok)
        if nxt is None:
            return path, emitted
        path.append(nxt)
        node = nxt
