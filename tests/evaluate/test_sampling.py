"""Sampled speculative decoding keeps the target's distribution: chi-square of the second emitted
token (drawn at the tree's root row, after the drafter's tree was built and verified) against its
exact marginal under the target, sum_t1 p(t1) p(t2 | t1), with a fixed seed."""

import pytest
import torch

from blockdraft.evaluate.speculative import next_tokens
from tests.evaluate.reference import tree_decode

PROMPT = [5, 6, 7, 8, 9, 10]
TEMPERATURE = 0.6


@pytest.fixture
def one_thread():
    """Two threads on a loaded 2-core box make each tiny forward ~10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _exact_second_token(target) -> torch.Tensor:
    model = target.model
    with torch.no_grad():
        p1 = torch.softmax(model(input_ids=torch.tensor([PROMPT])).logits[0, -1] / TEMPERATURE, -1)
        vocab = p1.shape[0]
        ids = torch.cat([torch.tensor([PROMPT]).expand(vocab, -1), torch.arange(vocab)[:, None]], dim=1)
        p2 = torch.softmax(model(input_ids=ids).logits[:, -1] / TEMPERATURE, -1)
    return (p1[:, None] * p2).sum(0)


def _chi_square_p(counts: torch.Tensor, expected_p: torch.Tensor) -> float:
    """Bins with >= 5 expected draws, the rest lumped into one; p-value of Pearson's statistic."""
    n = counts.sum()
    expected = expected_p.double() * n
    big = expected >= 5
    obs = torch.cat([counts[big].double(), counts[~big].sum(0, keepdim=True).double()])
    exp = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    stat = ((obs - exp) ** 2 / exp).sum()
    return float(torch.special.gammaincc(torch.tensor((len(obs) - 1) / 2.0), stat / 2))


def test_sampled_tree_decoding_matches_target_distribution(tiny_pair, one_thread):
    target, drafter, _ = tiny_pair
    exact = _exact_second_token(target)
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros_like(exact, dtype=torch.long)
    accepted = 0
    for _ in range(300):
        gen = tree_decode(target, drafter, PROMPT, 3, None, budget=64, temperature=TEMPERATURE, generator=g)
        counts[gen.tokens[1]] += 1
        accepted += gen.acceptance[0] >= 2
    assert accepted > 0  # some second tokens came through an accepted draft
    assert _chi_square_p(counts, exact) > 1e-3
    # the test has power: the same draws are far from a wrong reference (greedy first token)
    with torch.no_grad():
        greedy_first = next_tokens(target.model(input_ids=torch.tensor([PROMPT])).logits[0, -1:], 0.0, None)
        ids = torch.tensor([[*PROMPT, int(greedy_first[0])]])
        wrong = torch.softmax(target.model(input_ids=ids).logits[0, -1] / TEMPERATURE, -1)
    assert _chi_square_p(counts, wrong) < 1e-3
