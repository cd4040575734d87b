"""The target's RoPE reaches the exported drafter: the config read back carries the same parameters,
and the loaded drafter rotates by the same frequencies as the target (theta and scaling), for a plain
theta, a llama3-scaled Llama, and Gemma 3's full-attention RoPE; a target that rotates part of each
head gives a drafter that rotates whole heads, and says so. bench/pin_matrix.sh runs this file under
each transformers release the pin allows."""

import json

import pytest
import torch
from transformers import Gemma3TextConfig, GlmConfig, LlamaConfig, LlamaForCausalLM

from blockdraft.model.drafter import DFlashDrafter, drafter_config
from blockdraft.model.export import load_drafter, save_drafter

SHAPE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def _export(target_cfg, tmp_path):
    cfg = drafter_config(target_cfg, 1, 4, [0, 2], 3)
    save_drafter(DFlashDrafter(cfg).state_dict(), cfg, tmp_path, torch.float32)
    return json.loads((tmp_path / "config.json").read_text()), load_drafter(tmp_path)


@pytest.mark.parametrize("scaling", [None, LLAMA3], ids=["theta", "llama3"])
def test_llama_rope_survives_export(tmp_path, scaling):
    params = {"rope_type": "default", "rope_theta": 123456.0} if scaling is None else {**LLAMA3, "rope_theta": 5e5}
    target_cfg = LlamaConfig(**SHAPE, max_position_embeddings=512, rope_parameters=params)
    config, drafter = _export(target_cfg, tmp_path)
    assert config["rope_theta"] == params["rope_theta"]
    assert {k: config["rope_parameters"][k] for k in params} == params
    target = LlamaForCausalLM(target_cfg)
    torch.testing.assert_close(drafter.rotary_emb.inv_freq, target.model.rotary_emb.inv_freq, rtol=0, atol=0)


def test_gemma3_full_attention_rope_survives_export(tmp_path):
    target_cfg = Gemma3TextConfig(**SHAPE, layer_types=["sliding_attention", "full_attention"] * 2,
                                  sliding_window=8)
    full = target_cfg.rope_parameters["full_attention"]
    config, drafter = _export(target_cfg, tmp_path)
    assert config["rope_theta"] == full["rope_theta"]
    assert config["rope_parameters"]["rope_type"] == full["rope_type"]
    hd = SHAPE["head_dim"]
    expected = 1.0 / full["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    if full.get("rope_type") == "linear":
        expected = expected / full["factor"]
    torch.testing.assert_close(drafter.rotary_emb.inv_freq, expected)


@pytest.mark.parametrize("rope_type", ["default", "linear"])
def test_a_partially_rotated_target_gives_a_drafter_that_rotates_whole_heads(tmp_path, rope_type):
    """Phi-3/4 and GLM rotate a share of each head (partial_rotary_factor). The drafter's RoPE is its own
    and covers whole heads; its export carries no factor, so an engine that honours one (transformers'
    RoPE rules, vLLM's get_rope) rotates what was trained."""
    params = {"rope_type": rope_type, "rope_theta": 1e4, "partial_rotary_factor": 0.5}
    if rope_type == "linear":
        params["factor"] = 2.0
    target_cfg = GlmConfig(**SHAPE, max_position_embeddings=512, pad_token_id=0, rope_parameters=params)
    config, drafter = _export(target_cfg, tmp_path)
    assert "partial_rotary_factor" not in config["rope_parameters"]
    assert config["rope_parameters"]["rope_theta"] == 1e4 and config["rope_parameters"]["rope_type"] == rope_type
    hd = SHAPE["head_dim"]
    x = torch.zeros(1, 3, SHAPE["hidden_size"])
    cos, _ = drafter.rotary_emb(x, torch.arange(3)[None])
    assert cos.shape == (1, 3, hd)
    expected = 1.0 / 1e4 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd) / params.get("factor", 1.0)
    torch.testing.assert_close(drafter.rotary_emb.inv_freq, expected)
