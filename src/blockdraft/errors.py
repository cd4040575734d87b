"""The one exception type for mistakes a user can make (paths, config, data), and the checks that
raise it from more than one place: `make_dir`, `check_at_least`, `first_line`; `exit_script`, the same
single line for the scripts under bench/.

The CLI turns a UserError into a single line on stderr and exit code 2; anything else is a bug
and keeps its traceback.
"""

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn


class UserError(Exception):
    """A problem the user can fix: bad path, bad config value, unusable data."""


def make_dir(path: Path) -> Path:
    """Create a folder the user named (run folder, output folder); failing is a user error."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create folder {path}: {exc.strerror}") from None
    return path


def check_at_least(args: Any, minimum: float, *options: str) -> None:
    """A verb's numeric options (argparse names) below `minimum` are a user error naming the first one;
    an option left unset (None) passes."""
    for name in options:
        value = getattr(args, name)
        if value is not None and value < minimum:
            raise UserError(f"--{name.replace('_', '-')} must be at least {minimum:g}, got {value:g}")


def first_line(exc: BaseException) -> str:
    """What a one-line user error quotes of a library's exception: its first line, or its type when it
    says nothing (some loaders raise multi-line or empty messages)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def yaml_problem(exc: BaseException) -> str:
    """A YAML parser's error as one line, what is wrong and where: PyYAML's own message spans several."""
    problem = getattr(exc, "problem", None) or first_line(exc)
    mark = getattr(exc, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def exit_script(main: Callable[[], int]) -> NoReturn:
    """A bench script's entry point: exit with `main`'s code, or with one line on stderr and code 2 when it
    raises a UserError, as the CLI does."""
    try:
        code = main()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code)
