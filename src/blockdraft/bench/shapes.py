"""Named target shapes (published configs, random weights: nothing is downloaded)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from transformers import AutoConfig, LlamaConfig, PretrainedConfig, Qwen3Config

from blockdraft.errors import UserError, first_line
from blockdraft.model.tokenizer import load_tokenizer

_QWEN3_ROPE = {"rope_type": "default", "rope_theta": 1_000_000.0}
_LLAMA31_ROPE = {"rope_type": "llama3", "rope_theta": 500_000.0, "factor": 8.0, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
_QWEN3 = dict(vocab_size=151936, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
              max_position_embeddings=40960, rope_parameters=_QWEN3_ROPE)  # what the Qwen3 sizes share

SHAPES: dict[str, tuple[type[PretrainedConfig], dict[str, Any]]] = {
    "qwen3-8b": (Qwen3Config, dict(_QWEN3, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                                   tie_word_embeddings=False)),
    "qwen3-4b": (Qwen3Config, dict(_QWEN3, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                                   tie_word_embeddings=True)),
    "qwen3-1.7b": (Qwen3Config, dict(_QWEN3, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                                     num_attention_heads=16, tie_word_embeddings=True)),
    "llama-3.1-8b": (LlamaConfig, dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                       head_dim=128, max_position_embeddings=131072, tie_word_embeddings=False,
                                       rope_parameters=_LLAMA31_ROPE)),
    "tiny": (Qwen3Config, dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                               tie_word_embeddings=False, rope_parameters=_QWEN3_ROPE)),
}


def target_config(shape: str | None, target_dir: str | None) -> PretrainedConfig:
    """The target's config: a named shape, or the config.json of a local model folder (its text decoder's,
    for a multimodal one: that is what the drafter taps)."""
    if target_dir is not None:
        if not Path(target_dir, "config.json").is_file():
            raise UserError(f"{target_dir}: no config.json there (a local Hugging Face model folder is expected)")
        try:
            return AutoConfig.from_pretrained(target_dir).get_text_config()
        except (OSError, ValueError) as exc:
            raise UserError(f"{target_dir}: cannot read a model config: {first_line(exc)}") from None
    if shape not in SHAPES:
        raise UserError(f"unknown target shape {shape!r}; choose one of {', '.join(SHAPES)}")
    cls, fields = SHAPES[shape]
    return cls(**fields)


@functools.cache
def target_tokenizer(target_dir: str | None) -> Any | None:
    """A local folder's tokenizer, where it has one: the bench's drafter then takes the mask token that
    training would. A named shape, or a folder of a config alone, has none. Loaded once a process:
    `bench/peer_nemo.py --ours` asks for it for NeMo's runs and again for ours."""
    files = ("tokenizer.json", "tokenizer_config.json")
    if target_dir is None or not any(Path(target_dir, f).is_file() for f in files):
        return None
    return load_tokenizer(target_dir)
