"""The target's RoPE reaches the exported drafter: the config read back carries the same parameters,
and the loaded drafter rotates by the same frequencies as the target (theta and scaling), for a plain
theta, a llama3-scaled Llama, and Gemma 3's full-attention RoPE. bench/pin_matrix.sh runs this file
under each transformers release the pin allows."""

import json

import pytest
import torch
from transformers import Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

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
