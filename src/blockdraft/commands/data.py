"""`blockdraft data FILE... --target DIR_OR_ID`: inspect a dataset before a four-day run.

Tokenises the files into the cache the run will use, then reports counts, skips by line, lengths and
the batch plan of `--world-size` x `--grad-accum` micro-batches an update, cut by the run's own cost
model (the target's config.json, the config's drafter and anchors), as training cuts them.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from blockdraft.errors import UserError, check_at_least


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from blockdraft.config import DATA_FORMATS

    parser.add_argument("files", nargs="*", metavar="FILE", help="JSONL / JSON / Parquet files (default: the config's)")
    parser.add_argument("--target", required=True, metavar="DIR_OR_ID",
                        help="target model folder, or a hub id in the local cache (its tokenizer is used)")
    parser.add_argument("--config", metavar="YAML", help="take data settings from this training config")
    parser.add_argument("--format", choices=DATA_FORMATS)
    parser.add_argument("--max-len", type=int, metavar="N")
    parser.add_argument("--overlong", choices=["truncate", "drop"])
    parser.add_argument("--thinking", action=argparse.BooleanOptionalAction, default=None,
                        help="render chats with thinking on (enable_thinking)")
    parser.add_argument("--tokens-per-batch", type=int, metavar="N", help="padded tokens per micro-batch, at most")
    parser.add_argument("--batch-cost", choices=["flops", "tokens"], help="what a micro-batch's budget counts")
    parser.add_argument("--buckets", metavar="auto|B1,B2,...", help="length bucket boundaries")
    parser.add_argument("--max-same-bucket-run", type=int, metavar="N")
    parser.add_argument("--no-interleave", action="store_true", help="plan the homogeneous order (ablation)")
    parser.add_argument("--cache-dir", metavar="DIR")
    parser.add_argument("--num-workers", type=int, metavar="N", help="tokeniser processes (0: one per core)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the planned order")
    parser.add_argument("--world-size", type=int, default=1, metavar="N", help="plan for N data-parallel ranks")
    parser.add_argument("--grad-accum", type=int, metavar="A", help="micro-batches per rank and update (default: "
                        "the config's train.grad_accum)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def _parse_buckets(text: str) -> list[int] | str:
    if text == "auto":
        return "auto"
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--buckets must be 'auto' or comma-separated integers, not {text!r}") from None


def run_config(args: argparse.Namespace) -> Any:
    """The config (or the defaults for this target) with the command-line data flags on top."""
    from blockdraft.config import Config, build_config, load_config

    base = load_config(args.config, []) if args.config else Config.model_validate({"target": {"path": args.target}})
    same_name = ("format", "max_len", "overlong", "thinking", "tokens_per_batch", "batch_cost", "max_same_bucket_run",
                 "cache_dir", "num_workers")
    flags = {key: getattr(args, key) for key in same_name}
    flags.update(buckets=_parse_buckets(args.buckets) if args.buckets else None,
                 interleave=False if args.no_interleave else None, train_files=list(args.files) or None)
    raw = base.model_dump()
    raw["data"].update({k: v for k, v in flags.items() if v is not None})
    return build_config(raw)  # a bad flag is a config error: one line, exit 2


def _costs(cfg: Any, dataset: Any, target: str) -> tuple[Any, list[str]]:
    """The run's per-sample costs, and a note when the target folder cannot say them (no config.json:
    then the padded-token budget alone cuts the micro-batches)."""
    from pathlib import Path

    from blockdraft.data.cost import dataset_costs, token_costs

    if cfg.data.batch_cost == "tokens":
        return token_costs(dataset.lengths), []
    if not (Path(target) / "config.json").is_file():
        return token_costs(dataset.lengths), [
            f"{target} has no config.json: micro-batches planned by padded tokens, not by the run's cost model"]
    from transformers import AutoConfig

    hf_cfg = AutoConfig.from_pretrained(target).get_text_config()  # a multimodal config keeps the decoder's inside
    return dataset_costs(dataset, hf_cfg, cfg, cfg.drafter.tap_layers(hf_cfg.num_hidden_layers)), []


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from blockdraft.data.batching import BatchSampler
    from blockdraft.data.cache import prepare_dataset
    from blockdraft.data.summary import data_summary, print_summary
    from blockdraft.model.locate import locate_model
    from blockdraft.model.tokenizer import load_tokenizer

    check_at_least(args, 1, "world_size", "grad_accum")
    args.target = str(locate_model(args.target))  # a folder, or a hub id from the local cache
    cfg = run_config(args)
    tokenizer = load_tokenizer(args.target)
    dataset, report = prepare_dataset(cfg.data, tokenizer)
    costs, notes = _costs(cfg, dataset, args.target)
    accum = args.grad_accum or cfg.train.grad_accum
    sampler = BatchSampler(dataset.lengths, cfg.data, seed=args.seed, rank=0, world_size=args.world_size,
                           grad_accum=accum, costs=costs)
    summary = data_summary(report, sampler)
    summary["warnings"] = [*notes, *summary["warnings"]]
    if args.json:
        print(json.dumps(summary))
    else:
        print_summary(summary, Console())
    return 0
