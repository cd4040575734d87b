"""Model FLOPs count real lengths only, scale linearly in the drafter's work, and count what a target's
layers compute: the experts a token is routed to (not all of them), dense layers of a mixture-of-experts
target as dense, and a sliding-window layer's window (not the whole prefix)."""

import pytest
from transformers import (
    Gemma2Config,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    Qwen2MoeConfig,
    Qwen3Config,
    Qwen3MoeConfig,
)

from blockdraft.model.drafter import drafter_config
from blockdraft.model.flops import Dims, DraftWork, drafter_flops, target_flops

SHAPE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=100)
ATTENTION = 2 * 64 * 4 * 16 + 2 * 64 * 2 * 16  # q and o, k and v: weights of one layer's projections
WIDTH = 4 * 16  # heads x head_dim


def layer_by_hand(n: int, mlp_weights: int, pairs: int) -> int:
    """One layer's forward over n tokens: 2 FLOPs per weight per token, 2 x WIDTH for q.k and again for
    the weighted sum of v, per query-key pair."""
    return 2 * n * (ATTENTION + mlp_weights) + 4 * WIDTH * pairs


def test_flops_follow_real_lengths():
    dims = Dims(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128)
    # a padded sequence costs nothing extra: only real lengths enter
    assert target_flops([100, 20], dims, 3) == target_flops([100], dims, 3) + target_flops([20], dims, 3)
    one = drafter_flops(DraftWork(100, 10, 500.0, 150), dims, layers=2, taps=3, block_size=16, vocab=1000)
    two = drafter_flops(DraftWork(200, 20, 1000.0, 300), dims, layers=2, taps=3, block_size=16, vocab=1000)
    assert two == pytest.approx(2 * one)


@pytest.mark.parametrize("config", [Qwen3Config, LlamaConfig])
def test_a_dense_target_counts_as_it_always_did(config):
    cfg = config(**SHAPE, intermediate_size=128, num_hidden_layers=5)
    dims = Dims.of(cfg)
    assert dims == Dims(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128)  # the drafter's too
    assert dims.layer_params == ATTENTION + 3 * 64 * 128
    # the formula before per-layer counting: (2 x layer weights x n + 2 x WIDTH x n(n+1)) x layers
    before = sum(2 * (ATTENTION + 3 * 64 * 128) * n + 2 * WIDTH * n * (n + 1) for n in (100, 37)) * 4
    assert target_flops([100, 37], dims, 4) == float(before)


def test_mixtral_runs_experts_per_tok_experts_of_each_token():
    shape = dict(SHAPE, intermediate_size=96, num_hidden_layers=3, sliding_window=None)
    moe = Dims.of(MixtralConfig(**shape, num_local_experts=8, num_experts_per_tok=2))
    dense = Dims.of(MistralConfig(**shape))
    n = 50
    # per token and layer: 2 experts of the dense MLP's weights, and the router (hidden x experts)
    assert target_flops([n], moe, 3) == target_flops([n], dense, 3) + 3 * 2 * n * (3 * 64 * 96 + 64 * 8)
    assert target_flops([n], moe, 3) == 3 * layer_by_hand(n, 2 * 3 * 64 * 96 + 64 * 8, n * (n + 1) // 2)


def test_qwen3_moe_counts_its_mlp_only_layers_dense():
    cfg = Qwen3MoeConfig(**SHAPE, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
                         num_experts_per_tok=2, num_hidden_layers=4, mlp_only_layers=[1])
    dims, n = Dims.of(cfg), 30
    sparse, dense, pairs = 3 * 64 * 2 * 32 + 64 * 8, 3 * 64 * 128, n * (n + 1) // 2
    # the layers run matter: layer 1 is dense, 0, 2 and 3 are sparse
    assert target_flops([n], dims, 1) == layer_by_hand(n, sparse, pairs)
    assert target_flops([n], dims, 2) == layer_by_hand(n, sparse, pairs) + layer_by_hand(n, dense, pairs)
    assert target_flops([n], dims, 4) == 3 * layer_by_hand(n, sparse, pairs) + layer_by_hand(n, dense, pairs)
    # decoder_sparse_step=2: layers 1 and 3 are sparse, 0 and 2 dense
    every_other = Dims.of(Qwen3MoeConfig(**SHAPE, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
                                         num_experts_per_tok=2, num_hidden_layers=4, decoder_sparse_step=2))
    assert target_flops([n], every_other, 1) == layer_by_hand(n, dense, pairs)
    assert target_flops([n], every_other, 4) == 2 * layer_by_hand(n, sparse, pairs) + 2 * layer_by_hand(n, dense, pairs)


def test_qwen2_moe_counts_its_shared_expert():
    cfg = Qwen2MoeConfig(**SHAPE, intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                         num_experts=8, num_experts_per_tok=2, num_hidden_layers=2)
    n = 40
    # 2 routed experts of width 32, the shared expert of width 48, the router over 8 experts
    mlp = 3 * 64 * (2 * 32 + 48) + 64 * 8
    assert target_flops([n], Dims.of(cfg), 2) == 2 * layer_by_hand(n, mlp, n * (n + 1) // 2)


def test_sliding_window_layers_attend_to_the_window_only():
    shape = dict(SHAPE, intermediate_size=128, num_hidden_layers=4, sliding_window=8)
    gemma = Dims.of(Gemma2Config(**shape))  # layers 0 and 2 slide, 1 and 3 attend in full
    full = Dims.of(Gemma2Config(**dict(shape, layer_types=["full_attention"] * 4)))
    short, long = 8, 20
    assert target_flops([short], gemma, 4) == target_flops([short], full, 4)  # no query reaches past the window
    # over 20 tokens a full layer computes 20 x 21 / 2 = 210 pairs, a sliding one 8 x 9 / 2 + 12 x 8 = 132
    assert target_flops([long], full, 4) - target_flops([long], gemma, 4) == 2 * 4 * WIDTH * (210 - 132)
    assert target_flops([long], gemma, 3) == 2 * layer_by_hand(long, 3 * 64 * 128, 132) + layer_by_hand(
        long, 3 * 64 * 128, 210)
    # Mistral has no layer_types: with sliding_window set, every layer slides
    mistral = dict(SHAPE, intermediate_size=128, num_hidden_layers=2)
    windowed = Dims.of(MistralConfig(**mistral, sliding_window=8))
    unwindowed = Dims.of(MistralConfig(**mistral, sliding_window=None))
    assert target_flops([short], windowed, 2) == target_flops([short], unwindowed, 2)
    assert target_flops([long], windowed, 2) == 2 * layer_by_hand(long, 3 * 64 * 128, 132)


def test_the_drafter_of_a_moe_target_is_counted_dense():
    """bench counts the drafter from its config, the batch plan from the target's dims: both dense."""
    cfg = Qwen3MoeConfig(**SHAPE, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
                         num_experts_per_tok=2, num_hidden_layers=4, max_position_embeddings=256)
    drafter = Dims.of(drafter_config(cfg, num_layers=2, block_size=8, target_layer_ids=[1, 3], mask_token_id=5))
    assert drafter == Dims(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128)
