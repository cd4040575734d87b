"""Held-out prompts for measuring tau: JSONL chats (prompt = the conversation up to its last
assistant turn, rendered with the generation prompt) or raw text (prompt = its first tokens)."""

from __future__ import annotations

from pathlib import Path

from blockdraft.config import EvalConfig
from blockdraft.data.reading import BadRecord, Chat, check_files, iter_records
from blockdraft.data.tokenize import SampleEncoder
from blockdraft.errors import UserError


def chat_prompt(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The turns before the last assistant turn (a chat without one is used whole)."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=len(messages))
    return messages[:last]


def load_prompts(
    files: list[str], tokenizer, cfg: EvalConfig, thinking: bool = False
) -> tuple[list[list[int]], dict[str, int]]:
    """Token-id prompts, at most cfg.max_prompts; bad lines are skipped and counted by reason."""
    encoder = SampleEncoder(tokenizer, thinking=thinking, max_len=cfg.prompt_tokens, overlong="truncate")
    prompts: list[list[int]] = []
    skipped: dict[str, int] = {}
    for path in check_files(files):
        for _, rec in iter_records(Path(path), "auto"):
            if len(prompts) >= cfg.max_prompts:
                break
            if isinstance(rec, BadRecord):
                skipped[rec.reason] = skipped.get(rec.reason, 0) + 1
                continue
            if isinstance(rec, Chat):
                turns = chat_prompt(rec.messages)
                if not turns:
                    skipped["no_prompt_turns"] = skipped.get("no_prompt_turns", 0) + 1
                    continue
                ids = tokenizer(encoder.render(turns, generation_prompt=True), add_special_tokens=False)["input_ids"]
                ids = ids[-cfg.prompt_tokens :]
            else:
                ids = tokenizer(rec.text, add_special_tokens=False)["input_ids"][: cfg.prompt_tokens]
            if ids:
                prompts.append(ids)
    if not prompts:
        raise UserError(f"no usable prompt in {', '.join(files)}")
    return prompts, skipped


def heldout_prompts(cfg: EvalConfig, tokenizer) -> list[list[int]]:
    return load_prompts(cfg.prompts, tokenizer, cfg)[0]
