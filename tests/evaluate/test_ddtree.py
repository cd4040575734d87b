"""DDTree: the tree is the K most probable prefixes (checked against brute force), its mask lets a
node see exactly its ancestors, and tree decoding equals target-only greedy decoding."""

import itertools

import pytest
import torch

from blockdraft.evaluate.ddtree import build_tree, chain_tree, tree_mask
from tests.evaluate.reference import greedy_reference, tree_decode


def _brute_force(logp: torch.Tensor, k: int) -> set[tuple[int, ...]]:
    depth, vocab = logp.shape
    scored = []
    for d in range(1, depth + 1):
        for toks in itertools.product(range(vocab), repeat=d):
            scored.append((sum(float(logp[i, t]) for i, t in enumerate(toks)), toks))
    scored.sort(reverse=True)
    return {toks for _, toks in scored[:k]}


def _prefixes(tree) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    for tok, parent in zip(tree.tokens, tree.parents, strict=True):
        out.append((out[parent] if parent >= 0 else ()) + (tok,))
    return out


@pytest.mark.parametrize("seed,depth,vocab,budget", [(0, 3, 4, 5), (1, 3, 5, 12), (2, 4, 3, 20), (3, 2, 6, 1)])
def test_tree_equals_brute_force_top_k_prefixes(seed, depth, vocab, budget):
    logp = torch.randn(depth, vocab, generator=torch.Generator().manual_seed(seed)).mul(2).log_softmax(-1)
    tree = build_tree(logp, budget)
    prefixes = _prefixes(tree)
    assert len(prefixes) == budget == len(set(prefixes))
    assert set(prefixes) == _brute_force(logp, budget)
    assert all(p[:-1] in set(prefixes) or len(p) == 1 for p in prefixes)  # prefix-closed
    assert tree.scores == sorted(tree.scores, reverse=True)  # best-first pops
    assert tree.depths == [len(p) for p in prefixes]


def test_budget_larger_than_all_prefixes_gives_the_whole_tree():
    logp = torch.randn(2, 2).log_softmax(-1)
    assert len(build_tree(logp, 100).tokens) == 2 + 4


def test_mask_sees_exactly_the_ancestors():
    parents = [-1, -1, 0, 2, 1]  # root -> {0, 1}; 0 -> 2 -> 3; 1 -> 4
    mask = tree_mask(parents)
    assert mask.shape == (6, 6)
    ancestors = {0: {0}, 1: {0, 1}, 2: {0, 2}, 3: {0, 1, 3}, 4: {0, 1, 3, 4}, 5: {0, 2, 5}}
    for row, seen in ancestors.items():
        assert set(torch.nonzero(mask[row])[:, 0].tolist()) == seen, row


def test_chain_tree_is_a_causal_mask():
    tree = chain_tree([5, 6, 7])
    assert torch.equal(tree_mask(tree.parents), torch.ones(4, 4, dtype=torch.bool).tril())


@pytest.mark.parametrize("budget", [None, 3, 24, "vocab"])
def test_tree_decoding_equals_target_greedy(tiny_pair, budget):
    target, drafter, tokenizer = tiny_pair
    if budget == "vocab":  # most tokens at depth 1: rounds accept drafts even untrained, exercising keep_path
        budget = len(tokenizer) + 8
    accepted = []
    g = torch.Generator().manual_seed(3)
    for n in (5, 11):
        prompt = torch.randint(2, 200, (n,), generator=g).tolist()
        ref = greedy_reference(target, prompt, 20)
        gen = tree_decode(target, drafter, prompt, 20, eos_id=None, budget=budget)
        assert gen.tokens == ref
        assert all(1 <= a <= drafter.block_size for a in gen.acceptance)
        accepted += gen.acceptance
    if budget and budget > len(tokenizer):
        assert max(accepted) >= 2, accepted
