"""The `blockdraft` command: train, diagnose, evaluate and export DFlash drafters, one verb at a time.

Only the chosen verb's module is imported, so `--help` and `doctor` do not pay for torch. A
`UserError` anywhere becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from types import ModuleType

from blockdraft import __version__
from blockdraft.commands import VERBS
from blockdraft.errors import UserError


def build_parser(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, ModuleType | None]:
    """The parser, and the chosen verb's module (None when no verb is named)."""
    parser = argparse.ArgumentParser(prog="blockdraft", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"blockdraft {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    # the verb named on the command line: the first argument that is not an option
    chosen = next((arg for arg in (sys.argv[1:] if argv is None else argv) if not arg.startswith("-")), None)
    module = None
    for verb, (module_name, help_text) in VERBS.items():
        p = sub.add_parser(verb, help=help_text, description=help_text)
        if verb == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
    return parser, module


def parse_with_overrides(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """`parser.parse_args`, but dotted overrides (`key=value`) count wherever they stand: argparse ends a
    `nargs="*"` positional at the first option, so `a.b=1 --no-check c.d=2` would reject `c.d=2`."""
    args, extra = parser.parse_known_args(argv)
    takes_overrides = hasattr(args, "overrides")
    stray = [arg for arg in extra if not takes_overrides or arg.startswith("-") or "=" not in arg]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = [*(args.overrides or []), *extra]
    return args


def main(argv: list[str] | None = None) -> int:
    # fewer fragmentation OOMs with varying batch shapes; read at the first CUDA allocation
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    parser, module = build_parser(argv)
    args = parse_with_overrides(parser, argv)
    if args.verb is None or module is None:
        parser.print_help()
        return 2
    try:
        return int(module.run(args) or 0)
    except UserError as exc:
        print(f"blockdraft {args.verb}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"blockdraft {args.verb}: interrupted", file=sys.stderr)
        return 130
