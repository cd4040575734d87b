"""`blockdraft data FILE... --target DIR`: inspect a dataset before a four-day run.

Reads and tokenises the files (filling the cache the run will use), then reports counts, skip
reasons with line numbers, the length histogram and the batch plan; `--json` prints one object.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from blockdraft.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="*", metavar="FILE", help="JSONL / JSON / Parquet files (default: the config's)")
    parser.add_argument("--target", required=True, metavar="DIR", help="target model folder (its tokenizer is used)")
    parser.add_argument("--config", metavar="YAML", help="take data settings from this training config")
    parser.add_argument("--format", choices=["auto", "messages", "conversations", "text"])
    parser.add_argument("--max-len", type=int, metavar="N")
    parser.add_argument("--overlong", choices=["truncate", "drop"])
    parser.add_argument(
        "--thinking",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="render chats with thinking on (enable_thinking)",
    )
    parser.add_argument("--tokens-per-batch", type=int, metavar="N", help="padded tokens per micro-batch")
    parser.add_argument("--buckets", metavar="auto|B1,B2,...", help="length bucket boundaries")
    parser.add_argument("--max-same-bucket-run", type=int, metavar="N")
    parser.add_argument("--no-interleave", action="store_true", help="plan the homogeneous order (ablation)")
    parser.add_argument("--cache-dir", metavar="DIR")
    parser.add_argument("--num-workers", type=int, metavar="N", help="tokeniser processes (0: one per core)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the planned order")
    parser.add_argument("--world-size", type=int, default=1, metavar="N", help="plan for N data-parallel ranks")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def _parse_buckets(text: str) -> list[int] | str:
    if text == "auto":
        return "auto"
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--buckets must be 'auto' or comma-separated integers, not {text!r}") from None


def data_config(args: argparse.Namespace) -> Any:
    """The config's data section (or the defaults) with the command-line flags on top."""
    from pydantic import ValidationError

    from blockdraft.config import DataConfig, load_config

    base = load_config(args.config, []).data if args.config else DataConfig()
    flags = {
        "format": args.format,
        "max_len": args.max_len,
        "overlong": args.overlong,
        "thinking": args.thinking,
        "tokens_per_batch": args.tokens_per_batch,
        "buckets": _parse_buckets(args.buckets) if args.buckets else None,
        "max_same_bucket_run": args.max_same_bucket_run,
        "interleave": False if args.no_interleave else None,
        "cache_dir": args.cache_dir,
        "num_workers": args.num_workers,
        "train_files": list(args.files) or None,
    }
    updates = {k: v for k, v in flags.items() if v is not None}
    try:
        return DataConfig.model_validate({**base.model_dump(), **updates})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UserError(f"data.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from blockdraft.data.batching import BatchSampler
    from blockdraft.data.cache import prepare_dataset
    from blockdraft.data.summary import data_summary, print_summary
    from blockdraft.data.tokenize import load_tokenizer

    if args.world_size < 1:
        raise UserError("--world-size must be at least 1")
    cfg = data_config(args)
    tokenizer = load_tokenizer(args.target)
    dataset, report = prepare_dataset(cfg, tokenizer)
    sampler = BatchSampler(dataset.lengths, cfg, seed=args.seed, rank=0, world_size=args.world_size)
    summary = data_summary(report, sampler)
    if args.json:
        print(json.dumps(summary))
    else:
        print_summary(summary, Console())
    return 0
