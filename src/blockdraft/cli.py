"""The `blockdraft` command: one sub-command per verb of DESIGN.md.

Each verb lives in a small `command` module exposing `add_arguments(parser)` and `run(args) -> int`.
Those modules import heavy dependencies (torch, transformers) inside `run`, so `blockdraft doctor`
and `--help` start fast. A `UserError` anywhere becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from blockdraft import __version__
from blockdraft.errors import UserError

VERBS: dict[str, tuple[str, str]] = {
    "demo": ("blockdraft.demo", "train, export and evaluate a drafter for the bundled demo target"),
    "train": ("blockdraft.train.command", "train a drafter from a YAML config"),
    "eval": ("blockdraft.evaluate.command", "measure acceptance length with real speculative decoding"),
    "doctor": ("blockdraft.doctor.command", "diagnose a training run from its log"),
    "export": ("blockdraft.model.export_command", "write a checkpoint's drafter in serving format"),
    "data": ("blockdraft.data.command", "inspect a dataset: counts, skips, lengths, batch plan"),
    "regenerate": ("blockdraft.data.regenerate", "let the target rewrite assistant turns (on-policy data)"),
    "bench": ("blockdraft.bench.command", "throughput, MFU and memory on a target of a named shape"),
    "ckpt-scan": ("blockdraft.train.ckpt_scan", "NaN/Inf and statistics of every tensor in a checkpoint"),
}


def _verb_module(verb: str) -> object | None:
    """The verb's module, or None for a verb still being built (its module does not exist yet)."""
    module_name = VERBS[verb][0]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if not (exc.name and module_name.startswith(exc.name)):
            raise
    return None


def _chosen_verb(argv: list[str]) -> str | None:
    """The verb named on the command line: the first argument that is not an option."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in VERBS else None
    return None


def build_parser(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, dict[str, object]]:
    """Only the chosen verb's module is imported: `--help` and `doctor` must not pay for torch."""
    parser = argparse.ArgumentParser(prog="blockdraft", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"blockdraft {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    chosen = _chosen_verb(sys.argv[1:] if argv is None else argv)
    modules = {}
    for verb, (_, help_text) in VERBS.items():
        module = _verb_module(verb) if verb == chosen else None
        if verb == chosen and module is None:
            continue
        p = sub.add_parser(verb, help=help_text, description=help_text)
        if module is not None:
            module.add_arguments(p)
            modules[verb] = module
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    # fewer fragmentation OOMs with varying batch shapes; read at the first CUDA allocation
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    parser, modules = build_parser(argv)
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 2
    try:
        return int(modules[args.verb].run(args) or 0)
    except UserError as exc:
        print(f"blockdraft {args.verb}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"blockdraft {args.verb}: interrupted", file=sys.stderr)
        return 130
