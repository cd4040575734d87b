"""The bench's models are built as training builds them: the drafter's mask token is the one that
training resolves for the same target folder."""

import pytest
import torch

from blockdraft.bench.measure import build_models
from blockdraft.bench.shapes import target_config, target_tokenizer
from blockdraft.config import build_config

CFG = build_config({"target": {"path": "<bench>"}, "drafter": {"num_layers": 1, "target_layer_ids": [0, 2]},
                    "train": {"device": "cpu"}}, [])


@pytest.mark.parametrize("folder, mask", [("tiny_target", "<|MASK|>"), ("tiny_llama_target", "<spare>")])
def test_a_target_folder_gives_the_bench_drafter_the_mask_token_training_picks(folder, mask, request):
    path = str(request.getfixturevalue(folder))
    tokenizer = target_tokenizer(path)
    hf_cfg = target_config(None, path)
    _, drafter = build_models(CFG, hf_cfg, torch.device("cpu"), tokenizer)
    assert tokenizer.convert_ids_to_tokens(drafter.mask_token_id) == mask
    assert drafter.mask_token_id != hf_cfg.vocab_size - 1  # not just the last row


def test_a_named_shape_or_a_config_alone_has_no_tokenizer_and_masks_with_the_last_row(tmp_path):
    hf_cfg = target_config("tiny", None)
    hf_cfg.save_pretrained(tmp_path)
    assert target_tokenizer(None) is None and target_tokenizer(str(tmp_path)) is None
    _, drafter = build_models(CFG, hf_cfg, torch.device("cpu"))
    assert drafter.mask_token_id == hf_cfg.vocab_size - 1
