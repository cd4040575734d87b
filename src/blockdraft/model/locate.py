"""Where a target model lives: a local folder, or a Hugging Face hub id already in the local cache.

blockdraft never downloads a model: a training run must not depend on the network, nor fetch
16 GB behind the user's back. Most users hold their models in the hub cache, so an id such as
`Qwen/Qwen3-8B` resolves to its cached snapshot; one that is not cached is one clear line.
"""

from __future__ import annotations

import re
from pathlib import Path

from blockdraft.errors import UserError

# the hub's own rule for `owner/name`: letters, digits, '-', '_', '.'; no leading or trailing '-' or '.'
_HUB_ID = re.compile(r"^[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9_])?/[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9_])?$")


def looks_like_hub_id(text: str) -> bool:
    """`owner/name`, the form of every current hub model id (and of no absolute or `./` path)."""
    return bool(_HUB_ID.match(text)) and ".." not in text and "--" not in text


def locate_model(path: str | Path) -> Path:
    """The folder holding the model: `path` itself when it is a folder, else the cached snapshot of
    the hub id `path` (the revision `main` points at), looked up with `local_files_only`."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    text = str(path)
    if not looks_like_hub_id(text):
        raise UserError(f"target folder not found: {path}")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(text, local_files_only=True))
    except LocalEntryNotFoundError:
        raise UserError(
            f"target {text!r} is neither a local folder nor in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); blockdraft never downloads: fetch it once with `hf download {text}`"
        ) from None
