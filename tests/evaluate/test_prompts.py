"""Prompt sets: prompt-only chats (the usual benchmark shape) and chats with answers both give the
turns before the answer with the generation prompt; thinking on/off changes that prompt; a template
that refuses chats (a base model) skips them by reason, and an empty set names the reasons."""

import json

import pytest

from blockdraft.config import EvalConfig
from blockdraft.errors import UserError
from blockdraft.evaluate.prompts import load_prompts
from tests.data.conftest import make_tokenizer

QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return [str(path)]


@pytest.mark.parametrize("thinking", [False, True])
def test_prompt_only_and_answered_chats_give_the_same_prompt(tmp_path, thinking):
    tok = make_tokenizer("qwen")
    answered = QUESTION + [{"role": "assistant", "content": "5"}]
    files = _write(tmp_path / "p.jsonl", [{"messages": QUESTION}, {"messages": answered}, {"text": "def f():"}])
    prompts, skipped = load_prompts(files, tok, EvalConfig(), thinking=thinking)
    rendered = tok.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True, enable_thinking=thinking)
    expected = tok(rendered, add_special_tokens=False)["input_ids"]
    assert prompts == [expected, expected, tok("def f():", add_special_tokens=False)["input_ids"]]
    assert skipped == {}
    assert rendered.endswith("<think>\n\n</think>\n\n") == (not thinking)  # the modes differ


def test_chats_without_a_template_are_skipped_by_reason(tmp_path, tiny_target):
    from blockdraft.model.tokenizer import load_tokenizer

    base = load_tokenizer(str(tiny_target))  # no chat template
    files = _write(tmp_path / "p.jsonl", [{"messages": QUESTION}, {"text": "import os"}])
    prompts, skipped = load_prompts(files, base, EvalConfig())
    assert len(prompts) == 1 and skipped == {"template_error": 1}
    with pytest.raises(UserError, match=r"skipped lines: template_error: 1\)"):
        load_prompts(_write(tmp_path / "chats.jsonl", [{"messages": QUESTION}]), base, EvalConfig())
