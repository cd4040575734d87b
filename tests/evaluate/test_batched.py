"""Batched speculative decoding stays lossless with ragged acceptance: every prompt's output equals
target-only greedy decoding and the batch-size-1 decoder's output (acceptances included), whether
the rows accept nothing, different amounts in the same round, or stop early at EOS."""

import pytest
import torch

from blockdraft.evaluate.runner import evaluate
from blockdraft.evaluate.speculative import SpeculativeDecoder, TargetDecoder, speculative_greedy
from tests.evaluate.reference import greedy_reference

LENGTHS = (5, 9, 17, 3, 12)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(2, 200, (n,), generator=g).tolist() for n in LENGTHS]


class RowOracle(torch.nn.Module):
    """Drafts each row's true greedy continuation (the row found by its anchor token at its position),
    wrong at block position `wrong_at` when the anchor's position is odd: rows accept different amounts
    in the same round. hidden = 50 x the lm_head row of the wanted token."""

    def __init__(self, real, lm_weight, embed_weight, sequences, wrong_at):
        super().__init__()
        self.real, self.w, self.e, self.seqs, self.wrong_at = real, lm_weight, embed_weight, sequences, wrong_at
        self.block_size, self.mask_token_id = real.block_size, real.mask_token_id
        self.layers = real.layers  # the decoder sizes its context cache from them

    def fuse(self, taps):
        return self.real.fuse(taps)

    def forward(self, block_embeds, block_positions, ctx, ctx_positions, mask=None, cache=None):
        rows = []
        for emb, pos in zip(block_embeds[:, 0], block_positions[:, 0].tolist(), strict=True):
            anchor = int((self.e == emb).all(-1).nonzero()[0])
            seq = next((s for s in self.seqs if pos < len(s) and s[pos] == anchor), [])  # [] for a finished row
            wanted = [seq[p] if p < len(seq) else 0 for p in range(pos, pos + self.block_size)]
            if pos % 2:
                wanted[self.wrong_at] = (wanted[self.wrong_at] + 1) % self.w.shape[0]
            rows.append(self.w[wanted] * 50.0)
        return torch.stack(rows)


def _oracle(tiny_pair, prompts, max_new, wrong_at=2):
    target, drafter, _ = tiny_pair
    refs = [greedy_reference(target, p, max_new) for p in prompts]
    w = target.lm_head.weight
    assert (torch.argmax(w @ w.T, dim=1) == torch.arange(w.shape[0])).all()  # the oracle's premise
    seqs = [p + r for p, r in zip(prompts, refs, strict=True)]
    return RowOracle(drafter, w, target.embed_tokens.weight, seqs, wrong_at)


def _batch(target, drafter, prompts, max_new, eos):
    decoder = SpeculativeDecoder(target, drafter, len(prompts), max(map(len, prompts)), max_new)
    return decoder.decode(prompts, max_new, eos)


def test_one_decoder_serves_many_batches_and_a_short_last_one(tiny_pair, prompts):
    """The state is allocated once: later and shorter batches (padded rows) decode as a fresh one."""
    target, drafter, _ = tiny_pair
    oracle = _oracle(tiny_pair, prompts, 16)
    decoder = SpeculativeDecoder(target, oracle, 3, max(map(len, prompts)), 16)
    first, second = decoder.decode(prompts[:3], 16, None), decoder.decode(prompts[3:], 16, None)
    assert len(second) == 2
    for p, gen in zip(prompts, first + second, strict=True):
        assert gen.tokens == greedy_reference(target, p, 16)
        assert gen.acceptance == speculative_greedy(target, oracle, p, 16, None).acceptance
    baseline = TargetDecoder(target, 3, max(map(len, prompts)), 16)
    outs = baseline.decode(prompts[:3], 16, None) + baseline.decode(prompts[3:], 16, None)
    assert [g.tokens for g in outs] == [greedy_reference(target, p, 16) for p in prompts]


def test_untrained_drafter_batch_equals_target_greedy(tiny_pair, prompts):
    target, drafter, _ = tiny_pair
    gens = _batch(target, drafter, prompts, 20, None)
    for p, gen in zip(prompts, gens, strict=True):
        assert gen.tokens == greedy_reference(target, p, 20)
        assert gen.acceptance == speculative_greedy(target, drafter, p, 20, None).acceptance


def test_ragged_acceptance_in_one_round_stays_lossless(tiny_pair, prompts):
    target, _, _ = tiny_pair
    oracle = _oracle(tiny_pair, prompts, 30)
    gens = _batch(target, oracle, prompts, 30, None)
    for p, gen in zip(prompts, gens, strict=True):
        assert gen.tokens == greedy_reference(target, p, 30)
        assert gen.acceptance == speculative_greedy(target, oracle, p, 30, None).acceptance
    first_rounds = {g.acceptance[0] for g in gens}
    assert oracle.block_size in first_rounds and 2 in first_rounds  # full and partial in the same round


def test_rows_stopping_at_eos_end_there(tiny_pair, prompts):
    target, _, _ = tiny_pair
    oracle = _oracle(tiny_pair, prompts, 24)
    eos = greedy_reference(target, prompts[1], 24)[6]  # row 1 stops early; others may too
    refs = [greedy_reference(target, p, 24, eos) for p in prompts]
    assert len(refs[1]) <= 7 and max(map(len, refs)) == 24
    assert [g.tokens for g in _batch(target, oracle, prompts, 24, eos)] == refs
    assert [g.tokens for g in TargetDecoder(target, 5, 17, 24).decode(prompts, 24, eos)] == refs


def test_runner_batches_give_the_batch_size_1_results(tiny_pair, prompts):
    target, _, _ = tiny_pair
    oracle = _oracle(tiny_pair, prompts, 12)
    one, _ = evaluate(target, oracle, prompts, 12, None, budgets=[3])
    three, _ = evaluate(target, oracle, prompts, 12, None, budgets=[3], batch_size=3)  # rows of both parities
    for a, b in zip(one, three, strict=True):  # the path, then the tree (never batched)
        assert a.lossless is True and b.lossless is True
        assert (b.mode, b.tau, b.tau_hist, b.per_prompt, b.tokens) == (a.mode, a.tau, a.tau_hist, a.per_prompt,
                                                                       a.tokens)
    assert three[0].tau > 1.5


def test_compacting_the_slots_keeps_decoding_lossless(tiny_pair, prompts):
    """No headroom: the rows' holes are compacted away whenever the slots run out (twice here); the
    outputs, and the acceptances of the batch-size-1 decoder, stay the same."""
    target, _, _ = tiny_pair
    oracle = _oracle(tiny_pair, prompts, 30)
    decoder = SpeculativeDecoder(target, oracle, len(prompts), max(map(len, prompts)), 30, headroom_rounds=0)
    compactions = []
    compact = decoder.layout.compact
    decoder.layout.compact = lambda: (compactions.append(decoder.layout.length), compact())
    gens = decoder.decode(prompts, 30, None)
    assert len(compactions) >= 2
    for p, gen in zip(prompts, gens, strict=True):
        assert gen.tokens == greedy_reference(target, p, 30)
        assert gen.acceptance == speculative_greedy(target, oracle, p, 30, None).acceptance
