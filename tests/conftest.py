"""Shared fixtures: a tiny Qwen3 target folder (random weights, a BPE tokenizer with a mask token),
a small text corpus, and a small training config. Nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from blockdraft.config import Config, build_config
from blockdraft.corpus import read_source, stdlib_files

TINY_TARGET = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                   intermediate_size=64, max_position_embeddings=512)


def _texts(limit: int = 6) -> list[str]:
    return [t for t in map(read_source, stdlib_files("train")[:limit]) if t]


def _save_tokenizer(path: Path, mask: bool, chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """A 320-token byte-level BPE trained on stdlib text; optional <|MASK|> and chat template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|MASK|>"] if mask else ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<spare>"]
    trainer = trainers.BpeTrainer(vocab_size=256 + 64, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_texts(), trainer=trainer)
    extra = {"mask_token": "<|MASK|>"} if mask else {"additional_special_tokens": specials[1:]}
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                     **extra)
    if chat_template:
        hf_tok.chat_template = chat_template
    hf_tok.save_pretrained(path)
    return hf_tok


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    """A saved 4-layer Qwen3 causal LM with a 256-token BPE tokenizer that has <|MASK|>."""
    path = tmp_path_factory.mktemp("tiny-target")
    hf_tok = _save_tokenizer(path, mask=True)
    torch.manual_seed(0)
    # a wide init gives the frozen lm_head logits of a trained scale, so drafters learn in a few steps
    cfg = Qwen3Config(vocab_size=len(hf_tok), architectures=["Qwen3ForCausalLM"], eos_token_id=0,
                      initializer_range=0.3, **TINY_TARGET)
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    return path


CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="session")
def tiny_llama_target(tmp_path_factory) -> Path:
    """SmolLM2-shaped: Llama, tied head, a chat template, no mask token (one spare special token)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny-llama")
    hf_tok = _save_tokenizer(path, mask=False, chat_template=CHAT_TEMPLATE)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(hf_tok), architectures=["LlamaForCausalLM"], eos_token_id=0,
                      tie_word_embeddings=True, initializer_range=0.3, rope_theta=100000.0, **TINY_TARGET)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


# Decoders users bring beside Qwen3 and Llama, each with what sets it apart: (config class, model class,
# settings). Gemma 3: scaled embeddings, sliding-window and full layers with their own RoPE; Qwen2: q/k/v
# biases; Phi-3: fused qkv and gate_up; Qwen3-MoE: routed experts; Gemma 2: scaled embeddings, logit
# soft-capping, sliding-window layers.
MORE_ARCHITECTURES = {
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               {"pad_token_id": 0, "bos_token_id": 0, "sliding_window": 16, "query_pre_attn_scalar": 16,
                "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               {"pad_token_id": 0, "bos_token_id": 0, "query_pre_attn_scalar": 16, "sliding_window": 16}),
}


# Decoders with recurrent layers, decoded on the model's own cache (evaluate/recurrent.py).
# Qwen3-Next: Gated DeltaNet (linear attention) layers, a full-attention layer every fourth;
# LFM2: short convolutions between attention layers; Falcon-H1: attention and Mamba 2 in every layer.
RECURRENT_ARCHITECTURES = {
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                   {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                    "linear_num_value_heads": 2, "linear_num_key_heads": 1, "linear_key_head_dim": 16,
                    "linear_value_head_dim": 16}),
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM",
             {"layer_types": ["conv", "full_attention", "conv", "full_attention"]}),
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM",
                  {"mamba_d_ssm": 32, "mamba_n_heads": 4, "mamba_d_head": 8, "mamba_d_state": 8, "mamba_n_groups": 1,
                   "mamba_chunk_size": 16}),
}


@pytest.fixture(scope="session")
def tiny_target_of(tmp_path_factory):
    """`tiny_target_of(name)`: a saved 4-layer target of MORE_ARCHITECTURES or RECURRENT_ARCHITECTURES,
    with <|MASK|>."""
    import transformers

    def build(name: str) -> Path:
        config_class, model_class, settings = {**MORE_ARCHITECTURES, **RECURRENT_ARCHITECTURES}[name]
        path = tmp_path_factory.mktemp(f"tiny-{name}")
        hf_tok = _save_tokenizer(path, mask=True)
        torch.manual_seed(0)
        cfg = getattr(transformers, config_class)(vocab_size=len(hf_tok), architectures=[model_class], eos_token_id=0,
                                                  initializer_range=0.3, **{**TINY_TARGET, **settings})
        getattr(transformers, model_class)(cfg).save_pretrained(path)
        return path

    return build


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "train.jsonl"
    with path.open("w") as fh:
        for text in _texts(4):
            for i in range(0, min(len(text), 6000), 300):
                fh.write(json.dumps({"text": text[i : i + 300]}) + "\n")
    return path


def make_config(target: Path, corpus: Path, out_dir: Path, **sections) -> Config:
    raw = {
        "target": {"path": str(target)},
        "drafter": {"num_layers": 1, "block_size": 4, "target_layer_ids": [0, 2]},
        "data": {"train_files": [str(corpus)], "format": "text", "max_len": 64, "tokens_per_batch": 256,
                 "cache_dir": str(out_dir / "cache"), "num_workers": 1, "prefetch_depth": 2},
        "optim": {"lr": 1e-3, "warmup_steps": 2},
        "train": {"out_dir": str(out_dir / "run"), "max_steps": 6, "num_anchors": 8, "save_every": 3,
                  "device": "cpu", "precision": "fp32"},
        "eval": {"prompts": [], "max_new_tokens": 8},
    }
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    return build_config(raw)


@pytest.fixture
def tiny_config(tiny_target, tiny_corpus, tmp_path):
    return lambda **sections: make_config(tiny_target, tiny_corpus, tmp_path, **sections)


@pytest.fixture(scope="session")
def tiny_chat_target(tmp_path_factory) -> Path:
    """The config of the bench's tiny shape without weights (what `blockdraft bench` reads of a folder),
    its table the size of the tokenizer beside it: one with a chat template and no mask token (its spare
    special token serves)."""
    from blockdraft.bench.shapes import SHAPES

    path = tmp_path_factory.mktemp("tiny-chat-target")
    hf_tok = _save_tokenizer(path, mask=False, chat_template=CHAT_TEMPLATE)
    Qwen3Config(**{**SHAPES["tiny"][1], "vocab_size": len(hf_tok)}).save_pretrained(path)
    return path


CHATS = [("What does a list hold?", "A list holds any objects, in order, and can grow or shrink."),
         ("How is a dict keyed?", "A dict maps hashable keys to values; lookups take constant time."),
         ("Why read the source?", "The source says what the code does, where the documents only say what it should."),
         ("Name a loop.", "The for statement iterates over the items of any sequence, in the order they appear.")]


@pytest.fixture(scope="session")
def tiny_chats(tmp_path_factory) -> Path:
    """A chat JSONL of len(CHATS) short conversations and one line that is not JSON, 3rd."""
    path = tmp_path_factory.mktemp("chats") / "chats.jsonl"
    lines = [json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
             for q, a in CHATS]
    path.write_text("\n".join([*lines[:2], "{not json", *lines[2:]]) + "\n")
    return path
