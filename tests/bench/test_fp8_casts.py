"""bench/fp8_casts.py: its variants compute what they stand for, so their times compare: merged projections
equal the separate ones, each FP8 scaling converts, and the draft-layer variant runs the drafter's layer."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location("fp8_casts", Path(__file__).parents[2] / "bench" / "fp8_casts.py")
fp8_casts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fp8_casts)


def test_merged_projections_compute_the_separate_ones(monkeypatch):
    for name, size in (("HIDDEN", 32), ("HEADS_DIM", 32), ("KV_DIM", 8), ("FFN", 48)):
        monkeypatch.setattr(fp8_casts, name, size)
    torch.manual_seed(0)
    separate, merged = fp8_casts.Projections(merged=False), fp8_casts.Projections(merged=True)
    with torch.no_grad():
        merged.qkv.weight.copy_(torch.cat([separate.q.weight, separate.k.weight, separate.v.weight]))
        merged.gate_up.weight.copy_(torch.cat([separate.gate.weight, separate.up.weight]))
        merged.o.weight.copy_(separate.o.weight)
        merged.down.weight.copy_(separate.down.weight)
    x = torch.randn(5, 32)
    out = separate(x)  # [5, 32]
    assert out.shape == (5, 32)
    torch.testing.assert_close(merged(x), out)
    assert sum(p.numel() for p in merged.parameters()) == sum(p.numel() for p in separate.parameters())


def test_each_fp8_scaling_converts_and_the_gw_hp_ones_keep_the_weight_gradient_in_high_precision():
    """Each scaling the bench compares is a torchao config the trainer's swap takes; the *_gw_hp ones
    leave the weight-gradient GEMM's operands uncast, so its result is the plain one of the FP8 output's
    gradient."""
    pytest.importorskip("torchao")
    from torchao.float8 import ScalingType

    from blockdraft.train.fp8 import to_fp8_linears

    for scaling in fp8_casts.SCALINGS:
        if scaling == "bf16":
            continue
        config = dataclasses.replace(fp8_casts.fp8_config(scaling), emulate=True)  # FP8 casts on the CPU
        gw_hp = config.cast_config_input_for_grad_weight.scaling_type is ScalingType.DISABLED
        assert gw_hp == scaling.endswith("_gw_hp")
        torch.manual_seed(0)
        layer = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False))
        assert to_fp8_linears(layer, config) == 1
        x = torch.randn(16, 64)
        out = layer(x)
        grad_out = torch.randn_like(out)
        out.backward(grad_out)
        plain_weight_grad = grad_out.T @ x  # [32, 64]
        error = (layer[0].weight.grad - plain_weight_grad).norm() / plain_weight_grad.norm()
        assert (error < 1e-6) == gw_hp, (scaling, error.item())


def test_the_draft_layer_variant_runs_the_drafters_layer_with_its_context_and_counts_its_linear_flops(monkeypatch):
    for name, size in (("HIDDEN", 32), ("HEADS_DIM", 32), ("KV_DIM", 16), ("FFN", 48), ("HEAD_DIM", 8)):
        monkeypatch.setattr(fp8_casts, name, size)
    torch.manual_seed(0)
    layer = fp8_casts.DraftLayerPass()
    x, ctx = torch.randn(1, 5, 32), torch.randn(1, 7, 32)
    out = layer(x, ctx)  # [1, 5, 32]
    assert out.shape == (1, 5, 32)
    assert not torch.equal(layer(x, ctx + 1), out)  # the queries attend to the context's K/V
    # q, o: 32 x 32; k, v: 16 x 32 on 5 query + 7 context rows; gate, up, down: 48 x 32
    assert fp8_casts.linear_flops(layer, rows=5, context=7) == 6 * (5 * (2 * 1024 + 3 * 1536) + 12 * 2 * 512)


def test_inductor_settings_are_checked_before_anything_compiles():
    assert fp8_casts.inductor_settings('{"triton.tile_reductions": true, "max_autotune": false}') == {
        "triton.tile_reductions": True, "max_autotune": False}
    assert fp8_casts.inductor_settings("{}") == {}
    with pytest.raises(ValueError, match="no setting 'triton.no_such_setting'"):
        fp8_casts.inductor_settings('{"triton.no_such_setting": 1}')
    with pytest.raises(ValueError, match="not a JSON object"):
        fp8_casts.inductor_settings("[1]")
    with pytest.raises(ValueError):
        fp8_casts.inductor_settings("{tile: 1}")
