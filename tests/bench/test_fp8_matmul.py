"""bench/fp8_matmul.py: its FP8 linear is the product of per-row-scaled e4m3 operands, close to bf16."""

import importlib.util
from pathlib import Path

import pytest
import torch
from torch import nn

pytestmark = pytest.mark.skipif(not hasattr(torch, "_scaled_mm"), reason="torch without _scaled_mm")

_spec = importlib.util.spec_from_file_location("fp8_matmul", Path(__file__).parents[2] / "bench" / "fp8_matmul.py")
fp8_matmul = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fp8_matmul)


def test_quantized_rows_put_each_rows_largest_entry_at_the_formats_largest():
    x = torch.randn(5, 32) * torch.tensor([1e-3, 1.0, 10.0, 1e3, 0.0])[:, None]
    q, scale = fp8_matmul.quantize_rows(x)  # [5, 32], [5, 1]
    assert q.dtype == fp8_matmul.E4M3 and scale.shape == (5, 1)
    assert torch.equal(q[:4].float().abs().amax(dim=1), torch.full((4,), fp8_matmul.E4M3_MAX))
    assert torch.all(q[4].float() == 0)  # a zero row stays zero (no 0/0)
    torch.testing.assert_close(q[:4].float() * scale[:4], x[:4], rtol=0.07, atol=0)  # e4m3: 3 mantissa bits


def test_an_fp8_linear_is_the_product_of_its_quantized_operands():
    torch.manual_seed(0)
    linear = nn.Linear(32, 48, bias=True).to(torch.bfloat16)
    x = torch.randn(3, 7, 32, dtype=torch.bfloat16)
    out = fp8_matmul.FP8Linear(linear)(x)  # [3, 7, 48]
    qx, sx = fp8_matmul.quantize_rows(x.reshape(-1, 32))
    qw, sw = fp8_matmul.quantize_rows(linear.weight)
    expect = ((qx.float() * sx) @ (qw.float() * sw).t()).to(torch.bfloat16) + linear.bias
    assert out.shape == (3, 7, 48) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.view(21, 48), expect, rtol=1e-2, atol=1e-2)
    exact = linear(x)
    assert (out - exact).norm() / exact.norm() < 0.06  # close to bf16, not equal to it
