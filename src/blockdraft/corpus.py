"""The demo corpus: the Python standard library's own source, split into train and held-out BY FILE.

The split depends only on a file's path relative to the stdlib folder (a hash), so it is the same
on every machine and Python version: a held-out file is never trained on, by the demo target or
by the demo drafter.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from pathlib import Path

HELD_OUT_PERCENT = 10
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(relative_path: str) -> bool:
    digest = hashlib.sha256(relative_path.encode()).digest()
    return int.from_bytes(digest[:4], "little") % 100 < HELD_OUT_PERCENT


def stdlib_files(split: str, root: Path | None = None) -> list[Path]:
    """Sorted .py files of the stdlib for `split` in {"train", "heldout"}."""
    root = root or stdlib_dir()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP_DIRS.intersection(rel.parts[:-1]):
            continue
        if is_held_out(rel.as_posix()) == (split == "heldout"):
            files.append(path)
    return files


def read_source(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def chunk_lines(text: str, max_chars: int) -> list[str]:
    """Split source at line boundaries into pieces of at most ~max_chars."""
    pieces, current, size = [], [], 0
    for line in text.splitlines(keepends=True):
        if current and size + len(line) > max_chars:
            pieces.append("".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line)
    if current:
        pieces.append("".join(current))
    return [p for p in pieces if p.strip()]


def write_text_jsonl(files: list[Path], out: Path, max_chars: int) -> int:
    """One {"text": chunk} line per chunk of each file; returns the number of lines written."""
    count = 0
    with out.open("w", encoding="utf-8") as fh:
        for path in files:
            text = read_source(path)
            if text is None:
                continue
            for piece in chunk_lines(text, max_chars):
                fh.write(json.dumps({"text": piece}) + "\n")
                count += 1
    return count
