"""`blockdraft eval`: real speculative decoding of an exported drafter against its target.

Reports tau (mean and per prompt), its histogram, acceptance per block position, tokens/s and
speedup against target-only decoding of the same prompts, for the single path and each DDTree budget.
"""

from __future__ import annotations

import argparse
import json

from blockdraft.errors import UserError, check_at_least


def add_arguments(p: argparse.ArgumentParser) -> None:
    from blockdraft.device import DEVICES

    p.add_argument("--target", required=True, help="the target model folder (Hugging Face format)")
    p.add_argument("--drafter", required=True, help="an exported drafter folder (config.json + model.safetensors)")
    p.add_argument("--prompts", required=True, nargs="+", help="prompt files: JSONL chats or raw text")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--limit", type=int, default=16, help="use at most this many prompts (default 16)")
    p.add_argument("--prompt-tokens", type=int, default=256,
                   help="prompt length cap in tokens (default 256, as eval.prompt_tokens in training)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: sampled (lossless)")
    p.add_argument("--batch-size", type=int, default=1,
                   help="greedy single path: decode this many prompts at once (pays on a GPU; default 1)")
    p.add_argument("--tree-budget", default="", help="DDTree node budgets, e.g. 16,32,64 (default: path only)")
    p.add_argument("--thinking", action="store_true", help="render chat prompts with thinking on")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (temperature > 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                   help="decode eagerly on a GPU too (default: each decoding step replays a CUDA graph)")
    p.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"], default="auto",
                   help="target weights (auto: bf16 on a GPU); float32 makes greedy outputs exactly comparable")


def parse_budgets(text: str) -> list[int]:
    try:
        budgets = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"--tree-budget must be comma-separated integers, got {text!r}") from None
    if any(b < 1 for b in budgets):
        raise UserError(f"--tree-budget values must be >= 1, got {text!r}")
    return budgets


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from blockdraft.config import EvalConfig
    from blockdraft.device import pick_device
    from blockdraft.evaluate.prompts import load_prompts
    from blockdraft.evaluate.runner import decoding_setup, evaluate
    from blockdraft.model.export import load_drafter
    from blockdraft.model.target import load_target, open_target, require_decodable

    budgets = parse_budgets(args.tree_budget)
    check_at_least(args, 1, "max_new_tokens", "limit", "prompt_tokens", "batch_size")
    check_at_least(args, 0, "temperature")
    device = pick_device(args.device)
    folder = open_target(args.target)  # prompts first: a bad set fails before the weights load
    require_decodable(folder.config.get_text_config(), "--target", tree=bool(budgets), sampled=args.temperature > 0)
    tokenizer = folder.tokenizer
    cfg = EvalConfig(prompts=args.prompts, max_prompts=args.limit, max_new_tokens=args.max_new_tokens,
                     prompt_tokens=args.prompt_tokens)
    prompts, skipped = load_prompts(args.prompts, tokenizer, cfg, thinking=args.thinking)
    drafter = load_drafter(args.drafter, device)
    target, _, _ = load_target(folder, drafter.target_layer_ids, device, args.dtype)
    drafter.to(target.embed_tokens.weight.dtype)
    results, target_tps = evaluate(target, drafter, prompts, args.max_new_tokens, tokenizer.eos_token_id, budgets,
                                   args.temperature, args.seed, args.batch_size,
                                   progress=None if args.quiet else _progress_printer(),
                                   cuda_graphs=args.cuda_graphs)
    path = results[0]
    batch, graphs = decoding_setup(target, args.batch_size, args.temperature, args.cuda_graphs)
    summary = {
        "tau": path.tau,
        "tau_hist": path.tau_hist,
        "prompts": len(prompts),
        "tokens": path.tokens,
        "speedup": path.speedup,
        "lossless": path.lossless,
        "temperature": args.temperature,
        "batch_size": batch,
        "block_size": drafter.block_size,
        "target_tokens_per_s": target_tps,
        "skipped_lines": skipped,
        "device": device.type,
        "cuda_graphs": graphs,
        "modes": [asdict(r) for r in results],
    }
    if args.json:
        print(json.dumps(summary))
    else:
        _print_tables(summary, results)
    return 0


def _progress_printer(every_s: float = 10.0):
    """Progress on stderr: at most one line every `every_s` seconds, and every mode's last line."""
    import sys
    import time

    last = [0.0]

    def report(line: str, final: bool) -> None:
        now = time.perf_counter()
        if final or now - last[0] >= every_s:
            last[0] = now
            print(f"eval: {line}", file=sys.stderr, flush=True)

    return report


def _print_tables(summary: dict, results) -> None:
    from rich.console import Console
    from rich.table import Column, Table

    def fmt(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
        return "n/a" if x is None else f"{x:{spec}}{suffix}"

    console = Console()
    t = Table("mode", "tau", "tokens", "tok/s", "speedup", "lossless", "tau per prompt",
              title=f"blockdraft eval: {summary['prompts']} prompts, T={summary['temperature']:g}, "
              f"B={summary['block_size']}, target-only {summary['target_tokens_per_s']:.1f} tok/s")
    names = ["path" if r.budget is None else f"tree {r.budget}" for r in results]
    for name, r in zip(names, results, strict=True):
        lossless = "-" if r.lossless is None else ("yes" if r.lossless else "NO")
        t.add_row(name, fmt(r.tau), str(r.tokens), fmt(r.tokens_per_s, ".1f"), fmt(r.speedup, ".2f", "x"), lossless,
                  " ".join(f"{x:.2f}" for x in r.per_prompt))
    console.print(t)
    taus = (Column(f"tau={k}", justify="right") for k in range(1, summary["block_size"] + 1))
    h = Table("mode", *taus, title="tau histogram (rounds) and acceptance per block position")
    for name, r in zip(names, results, strict=True):
        h.add_row(name, *map(str, r.tau_hist[1:]))
        h.add_row("  accepted", "", *(f"{a:.0%}" for a in r.accept_per_pos))
    console.print(h)
    if summary["skipped_lines"]:
        console.print(f"skipped prompt lines: {summary['skipped_lines']}")
