"""`blockdraft export CHECKPOINT --out DIR [--format dflash|speculators]`: a checkpoint's drafter in serving format."""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a checkpoint folder, or a run folder (its newest complete checkpoint)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--format", choices=["dflash", "speculators"], default="dflash",
                   help="dflash: z-lab/vLLM/SGLang folder; speculators: what `vllm serve DIR` serves bare")
    p.add_argument("--verifier", help="speculators: the target id or path to record (default: the run's target.path)")


def run(args: argparse.Namespace) -> int:
    import torch

    from blockdraft.model.export import save_drafter
    from blockdraft.train.checkpoint import load_checkpoint

    ckpt = load_checkpoint(args.checkpoint, with_training_state=False)
    dtype = getattr(torch, args.dtype)
    if args.format == "speculators":
        from blockdraft.model.export_speculators import save_speculators, unsaid, verifier_of

        name, archs = verifier_of(ckpt.path, args.verifier)
        out = save_speculators(ckpt.drafter_state, ckpt.drafter_config, args.out, dtype, name, archs)
        if lost := unsaid(ckpt.drafter_config):
            print(f"warning: {lost}", file=sys.stderr)
    else:
        out = save_drafter(ckpt.drafter_state, ckpt.drafter_config, args.out, dtype)
    print(f"exported {ckpt.path.name} -> {out}")
    return 0
