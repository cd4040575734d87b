"""bench/fp8_casts.py: its merged projections compute what the separate ones do, so the variants compare."""

import importlib.util
from pathlib import Path

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

