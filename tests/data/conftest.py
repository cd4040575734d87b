"""Tiny local tokenizers with Qwen3-style and Llama-3-style chat templates (nothing is downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from blockdraft.config import DataConfig

QWEN_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{%- set content = m.content -%}{%- set reasoning = '' -%}"
    "{%- if '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{%- if loop.index0 > ns.last_user and (loop.last or reasoning) -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

LLAMA_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for m in messages -%}"
    "{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content | trim + '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)

CORPUS = [
    "hello world, how are you today? I am fine, thank you.",
    "the quick brown fox jumps over the lazy dog 0123456789",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))",
    "What is the capital of France? Paris is the capital of France.",
    "Explain recursion. Recursion is when a function calls itself.",
]


def make_tokenizer(style: str) -> PreTrainedTokenizerFast:
    if style == "qwen":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    else:
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    if style == "qwen":
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
        fast.add_tokens(["<think>", "</think>"])
        fast.chat_template = QWEN_TEMPLATE
    else:
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token="<|begin_of_text|>",
            eos_token="<|eot_id|>",
            pad_token="<|end_of_text|>",
        )
        fast.chat_template = LLAMA_TEMPLATE
    return fast


@pytest.fixture(scope="session")
def qwen_tok() -> PreTrainedTokenizerFast:
    return make_tokenizer("qwen")


@pytest.fixture(scope="session")
def llama_tok() -> PreTrainedTokenizerFast:
    return make_tokenizer("llama")


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory, qwen_tok) -> Path:
    path = tmp_path_factory.mktemp("qwen_target")
    qwen_tok.save_pretrained(path)
    return path


def write_jsonl(path: Path, records: list) -> Path:
    """Records are dicts (dumped as JSON) or raw bytes/str lines written as they are."""
    with path.open("wb") as fh:
        for rec in records:
            if isinstance(rec, bytes):
                fh.write(rec + b"\n")
            elif isinstance(rec, str):
                fh.write(rec.encode() + b"\n")
            else:
                fh.write(json.dumps(rec).encode() + b"\n")
    return path


def chat(*turns: str, system: str | None = None) -> dict:
    """A messages record alternating user / assistant turns."""
    msgs = [{"role": "system", "content": system}] if system else []
    msgs += [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return {"messages": msgs}


def data_cfg(tmp_path: Path, **kw) -> DataConfig:
    return DataConfig(cache_dir=str(tmp_path / "cache"), num_workers=1, **kw)
