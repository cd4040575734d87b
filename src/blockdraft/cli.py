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


def _available_verbs() -> dict[str, object]:
    """Verbs whose module exists; a verb still being built is simply not offered."""
    modules = {}
    for verb, (module_name, _) in VERBS.items():
        try:
            modules[verb] = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if not (exc.name and module_name.startswith(exc.name)):
                raise
    return modules


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, object]]:
    parser = argparse.ArgumentParser(prog="blockdraft", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"blockdraft {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    modules = _available_verbs()
    for verb, module in modules.items():
        p = sub.add_parser(verb, help=VERBS[verb][1], description=VERBS[verb][1])
        module.add_arguments(p)
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    # fewer fragmentation OOMs with varying batch shapes; read at the first CUDA allocation
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    parser, modules = build_parser()
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
