"""Read chat or text records from JSONL, JSON-array and Parquet files, one record per line or row.

Bad input never stops a run: each bad record raises `BadRecord` with a reason code from `REASONS`,
and the caller counts it with its line number. Records are grouped into chunks of raw lines so the
expensive work (JSON parsing included) happens in the tokeniser processes, not in the reader.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blockdraft.config import DATA_FORMATS
from blockdraft.errors import UserError

REASONS: dict[str, str] = {
    "invalid_utf8": "the line is not valid UTF-8",
    "malformed_json": "the line is not valid JSON",
    "not_an_object": "the record is not a JSON object",
    "missing_field": "no messages/conversations/text field, or a turn without role/content",
    "bad_field": "a field has the wrong type",
    "unknown_role": "a turn's role is not system, user, assistant or tool",
    "empty_conversation": "the conversation has no turns",
    "empty_text": "the text is empty",
    "no_assistant_tokens": "nothing to learn: no assistant content",
    "template_error": "the chat template refused the conversation",
    "template_mismatch": "an assistant turn could not be located in the rendered template",
    "overlong": "longer than max_len (data.overlong=drop)",
    "no_loss_within_max_len": "no assistant token within the first max_len tokens",
}

ROLE_ALIASES: dict[str, str] = {
    "system": "system",
    "tool": "tool",
    **dict.fromkeys(("user", "human"), "user"),
    **dict.fromkeys(("assistant", "gpt", "chatgpt", "bard", "bing", "model"), "assistant"),
}

FORMAT_KEYS = DATA_FORMATS[1:]


class BadRecord(Exception):
    """A record that cannot be used; `reason` is a key of REASONS."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def or_bad(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, or the BadRecord it raised: bad records stay in the result lists, in order."""
    try:
        return fn(*args)
    except BadRecord as bad:
        return bad


@dataclass(frozen=True)
class Chat:
    messages: list[dict[str, str]]


@dataclass(frozen=True)
class Text:
    text: str


Record = Chat | Text


def _content_text(content: Any) -> str:
    """OpenAI content is a string, null, or a list of parts of which the text parts count."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [part.get("text") if isinstance(part, dict) else part for part in content]
        if all(isinstance(text, str) for text in texts):
            return "".join(texts)
    raise BadRecord("bad_field")


def _parse_turn(turn: Any) -> dict[str, str]:
    if not isinstance(turn, dict):
        raise BadRecord("bad_field")
    role_key, content_key = ("from", "value") if "from" in turn or "value" in turn else ("role", "content")
    if role_key not in turn or content_key not in turn:
        raise BadRecord("missing_field")
    role = turn[role_key]
    if not isinstance(role, str):
        raise BadRecord("bad_field")
    canonical = ROLE_ALIASES.get(role.strip().lower())
    if canonical is None:
        raise BadRecord("unknown_role")
    return {"role": canonical, "content": _content_text(turn[content_key])}


def parse_item(item: bytes | Any, fmt: str, require_assistant: bool = True) -> Record:
    """Validate one item: a raw JSONL line (bytes) or an already decoded record (Parquet row, array
    item); `fmt` is auto, messages, conversations or text. `require_assistant=False` accepts
    prompt-only chats (regeneration writes their answers)."""
    if isinstance(item, bytes):
        try:
            text = item.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark on the first line
        except UnicodeDecodeError:
            raise BadRecord("invalid_utf8") from None
        try:
            item = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            raise BadRecord("malformed_json") from None
    if not isinstance(item, dict):
        raise BadRecord("not_an_object")
    key = next((k for k in FORMAT_KEYS if k in item), None) if fmt == "auto" else fmt
    if key not in item:
        raise BadRecord("missing_field")
    value = item[key]
    if key != "text" and isinstance(value, str):  # some exports store the turn list as a JSON string
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            raise BadRecord("bad_field") from None
    if key == "text":
        if not isinstance(value, str):
            raise BadRecord("bad_field")
        if not value.strip():
            raise BadRecord("empty_text")
        return Text(value)
    if not isinstance(value, list):
        raise BadRecord("bad_field")
    if not value:
        raise BadRecord("empty_conversation")
    messages = [_parse_turn(turn) for turn in value]
    if require_assistant and not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
        raise BadRecord("no_assistant_tokens")
    return Chat(messages)


Chunk = list[tuple[int, Any]]


DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".pq")
MANIFEST = "manifest.json"  # `blockdraft regenerate`'s record of a folder's inputs, not data


def check_files(files: list[str]) -> list[Path]:
    if not files:
        raise UserError("no data files given (set data.train_files or pass FILE arguments)")
    paths = []
    for name in files:
        path = Path(name)
        if path.is_dir():  # a folder: its data files (e.g. `blockdraft regenerate`'s shards), in name order
            found = sorted(f for f in path.iterdir()
                           if f.is_file() and f.suffix.lower() in DATA_SUFFIXES and f.name != MANIFEST)
            if not found:
                raise UserError(f"data folder {name} holds no {'/'.join(DATA_SUFFIXES)} files")
            paths.extend(found)
            continue
        if not path.is_file():
            raise UserError(f"data file not found: {name}")
        paths.append(path)
    return paths


def _is_json_array(path: Path) -> bool:
    """A `.json` file whose first non-blank byte is `[` holds one array of records (ShareGPT's dumps)."""
    if path.suffix.lower() != ".json":
        return False
    with path.open("rb") as fh:
        head = fh.read(4096).lstrip()
    return head.startswith(b"[")


def _jsonl_chunks(path: Path, chunk_size: int) -> Iterator[tuple[Chunk, int]]:
    """Raw lines; `.gz` files are read through gzip, progress counted in compressed bytes."""
    chunk: Chunk = []
    reported = 0
    with path.open("rb") as raw_fh:
        fh = gzip.GzipFile(fileobj=raw_fh) if path.suffix.lower() == ".gz" else raw_fh
        for line_no, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            chunk.append((line_no, raw))
            if len(chunk) >= chunk_size:
                position = raw_fh.tell()
                yield chunk, position - reported
                chunk, reported = [], position
        yield chunk, path.stat().st_size - reported


def _numbered(parts: Iterable[list[Any]], size: int, rows: int) -> Iterator[tuple[Chunk, int]]:
    """Chunks of decoded records numbered from 1, each standing for its share of the file's `size` bytes."""
    row_no = 0
    for part in parts:
        yield [(row_no + i + 1, item) for i, item in enumerate(part)], size * len(part) // max(1, rows)
        row_no += len(part)


def _json_array_chunks(path: Path, chunk_size: int) -> Iterator[tuple[Chunk, int]]:
    try:
        with path.open("rb") as fh:
            items = json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a valid JSON array of records ({exc}); use JSON Lines") from None
    if not isinstance(items, list):
        raise UserError(f"{path}: a .json data file must hold one array of records")
    parts = (items[start : start + chunk_size] for start in range(0, len(items), chunk_size))
    yield from _numbered(parts, path.stat().st_size, len(items))


def _parquet_chunks(path: Path, chunk_size: int) -> Iterator[tuple[Chunk, int]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"{path}: reading Parquet needs pyarrow (pip install 'blockdraft[parquet]')") from None
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise UserError(f"{path}: not a readable Parquet file ({exc})") from None
    columns = [c for c in FORMAT_KEYS if c in pf.schema_arrow.names] or None
    batches = (batch.to_pylist() for batch in pf.iter_batches(batch_size=chunk_size, columns=columns))
    yield from _numbered(batches, path.stat().st_size, pf.metadata.num_rows)


def iter_chunks(path: Path, chunk_size: int) -> Iterator[tuple[Chunk, int]]:
    """Yield (chunk of (line or row number, item), bytes of the file it stands for)."""
    if path.suffix.lower() in (".parquet", ".pq"):
        return _parquet_chunks(path, chunk_size)
    if _is_json_array(path):
        return _json_array_chunks(path, chunk_size)
    return _jsonl_chunks(path, chunk_size)


def parse_chunk(chunk: Chunk, fmt: str, require_assistant: bool = True) -> list[tuple[int, Record | BadRecord]]:
    """Each item of a chunk parsed, with its line number; bad ones come back as BadRecord."""
    return [(line_no, or_bad(parse_item, item, fmt, require_assistant)) for line_no, item in chunk]


def iter_records(path: Path, fmt: str, require_assistant: bool = True) -> Iterator[tuple[int, Record | BadRecord]]:
    """Every record of a file in order, with its line number; bad ones come back as BadRecord."""
    for chunk, _ in iter_chunks(path, 1024):
        yield from parse_chunk(chunk, fmt, require_assistant)
