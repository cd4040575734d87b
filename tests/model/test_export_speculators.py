"""`blockdraft export --format speculators`: speculators 0.9's DFlash config layout, our tensors."""

import json
import os
import stat

import pytest
from safetensors.torch import load_file
from transformers import Qwen3Config

from blockdraft.cli import main
from blockdraft.train.loop import Trainer

# top-level keys of the config.json speculators 0.9.0 writes for a DFlash drafter
# (DFlashDraftModel(...).save_pretrained, run once with the real library), less its auto_map and
# transformers_version: the auto_map names a config.py of speculators' own that we do not ship
SPECULATORS_KEYS = {
    "architectures", "aux_hidden_state_layer_ids", "block_size", "draft_vocab_size", "dtype", "mask_token_id",
    "sample_from_anchor", "sliding_window_non_causal", "speculators_config", "speculators_model_type",
    "speculators_version", "target_hidden_size", "tie_word_embeddings", "transformer_layer_config",
}


@pytest.fixture
def run(tiny_config):
    cfg = tiny_config(train={"max_steps": 1, "save_every": 100})
    trainer = Trainer(cfg, show_console=False)
    trainer.run()
    trainer.prefetcher.close()
    return cfg, trainer


def test_speculators_export_layout(run, tiny_target, tmp_path):
    cfg, trainer = run
    out, ref = tmp_path / "spec", tmp_path / "dflash"
    assert main(["export", str(cfg.train.out_dir), "--out", str(out), "--format", "speculators",
                 "--dtype", "float32"]) == 0
    assert main(["export", str(cfg.train.out_dir), "--out", str(ref), "--dtype", "float32"]) == 0
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    assert all(stat.S_IMODE(os.stat(out / f).st_mode) == 0o644 for f in os.listdir(out))

    c = json.loads((out / "config.json").read_text())
    assert set(c) == SPECULATORS_KEYS
    assert c["speculators_model_type"] == "dflash" and c["architectures"] == ["DFlashDraftModel"]
    assert c["sliding_window_non_causal"] is True and c["sample_from_anchor"] is False
    assert c["aux_hidden_state_layer_ids"] == [i + 1 for i in trainer.drafter.target_layer_ids]
    assert c["mask_token_id"] == trainer.drafter.mask_token_id
    assert c["block_size"] == cfg.drafter.block_size
    spec = c["speculators_config"]
    assert spec["algorithm"] == "dflash" and spec["default_proposal_method"] == "greedy"
    assert spec["proposal_methods"] == [{"proposal_type": "greedy", "speculative_tokens": cfg.drafter.block_size - 1,
                                         "verifier_accept_k": 1, "accept_tolerance": 0.0}]
    assert spec["verifier"] == {"name_or_path": str(tiny_target), "architectures": ["Qwen3ForCausalLM"]}

    layer = c["transformer_layer_config"]
    assert layer["model_type"] == "qwen3"
    parsed = Qwen3Config(**{k: v for k, v in layer.items() if k != "model_type"})
    assert parsed.num_hidden_layers == cfg.drafter.num_layers == len(parsed.layer_types)
    assert set(parsed.layer_types) == {"full_attention"}
    target = json.loads((tiny_target / "config.json").read_text())
    theta = (target.get("rope_parameters") or {}).get("rope_theta", target.get("rope_theta"))
    assert parsed.rope_parameters["rope_theta"] == layer["rope_theta"] == theta
    assert c["draft_vocab_size"] == parsed.vocab_size == target["vocab_size"]

    ours, dflash = load_file(out / "model.safetensors"), load_file(ref / "model.safetensors")
    assert set(ours) == set(dflash) and all(ours[k].equal(dflash[k]) for k in ours)
    assert not any("embed" in n or "lm_head" in n for n in ours)


def test_speculators_export_verifier_override(run, tmp_path, capsys):
    cfg, _ = run
    out = tmp_path / "spec"
    assert main(["export", str(cfg.train.out_dir), "--out", str(out), "--format", "speculators",
                 "--verifier", "example-org/not-cached-model"]) == 0
    c = json.loads((out / "config.json").read_text())
    # not in the local cache: the name is recorded, its architectures are unknown here
    assert c["speculators_config"]["verifier"] == {"name_or_path": "example-org/not-cached-model", "architectures": []}
    assert c["dtype"] == "bfloat16"
