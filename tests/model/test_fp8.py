"""FP8 target features (`target.fp8_until`): the training forward's matmuls are e4m3 products of per-row-scaled
operands, the taps stay close to the bf16 ones, exact again once switched off, and decoding never sees FP8."""

import pytest
import torch
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM

from blockdraft.errors import UserError
from blockdraft.model.fp8 import E4M3, FP8Linear, fp8_linears, quantize_rows
from blockdraft.model.target import Target

pytestmark = pytest.mark.skipif(not hasattr(torch, "_scaled_mm"), reason="torch without _scaled_mm")


def _target() -> Target:
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, intermediate_size=64)
    return Target(Qwen3ForCausalLM(cfg).eval().to(torch.bfloat16), [0, 2])


def test_quantized_rows_put_each_rows_largest_entry_at_the_formats_largest():
    x = torch.randn(5, 32) * torch.tensor([1e-3, 1.0, 10.0, 1e3, 0.0])[:, None]
    q, scale = quantize_rows(x)  # [5, 32], [5, 1]
    assert q.dtype == E4M3 and scale.shape == (5, 1)
    assert torch.equal(q[:4].float().abs().amax(dim=1), torch.full((4,), torch.finfo(E4M3).max))
    assert torch.all(q[4].float() == 0)  # a zero row stays zero (no 0/0)
    torch.testing.assert_close(q[:4].float() * scale[:4], x[:4], rtol=0.07, atol=0)  # e4m3: 3 mantissa bits


def test_an_fp8_linear_is_the_product_of_its_quantized_operands():
    torch.manual_seed(0)
    linear = nn.Linear(32, 48, bias=True).to(torch.bfloat16)
    x = torch.randn(3, 7, 32, dtype=torch.bfloat16)
    out = FP8Linear(linear)(x)  # [3, 7, 48]
    qx, sx = quantize_rows(x.reshape(-1, 32))
    qw, sw = quantize_rows(linear.weight)
    expect = ((qx.float() * sx) @ (qw.float() * sw).t()).to(torch.bfloat16) + linear.bias
    assert out.shape == (3, 7, 48) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.view(21, 48), expect, rtol=1e-2, atol=1e-2)
    exact = linear(x)
    assert (out - exact).norm() / exact.norm() < 0.06  # close to bf16, not equal to it


def test_fp8_features_stay_close_and_decoding_is_unchanged():
    target = _target()
    ids = torch.randint(0, 64, (2, 24))
    pos = torch.arange(24).expand(2, -1)
    taps_bf16, _ = target.features(ids)
    logits_before, _ = target.step(ids, pos, None, tap=False)
    target.enable_fp8_features()
    taps_fp8, _ = target.features(ids)
    logits_after, _ = target.step(ids, pos, None, tap=False)
    assert not torch.equal(taps_fp8, taps_bf16)  # the FP8 matmuls did run
    cos = nn.functional.cosine_similarity(taps_fp8.float(), taps_bf16.float(), dim=-1)  # [2, 24]
    assert cos.min() > 0.99
    assert torch.equal(logits_after, logits_before)  # decoding keeps the bf16 weights
    target.fp8_active = False  # the exact updates at the end of a run
    assert torch.equal(target.features(ids)[0], taps_bf16)
    assert all("forward" not in vars(m) for m in target.modules())  # nothing left swapped in


def test_a_layer_size_fp8_cannot_multiply_is_one_clear_error():
    with pytest.raises(UserError, match="divisible by 16"):
        fp8_linears([nn.Sequential(nn.Linear(32, 24))])
