"""The demo corpus: the Python standard library's own source, split BY FILE into three parts.

  target   the demo target's training text
  drafter  prompts whose continuations BY THE TARGET the drafter trains on: the target never saw
           these files, so its continuations are its own generalisation, as on a user's prompts
           (continuations of files it memorised would be verbatim stdlib instead)
  heldout  prompts for measuring tau; never trained on, by the target or by the drafter
"train" is target + drafter. A file's part depends only on its path relative to the stdlib folder
(a hash), so it is the same on every machine and Python version.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from pathlib import Path

HELD_OUT_PERCENT = 10
DRAFTER_PERCENT = 40
SPLITS = ("target", "drafter", "heldout", "train")
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
STDLIB = Path(sysconfig.get_paths()["stdlib"])  # this interpreter's standard-library folder


def part_of(relative_path: str) -> str:
    """"target", "drafter" or "heldout" for a path relative to the stdlib folder."""
    digest = hashlib.sha256(relative_path.encode()).digest()
    bucket = int.from_bytes(digest[:4], "little") % 100
    if bucket < HELD_OUT_PERCENT:
        return "heldout"
    return "drafter" if bucket < HELD_OUT_PERCENT + DRAFTER_PERCENT else "target"


def stdlib_files(split: str, root: Path | None = None) -> list[Path]:
    """Sorted .py files of the stdlib for `split`, one of SPLITS."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    root = root or STDLIB
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP_DIRS.intersection(rel.parts[:-1]):
            continue
        part = part_of(rel.as_posix())
        if part == split or (split == "train" and part != "heldout"):
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


def write_text_jsonl(files: list[Path], out: Path, max_chars: int) -> None:
    """One {"text": chunk} line per chunk of each file (an unreadable file has none)."""
    with out.open("w", encoding="utf-8") as fh:
        for path in files:
            for piece in chunk_lines(read_source(path) or "", max_chars):
                fh.write(json.dumps({"text": piece}) + "\n")
