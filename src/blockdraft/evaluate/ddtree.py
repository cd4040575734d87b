"""DDTree: verify a tree of drafts instead of one path (DFLASH.md, "DDTree").

The drafter's one pass gives per-position distributions q_1..q_{B-1}. Treated as independent, the
expected accepted length of a tree is the sum over its nodes of their prefix probabilities, so the
best tree under a node budget is the set of the `budget` most probable prefixes: found best-first with
a max-heap over rank tuples. All nodes are verified in one target pass (ancestor-only mask, positions
start + depth); the walk follows the target's tokens; only the accepted path's KV is kept.
Sampled, the target draws its token at every node at once (one host sync): each draw is still one
sample of the target's distribution at that node's prefix, and only the walked nodes' draws are used.
Every emitted token is the target's own choice at its true prefix, so decoding stays lossless.
A single path is the chain tree of the top-1 drafts, so one loop serves both modes.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

from blockdraft.evaluate.speculative import Decoder, Generation, next_tokens, trim_to_eos
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


def tree_mask(parents: list[int]) -> torch.Tensor:
    """Bool [K+1, K+1] over [root | nodes]: True where a node may attend (itself and its ancestors).
    Built on the CPU: K tiny row ops, one copy to the device."""
    k = len(parents)
    own = torch.eye(k + 1, dtype=torch.bool)
    for i, p in enumerate(parents):  # parents precede children: the parent's row is already complete
        own[i + 1] |= own[p + 1]
    return own


class TreeDecoder(Decoder):
    """Speculative decoding of one prompt verifying a DDTree of `budget` nodes (None: the single
    top-1 path, as the sampled path runs). Slot s holds position s; the verified tree is written
    after the committed tokens and only the accepted path is moved into place."""

    def __init__(self, target: Target, drafter: DFlashDrafter, budget: int | None, max_prompt: int,
                 max_new_tokens: int, cuda_graphs: bool = False) -> None:
        block = drafter.block_size
        nodes = budget if budget is not None else block - 1
        super().__init__(target, drafter, 1, max_prompt + max_new_tokens + nodes + 2 * block, cuda_graphs)
        self.budget = budget

    def _verify(self, ids: torch.Tensor, positions: torch.Tensor, write_at: torch.Tensor, own: torch.Tensor):
        """[anchor | nodes] written at `write_at`, each seeing the committed slots and its ancestors."""
        layout, target = self.layout, self.target
        layout.cache.write_at = write_at
        visible = (layout.slot_index < write_at[0]).expand(own.shape[0], -1).clone()  # [K+1, S]
        visible.index_copy_(1, write_at, own)
        mask = target.layer_masks(visible[None, None], positions, layout.slot_index[None])
        return target.step(ids, positions, layout.cache, mask)

    @torch.no_grad()
    def decode(self, prompt: list[int], max_new_tokens: int, eos_id: int | None, temperature: float = 0.0,
               generator: torch.Generator | None = None) -> Generation:
        """temperature 0: greedy; > 0: accept while the draft equals the target's sampled token."""
        target, layout, device = self.target, self.layout, self.device
        block = self.drafter.block_size
        offsets = torch.arange(block, device=device)
        t0 = self.clock()

        logits, taps, ctx_pos, _ = layout.prefill(target, [prompt], tap=True)
        layout.valid.fill_(True)  # one row, no padding: slot < position limit is the whole mask
        anchor = int(next_tokens(logits, temperature, generator)[0])
        out, acceptance = [anchor], []
        ctx_at, first = layout.slot_index[: len(prompt)], True
        start = len(prompt)  # position (and slot) of the anchor; layout.length follows it
        while len(out) < max_new_tokens and anchor != eos_id:
            anchors, block_pos = torch.tensor([anchor], device=device), (offsets + start)[None]
            draft_logits = self.draft_logits(anchors, block_pos, taps, ctx_pos, ctx_at, first)[0].float()  # [B-1, V]
            if self.budget is None:
                tree = chain_tree(draft_logits.argmax(-1).tolist())
            else:
                tree = build_tree(draft_logits.log_softmax(-1), self.budget)
            ids = torch.tensor([[anchor, *tree.tokens]], device=device)
            positions = torch.tensor([[start] + [start + d for d in tree.depths]], device=device)
            write_at = layout.slot_index[start : start + len(tree.tokens) + 1]
            own = tree_mask(tree.parents).to(device)
            logits, taps = self.graphs("tree", self._verify, ids=ids, positions=positions, write_at=write_at, own=own)
            choices = next_tokens(logits[0], temperature, generator).tolist()  # the target's token at every node
            path, emitted = _walk(tree, choices)
            keep = [0] + [node + 1 for node in path]  # offsets of the anchor and the accepted nodes
            src = torch.tensor(keep + [keep[-1]] * (block - len(keep)), device=device)
            ctx_at = offsets + start
            layout.cache.move(src + start, ctx_at)
            taps, ctx_pos, first = taps[:, src], ctx_at[None], False
            out.extend(emitted)
            acceptance.append(len(emitted))
            start += len(emitted)
            layout.length = start
            anchor = emitted[-1]
            if eos_id in emitted:
                break
        return Generation(trim_to_eos(out, max_new_tokens, eos_id), acceptance, self.clock() - t0)


def _walk(tree: DraftTree, choices: list[int]) -> tuple[list[int], list[int]]:
    """From the root, follow the child whose token is the target's choice at the current node
    (`choices[k]`: its token after node k-1, the root first). Returns the accepted node indices and
    the emitted tokens (accepted drafts + the bonus)."""
    children: dict[int, dict[int, int]] = {}
    for i, (tok, p) in enumerate(zip(tree.tokens, tree.parents, strict=True)):
        children.setdefault(p, {})[tok] = i
    node, path, emitted = -1, [], []
    while True:
        tok = choices[node + 1]
        emitted.append(tok)
        nxt = children.get(node, {}).get(tok)
        if nxt is None:
            return path, emitted
        path.append(nxt)
        node = nxt
