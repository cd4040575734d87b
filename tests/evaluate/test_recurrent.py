"""Targets with recurrent layers decode on the model's own cache, saved before each verification and
put back when a draft is rejected: the output equals target-only greedy decoding token for token."""

import copy

import pytest
import torch
from transformers.cache_utils import DynamicCache

from blockdraft.evaluate.recurrent import RecurrentSpeculativeDecoder, RecurrentTargetDecoder, save_layers
from blockdraft.evaluate.runner import evaluate
from blockdraft.model.drafter import DFlashDrafter, drafter_config
from blockdraft.model.target import load_target
from tests.conftest import RECURRENT_ARCHITECTURES
from tests.evaluate.reference import greedy_reference


@pytest.fixture(scope="module", params=sorted(RECURRENT_ARCHITECTURES))
def recurrent_pair(request, tiny_target_of):
    """(target, untrained drafter) with block size 4, taps [0, 2], fp32 on CPU."""
    target, tokenizer, hf_cfg = load_target(tiny_target_of(request.param), [0, 2], torch.device("cpu"), "float32")
    assert target.recurrent
    torch.manual_seed(1)
    drafter = DFlashDrafter(drafter_config(hf_cfg, 1, 4, [0, 2], tokenizer.mask_token_id)).eval()
    return target, drafter


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(2, 200, (n,), generator=g).tolist() for n in (5, 9, 17)]


def test_target_only_decoding_on_the_models_own_cache_equals_the_uncached_reference(recurrent_pair, prompts):
    target, _ = recurrent_pair
    gens = RecurrentTargetDecoder(target).decode(prompts, 20, eos_id=None)
    assert [g.tokens for g in gens] == [greedy_reference(target, p, 20) for p in prompts]


def _layer_tensors(cache: DynamicCache) -> list[torch.Tensor]:
    """Every tensor the cache's layers hold, directly or in their dicts of states."""
    out = []
    for layer in cache.layers:
        for value in vars(layer).values():
            values = value.values() if isinstance(value, dict) else [value]
            out += [v for v in values if torch.is_tensor(v)]
    return out


def test_saved_layers_put_the_cache_back_after_a_verification(recurrent_pair):
    """Every state a 4-token verification changes (recurrent states written in place, keys appended)
    comes back; the next token's logits from the restored cache are those of a deep copy; the attention
    keys are shared, not copied."""
    target, _ = recurrent_pair
    cache = DynamicCache(config=target.config)
    target.step(torch.tensor([[5, 6, 7, 8, 9]]), torch.arange(5)[None], cache, tap=False)
    untouched, expected = copy.deepcopy(cache), [t.clone() for t in _layer_tensors(cache)]
    saved = save_layers(cache)
    assert all(a.keys is b.keys for a, b in zip(cache.layers, saved, strict=True) if hasattr(a, "keys"))

    target.step(torch.tensor([[11, 12, 13, 14]]), torch.arange(5, 9)[None], cache, tap=False)
    assert not all(torch.equal(a, b) for a, b in zip(_layer_tensors(cache), expected, strict=True))
    cache.layers[:] = saved
    assert all(torch.equal(a, b) for a, b in zip(_layer_tensors(cache), expected, strict=True))
    logits, _ = target.step(torch.tensor([[10]]), torch.tensor([[5]]), cache, tap=False)
    reference, _ = target.step(torch.tensor([[10]]), torch.tensor([[5]]), untouched, tap=False)
    assert torch.equal(logits, reference)


def test_an_untrained_drafter_decodes_losslessly(recurrent_pair, prompts):
    target, drafter = recurrent_pair
    decoder = RecurrentSpeculativeDecoder(target, drafter, max(map(len, prompts)), 20)
    for prompt, gen in zip(prompts, decoder.decode(prompts, 20, eos_id=None), strict=True):
        assert gen.tokens == greedy_reference(target, prompt, 20)
        assert all(1 <= a <= drafter.block_size for a in gen.acceptance)
        assert sum(gen.acceptance) >= len(gen.tokens) - 1  # every emitted token after the first came from a round


def test_a_rejected_draft_is_rolled_out_of_the_recurrent_state(recurrent_pair, prompts):
    """Drafts of the true continuation, wrong at one block position every other round: a full acceptance
    follows each partial one, and stays right only if the rejected drafts left no trace in the state."""
    target, drafter = recurrent_pair
    block, vocab = drafter.block_size, target.lm_head.weight.shape[0]
    for prompt, wrong_at in zip(prompts, range(block - 1), strict=False):
        reference = greedy_reference(target, prompt, 24)
        sequence = prompt + reference
        decoder = RecurrentSpeculativeDecoder(target, drafter, len(prompt), 24)
        rounds = []

        def oracle(anchor, block_pos, taps, ctx_pos, sequence=sequence, rounds=rounds, wrong_at=wrong_at):
            start = int(block_pos[0, 0])
            wanted = [sequence[p] if p < len(sequence) else 0 for p in range(start + 1, start + block)]
            if len(rounds) % 2:
                wanted[wrong_at] = (wanted[wrong_at] + 1) % vocab
            rounds.append(start)
            return torch.tensor([wanted])

        decoder.draft = oracle
        gen = decoder.decode([prompt], 24, eos_id=None)[0]
        assert gen.tokens == reference
        assert gen.acceptance[:4] == [block, wrong_at + 1, block, wrong_at + 1]


def test_the_sweep_reports_the_single_path_and_refuses_trees_in_one_line(recurrent_pair, prompts):
    from blockdraft.errors import UserError

    target, drafter = recurrent_pair
    (path,), target_rate = evaluate(target, drafter, prompts, 12, eos_id=None, budgets=[], batch_size=2)
    assert path.mode == "path" and path.lossless is True and path.tau >= 1 and target_rate > 0
    assert path.tokens == 12 * len(prompts)
    with pytest.raises(UserError, match="decodes greedily on the single path only, without DDTree"):
        evaluate(target, drafter, prompts, 12, eos_id=None, budgets=[4])
