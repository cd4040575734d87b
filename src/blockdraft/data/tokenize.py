"""Turn records into token ids and a loss mask with the target's own chat template.

The loss mask covers what the model itself would generate: every assistant turn from the end of
its generation prompt to the end of its content, plus the special token that closes the turn
(`<|im_end|>`, `<|eot_id|>`, ...). It is found by rendering, so it works for any template, with or
without `{% generation %}` tags:
- start of turn i = the end of the generation prompt: the turns before i rendered with the
  generation prompt form a prefix of the full rendering (so an empty `<think></think>` block that
  the prompt already holds is not learned when thinking is off, and is learned when thinking is on);
  history turns that a template renders without that block match the other thinking mode's prompt;
- end of turn i = where a sentinel appended to its content shows up (templates may trim, split
  off reasoning or rewrite history turns; a suffix sentinel survives all of that).
"""

from __future__ import annotations

import re
from bisect import bisect_left
from typing import Any

import numpy as np

from blockdraft.data.reading import BadRecord, Record, Text, or_bad
from blockdraft.errors import UserError

SENTINEL = "\ue000\ue001"
Spans = list[tuple[int, int]]
_SPACE = re.compile(r"\s*")


def common_prefix_len(a: str, b: str) -> int:
    """Length of the longest common prefix, by C-speed slice comparisons (strings run to 100k chars)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _marked(turn: dict[str, str]) -> dict[str, str]:
    """The turn with SENTINEL after its right-stripped content, to find where the content ends."""
    return {**turn, "content": turn["content"].rstrip() + SENTINEL}


def align_pieces(full: str, pieces: list[str]) -> list[int] | None:
    """Positions in `full` where the pieces of a marked rendering meet, or None if they do not fit.

    Contents are marked after right-stripping, so `full` may hold whitespace that the marked render
    lacks (templates that do not trim); that whitespace sits at the start of the next piece.
    """
    pos, ends = 0, []
    for k, piece in enumerate(pieces):
        if k:
            ends.append(pos)
        if full.startswith(piece, pos):
            pos += len(piece)
            continue
        gap = _SPACE.match(full, pos).end() - pos if k else 0
        shift = next((j for j in range(1, gap + 1) if full.startswith(piece, pos + j)), None)
        if shift is None:
            return None
        pos += shift + len(piece)
    return ends if pos == len(full) else None


class SampleEncoder:
    """Encodes one record at a time; picklable, so tokeniser processes get their own copy."""

    def __init__(self, tokenizer: Any, thinking: bool, max_len: int, overlong: str):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise UserError("the target tokenizer must be a fast (Rust) tokenizer; got a slow one")
        self.tokenizer = tokenizer
        self.backend = backend
        self.thinking = thinking
        self.max_len = max_len
        self.overlong = overlong
        self.has_template = bool(getattr(tokenizer, "chat_template", None))
        self.special_ids = frozenset(
            int(i) for i, tok in tokenizer.added_tokens_decoder.items() if getattr(tok, "special", False)
        )
        self.prompt_suffixes = self._prompt_suffixes() if self.has_template else None

    def _prompt_suffixes(self) -> tuple[str, str] | None:
        """The generation prompt of each thinking mode (configured, other), when the template simply
        appends it; lets a history turn's start be checked without a second render."""
        probe = [{"role": "user", "content": "x"}]
        try:
            base = self.render(probe)
            mine = self.render(probe, generation_prompt=True)
            other = self.render(probe, generation_prompt=True, thinking=not self.thinking)
        except BadRecord:
            return None
        if mine.startswith(base) and other.startswith(base) and len(mine) > len(base):
            return mine[len(base) :], other[len(base) :]
        return None

    def render(
        self, messages: list[dict[str, str]], generation_prompt: bool = False, thinking: bool | None = None
    ) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                                      enable_thinking=self.thinking if thinking is None else thinking)
        except Exception:  # jinja's raise_exception, TemplateError, type errors inside the template
            raise BadRecord("template_error") from None

    def _content_ends(self, messages: list[dict[str, str]], full: str, turns: list[int]) -> list[int]:
        """End of each assistant turn's content in `full`: one render with every content marked."""
        marked = [_marked(m) if m["role"] == "assistant" else m for m in messages]
        pieces = self.render(marked).split(SENTINEL)
        ends = align_pieces(full, pieces) if len(pieces) == len(turns) + 1 else None
        if ends is not None:
            return ends
        return [self._content_end_alone(messages, full, i) for i in turns]

    def _content_end_alone(self, messages: list[dict[str, str]], full: str, turn: int) -> int:
        """Fallback for templates that drop or reorder some turns: mark one turn per render."""
        marked = [*messages[:turn], _marked(messages[turn]), *messages[turn + 1 :]]
        rendered = self.render(marked)
        if SENTINEL not in rendered:
            return -1  # the template does not show this turn at all
        end = common_prefix_len(full, rendered)
        if not rendered.startswith(SENTINEL, end):
            raise BadRecord("template_mismatch")
        return end

    def _turn_start(self, before: list[dict[str, str]], full: str) -> int:
        """Where the model starts writing: the end of the generation prompt inside `full`.

        The prompt of the configured thinking mode is tried first, then the other one (history turns
        and turns that carry their own reasoning are rendered without the empty think block).
        """
        prompt = self.render(before, generation_prompt=True)
        if full.startswith(prompt):
            return len(prompt)
        if self.prompt_suffixes and prompt.endswith(self.prompt_suffixes[0]):
            mine, other_suffix = self.prompt_suffixes
            other = prompt[: len(prompt) - len(mine)] + other_suffix
        else:
            other = self.render(before, generation_prompt=True, thinking=not self.thinking)
        if full.startswith(other):
            return len(other)
        return common_prefix_len(full, prompt)

    def assistant_spans(self, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
        """The full rendering and the [start, end) character span of each visible assistant turn."""
        if any(SENTINEL in m["content"] for m in messages):
            raise BadRecord("bad_field")
        full = self.render(messages)
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        ends = self._content_ends(messages, full, turns)
        spans, prev_end = [], 0
        for i, end in zip(turns, ends, strict=True):
            if end < 0:
                continue
            if i == 0:  # no generation prompt comes before a leading assistant turn: learn its text only
                body = messages[0]["content"].strip()
                start = end - len(body)
                if full[start:end] != body:
                    continue
            else:
                start = max(prev_end, self._turn_start(messages[:i], full))
            if end < start:
                raise BadRecord("template_mismatch")
            spans.append((start, end))
            prev_end = end
        return full, spans

    def _mask_from_spans(
        self, ids: list[int], offsets: list[tuple[int, int]], full: str, spans: list[tuple[int, int]]
    ) -> np.ndarray:
        """Tokens overlapping a span, then the whitespace and the special token that close the turn."""
        n = len(ids)
        mask = np.zeros(n, dtype=np.bool_)
        for s, e in spans:
            a = bisect_left(offsets, (s,))  # first token starting at or after s
            if a > 0 and offsets[a - 1][1] > s:
                a -= 1
            j = bisect_left(offsets, (e,), lo=a)  # first token starting at or after e
            mask[a:j] = True
            while j < n and not mask[j]:
                mask[j] = True
                if ids[j] in self.special_ids:
                    break
                start, stop = offsets[j]
                if not full[start:stop].isspace():
                    mask[j] = False
                    break
                j += 1
        return mask

    def encode_many(self, records: list[Record]) -> list[tuple[np.ndarray, np.ndarray, bool] | BadRecord]:
        """(ids int32, loss mask bool, truncated) or BadRecord for each record, in order. Templates are
        rendered one by one (Python); the texts then go to the Rust tokenizer in one `encode_batch` per
        kind, which saves a call per record and uses every core where the tokenizer may run threads."""
        prepared = [or_bad(self._prepare, record) for record in records]
        return [prep if isinstance(prep, BadRecord) else or_bad(self._finish, enc, *prep)
                for prep, enc in zip(prepared, self._encode_texts(prepared), strict=True)]

    def _prepare(self, record: Record) -> tuple[str, Spans | None]:
        """The text to tokenise and, for a chat, its assistant spans (None: learn every token)."""
        if isinstance(record, Text):
            return record.text, None
        if not self.has_template:
            raise UserError("the target tokenizer has no chat template; use data.format=text for plain text")
        return self.assistant_spans(record.messages)

    def _encode_texts(self, prepared: list[tuple[str, Spans | None] | BadRecord]) -> list[Any]:
        """One Encoding per prepared record (None for a BadRecord): plain text with the tokenizer's
        special tokens, chats without (their template already wrote them)."""
        encodings: list[Any] = [None] * len(prepared)
        for is_text in (True, False):
            index = [i for i, p in enumerate(prepared) if not isinstance(p, BadRecord) and (p[1] is None) == is_text]
            if index:
                batch = self.backend.encode_batch([prepared[i][0] for i in index], add_special_tokens=is_text)
                for i, enc in zip(index, batch, strict=True):
                    encodings[i] = enc
        return encodings

    def _finish(self, enc: Any, text: str, spans: Spans | None) -> tuple[np.ndarray, np.ndarray, bool]:
        """Loss mask from the encoding's offsets, then the max_len policy."""
        ids = enc.ids
        if spans is None:
            mask = np.ones(len(ids), dtype=np.bool_)
        else:
            mask = self._mask_from_spans(ids, enc.offsets, text, spans)
            if not mask.any():
                raise BadRecord("no_assistant_tokens")
        truncated = len(ids) > self.max_len
        if truncated:
            if self.overlong == "drop":
                raise BadRecord("overlong")
            ids, mask = ids[: self.max_len], mask[: self.max_len]
            if not mask.any():
                raise BadRecord("no_loss_within_max_len")
        return np.asarray(ids, dtype=np.int32), mask, truncated

