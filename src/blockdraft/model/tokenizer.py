"""The target's tokenizer: below data and model alike, since both need it."""

from __future__ import annotations

from typing import Any

from blockdraft.errors import UserError, first_line


def load_tokenizer(path: str) -> Any:
    """The target's tokenizer from its local folder; a bad folder is a user error, not a traceback."""
    from pathlib import Path

    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise UserError(f"target folder not found: {path}")
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError... for a bad folder
        raise UserError(f"cannot load a tokenizer from {path}: {first_line(exc)}") from None
