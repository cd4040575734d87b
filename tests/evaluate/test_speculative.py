"""Speculative decoding is lossless: its output equals target-only greedy decoding token for token,
with an untrained drafter (everything rejected) and a trained one (multi-token acceptances)."""

import pytest
import torch

from blockdraft.evaluate.speculative import speculative_greedy
from blockdraft.train.loop import Trainer
from tests.evaluate.reference import greedy_reference


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(2, 200, (n,), generator=g).tolist() for n in (5, 9, 17)]


def test_untrained_drafter_output_equals_target_greedy(tiny_config, prompts):
    trainer = Trainer(tiny_config(train={"max_steps": 1}), show_console=False)
    for p in prompts:
        ref = greedy_reference(trainer.target, p, 24)
        spec = speculative_greedy(trainer.target, trainer.drafter, p, 24, eos_id=None)
        assert spec.tokens == ref
        assert all(1 <= a <= trainer.drafter.block_size for a in spec.acceptance)
    trainer.prefetcher.close()


class OracleDrafter(torch.nn.Module):
    """Drafts the target's true greedy continuation, wrong at one block position every other round:
    full, partial and zero acceptances, deterministically (hidden = the lm_head row of the wanted token)."""

    def __init__(self, real, lm_weight, sequence, wrong_at):
        super().__init__()
        self.real, self.w, self.seq, self.wrong_at = real, lm_weight, sequence, wrong_at
        self.layers = real.layers  # the decoder sizes its context cache from them
        self.block_size, self.mask_token_id, self.rounds = real.block_size, real.mask_token_id, 0

    def fuse(self, taps):
        return self.real.fuse(taps)

    def forward(self, block_embeds, block_positions, ctx, ctx_positions, mask=None, cache=None):
        start = int(block_positions[0, 0])
        wanted = [self.seq[p] if p < len(self.seq) else 0 for p in range(start, start + self.block_size)]
        if self.rounds % 2 == 1:
            k = self.wrong_at
            wanted[k] = (wanted[k] + 1) % self.w.shape[0]
        self.rounds += 1
        return (self.w[wanted] * 50.0)[None]


def test_accepted_blocks_keep_decoding_lossless(tiny_config, prompts):
    trainer = Trainer(tiny_config(train={"max_steps": 1}), show_console=False)
    target, w = trainer.target, trainer.target.lm_head.weight
    assert (torch.argmax(w @ w.T, dim=1) == torch.arange(w.shape[0])).all()  # the oracle's premise
    for p, wrong_at in zip(prompts, (1, 2, 3), strict=True):
        ref = greedy_reference(target, p, 30)
        oracle = OracleDrafter(trainer.drafter, w, p + ref, wrong_at)
        spec = speculative_greedy(target, oracle, p, 30, eos_id=None)
        assert spec.tokens == ref
        assert trainer.drafter.block_size in spec.acceptance  # all drafts accepted
        assert wrong_at in spec.acceptance  # stopped at the corrupted draft
    trainer.prefetcher.close()
