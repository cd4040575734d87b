"""Drafter outputs depend on exactly what the DFlash visibility rule allows, and on nothing else; its RoPE
angles are transformers' own, formed without a float32 matmul."""

import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from blockdraft.evaluate.static import DraftSlots
from blockdraft.model.drafter import (
    DFlashDrafter,
    Float32RotaryEmbedding,
    compiled_flex_attention,
    drafter_config,
    flex_attention_fn,
)
from blockdraft.model.masks import dense_mask
from blockdraft.model.target import Target

B, T = 4, 24


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    tc = Qwen3Config(vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=16, intermediate_size=64)
    target = Target(Qwen3ForCausalLM(tc).eval(), [0, 2])
    drafter = DFlashDrafter(drafter_config(tc, 2, B, [0, 2], 63)).eval()
    return target, drafter


def block_outputs(target, drafter, ids, anchors):
    """ids: [1, T]; anchors: [A] positions of one sequence -> block outputs [A, B, H]."""
    taps, _ = target.features(ids)
    ctx = drafter.fuse(taps)
    a, t = anchors.shape[0], ids.shape[1]
    tokens = torch.full((a, B), 63)
    tokens[:, 0] = ids[0, anchors]
    pos = (anchors[:, None] + torch.arange(B)).view(1, -1)
    emb = target.embed_tokens(tokens.view(1, -1))
    mask = dense_mask(anchors, torch.zeros(a, dtype=torch.long), torch.zeros(t, dtype=torch.long), B)
    with torch.no_grad():
        out = drafter(emb, pos, ctx, torch.arange(t)[None], mask)
    return out.view(a, B, -1)


def test_block_ignores_context_at_or_after_its_anchor_and_other_blocks(models):
    target, drafter = models
    ids = torch.randint(0, 60, (1, T))
    anchors = torch.tensor([8, 14])
    base = block_outputs(target, drafter, ids, anchors)
    for pos in (9, 12, 20):  # at/after block 0's anchor (8) but not the anchor token itself
        changed = ids.clone()
        changed[0, pos] = (changed[0, pos] + 1) % 60
        out = block_outputs(target, drafter, changed, anchors)
        torch.testing.assert_close(out[0], base[0])


def test_block_sees_context_before_its_anchor(models):
    target, drafter = models
    ids = torch.randint(0, 60, (1, T))
    anchors = torch.tensor([8, 14])
    base = block_outputs(target, drafter, ids, anchors)
    changed = ids.clone()
    changed[0, 7] = (changed[0, 7] + 1) % 60
    out = block_outputs(target, drafter, changed, anchors)
    assert (out[0] - base[0]).abs().max() > 1e-4


def test_blocks_are_isolated_even_when_anchors_are_adjacent(models):
    target, drafter = models
    ids = torch.randint(0, 60, (1, T))
    alone = block_outputs(target, drafter, ids, torch.tensor([10]))
    together = block_outputs(target, drafter, ids, torch.tensor([10, 11]))
    torch.testing.assert_close(together[0], alone[0])


def test_packed_sequences_give_each_block_what_it_gets_alone(models):
    """Packing is invisible: a block's output does not depend on the sequences packed beside it."""
    target, drafter = models
    first, second = torch.randint(0, 60, (1, T)), torch.randint(0, 60, (1, 15))
    alone = block_outputs(target, drafter, second, torch.tensor([6]))[0]
    taps = torch.cat([target.features(first)[0], target.features(second)[0]], dim=1)  # [1, T + 15, N*H]
    doc = torch.tensor([0] * T + [1] * 15)
    anchors = torch.tensor([9, T + 6])  # packed indices: one block in each sequence
    tokens = torch.full((2, B), 63)
    tokens[:, 0] = torch.cat([first, second], dim=1)[0, anchors]
    pos = torch.tensor([[9, 10, 11, 12, 6, 7, 8, 9]])
    ctx_pos = torch.cat([torch.arange(T), torch.arange(15)])[None]
    with torch.no_grad():
        out = drafter(target.embed_tokens(tokens.view(1, -1)), pos, drafter.fuse(taps), ctx_pos,
                      dense_mask(anchors, torch.tensor([0, 1]), doc, B))
    torch.testing.assert_close(out.view(2, B, -1)[1], alone, atol=1e-5, rtol=1e-4)


def test_training_forward_equals_cached_decoding_forward(models):
    """Training/serving parity: the masked all-blocks pass equals the KV-cached decoding pass."""
    target, drafter = models
    ids = torch.randint(0, 60, (1, T))
    a = 13
    train = block_outputs(target, drafter, ids, torch.tensor([a]))[0]
    taps, _ = target.features(ids[:, :a])
    cache = DraftSlots(drafter, 1, a + 3, torch.device("cpu"))  # 3 slots never written: the mask hides them
    sees = torch.cat([torch.arange(a + 3) < a, torch.ones(B, dtype=torch.bool)])[None, None, None]
    tokens = torch.full((1, B), 63)
    tokens[0, 0] = ids[0, a]
    with torch.no_grad():
        # context arrives in two pieces, as in decoding rounds
        for piece in (slice(0, 5), slice(5, a)):
            cache.write_at = torch.arange(a)[piece]
            infer = drafter(target.embed_tokens(tokens), torch.arange(a, a + B)[None], drafter.fuse(taps[:, piece]),
                            torch.arange(a)[piece][None], sees, cache)
    torch.testing.assert_close(infer[0], train, atol=1e-5, rtol=1e-4)


def test_config_has_one_layer_type_per_drafter_layer():
    tc = Qwen3Config(num_hidden_layers=36, hidden_size=64, num_attention_heads=2, num_key_value_heads=1)
    cfg = drafter_config(tc, 5, 16, [1, 9, 17, 25, 33], 7)
    assert cfg.num_hidden_layers == 5 and len(cfg.layer_types) == 5
    assert cfg.num_target_layers == 36 and cfg.block_size == 16
    assert cfg.dflash_config == {"mask_token_id": 7, "target_layer_ids": [1, 9, 17, 25, 33],
                                 "input_embedding_scale": 1.0, "target_hidden_states": "decoder_layer_output"}


def test_flex_attention_fn_hands_a_compiling_caller_the_plain_op():
    """A compiled training pass on the GPU calls flex_attention_fn(True) inside the graph: it must hand
    dynamo the plain op, not the cached compiled wrapper that dynamo warns about on every run."""
    def pick(x: torch.Tensor) -> torch.Tensor:
        return x * 2 if flex_attention_fn(True) is flex_attention else x

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        doubled = torch.compile(pick, backend="eager", fullgraph=True)(torch.ones(2))
    assert torch.equal(doubled, torch.full((2,), 2.0))
    assert not [w for w in caught if "lru_cache" in str(w.message)]
    assert flex_attention_fn(True) is compiled_flex_attention() and flex_attention_fn(False) is flex_attention


MATMULS = {torch.ops.aten.mm, torch.ops.aten.bmm, torch.ops.aten.addmm, torch.ops.aten.baddbmm}


class MatmulDtypes(TorchDispatchMode):
    """Records the output dtype of each matmul a call runs."""

    def __init__(self) -> None:
        super().__init__()
        self.matmul_dtypes: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in MATMULS:
            self.matmul_dtypes.add(out.dtype)
        return out


def test_the_drafter_under_bf16_autocast_runs_no_float32_matmul(models):
    """What training runs: any float32 matmul left would be one `set_float32_matmul_precision('high')`
    could put through TF32 (and what TorchInductor's TF32 hint flags)."""
    target, drafter = models
    ids = torch.randint(0, 60, (1, T))
    anchors = torch.tensor([3, 8, 14])
    taps, _ = target.features(ids)  # the target's own RoPE is transformers' (docs/training.md)
    emb = target.embed_tokens(ids[:, anchors].repeat_interleave(B, dim=1))  # [1, A*B, H]
    pos = (anchors[:, None] + torch.arange(B)).view(1, -1)
    mask = dense_mask(anchors, torch.zeros(3, dtype=torch.long), torch.zeros(T, dtype=torch.long), B)
    with MatmulDtypes() as seen, torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        drafter(emb, pos, drafter.fuse(taps), torch.arange(T)[None], mask)
    assert seen.matmul_dtypes == {torch.bfloat16}


@pytest.mark.parametrize("rope", [
    {"rope_type": "default", "rope_theta": 1e6},
    {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
], ids=["theta", "llama3", "dynamic"])
def test_rotary_tables_are_transformers_own_formed_without_a_matmul(rope):
    """A float32 matmul may run in TF32 (`set_float32_matmul_precision('high')`), which rounds positions
    above 2,048: the drafter's angles come from a broadcast product, equal to transformers' to the bit."""
    cfg = Qwen3Config(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      max_position_embeddings=64, rope_parameters=rope)
    ours, theirs = Float32RotaryEmbedding(cfg), Qwen3RotaryEmbedding(cfg)
    x = torch.zeros(2, 1)  # float32 tables: no bf16 rounding to hide a difference
    positions = torch.stack([torch.arange(2040, 2060), torch.arange(4990, 5010)])  # [2, 20]
    with MatmulDtypes() as seen:
        cos, sin = ours(x, positions)
    assert not seen.matmul_dtypes
    cos_ref, sin_ref = theirs(x, positions)
    assert cos.shape == (2, 20, 16)
    torch.testing.assert_close(cos, cos_ref, rtol=0, atol=0)
    torch.testing.assert_close(sin, sin_ref, rtol=0, atol=0)
    with MatmulDtypes() as seen:
        theirs(x, positions)
    assert seen.matmul_dtypes  # what the test guards against is there to find
