"""Held-out prompts for measuring tau: JSONL chats (prompt = the conversation up to its last
assistant turn, rendered with the generation prompt) or raw text (prompt = its first tokens)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from blockdraft.config import EvalConfig
from blockdraft.data.reading import BadRecord, Chat, Text, check_files, iter_records
from blockdraft.data.tokenize import SampleEncoder
from blockdraft.errors import UserError


def prompt_ids(rec: Chat | Text, encoder: SampleEncoder, tokenizer, cfg: EvalConfig) -> list[int]:
    """One record's prompt tokens, or BadRecord (a chat with no turn before its answer, a template
    that refuses it: e.g. a base model without a chat template)."""
    if isinstance(rec, Text):
        return tokenizer(rec.text, add_special_tokens=False)["input_ids"][: cfg.prompt_tokens]
    # the turns before the last assistant turn (a chat without one is used whole)
    last = max((i for i, m in enumerate(rec.messages) if m["role"] == "assistant"), default=len(rec.messages))
    turns = rec.messages[:last]
    if not turns:
        raise BadRecord("no_prompt_turns")
    return tokenizer(encoder.render(turns, generation_prompt=True), add_special_tokens=False)["input_ids"][
        -cfg.prompt_tokens :
    ]


def skip_counts(skipped: dict[str, int]) -> str:
    """`reason: count, ...`, the one wording of skipped prompt lines."""
    return ", ".join(f"{reason}: {count}" for reason, count in skipped.items())


def load_prompts(
    files: list[str], tokenizer, cfg: EvalConfig, thinking: bool = False
) -> tuple[list[list[int]], dict[str, int]]:
    """Token-id prompts, at most cfg.max_prompts; bad lines are skipped and counted by reason.
    Prompt-only chats are welcome: a prompt set needs no answers."""
    encoder = SampleEncoder(tokenizer, thinking=thinking, max_len=cfg.prompt_tokens, overlong="truncate")
    prompts: list[list[int]] = []
    skipped: Counter[str] = Counter()
    for path in check_files(files):
        for _, rec in iter_records(Path(path), "auto", require_assistant=False):
            if len(prompts) >= cfg.max_prompts:
                break
            if isinstance(rec, BadRecord):
                skipped[rec.reason] += 1
                continue
            try:
                ids = prompt_ids(rec, encoder, tokenizer, cfg)
            except BadRecord as bad:
                skipped[bad.reason] += 1
                continue
            if ids:
                prompts.append(ids)
    if not prompts:
        reasons = skip_counts(skipped) or "no records"
        raise UserError(f"no usable prompt in {', '.join(files)} (skipped lines: {reasons})")
    return prompts, dict(skipped)
