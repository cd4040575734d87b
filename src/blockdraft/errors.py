"""The one exception type for mistakes a user can make (paths, config, data), and `make_dir`.

The CLI turns a UserError into a single line on stderr and exit code 2; anything else is a bug
and keeps its traceback.
"""

from pathlib import Path


class UserError(Exception):
    """A problem the user can fix: bad path, bad config value, unusable data."""


def make_dir(path: Path) -> Path:
    """Create a folder the user named (run folder, output folder); failing is a user error."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create folder {path}: {exc.strerror}") from None
    return path
