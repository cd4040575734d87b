"""bench/fused_mlp.py: its plain side is the model's own MLP, and without what it needs it stops with one line."""

import importlib.util
from pathlib import Path

import torch
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP

_spec = importlib.util.spec_from_file_location("fused_mlp", Path(__file__).parents[2] / "bench" / "fused_mlp.py")
fused_mlp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fused_mlp)


def test_the_plain_side_is_qwen3s_mlp():
    torch.manual_seed(0)
    mlp = Qwen3MLP(Qwen3Config(hidden_size=32, intermediate_size=48))
    x = torch.randn(5, 32)
    out = fused_mlp.swiglu_mlp(x, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
    torch.testing.assert_close(out, mlp(x))


def test_without_a_hopper_gpu_it_stops_with_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert fused_mlp.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Hopper" in err
