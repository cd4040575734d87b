"""`blockdraft export CHECKPOINT --out DIR`: a checkpoint's drafter in serving format."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a checkpoint folder, or a run folder (its newest complete checkpoint)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")


def run(args: argparse.Namespace) -> int:
    import torch

    from blockdraft.model.export import save_drafter
    from blockdraft.train.checkpoint import load_checkpoint

    ckpt = load_checkpoint(args.checkpoint, with_training_state=False)
    out = save_drafter(ckpt.drafter_state, ckpt.drafter_config, args.out, getattr(torch, args.dtype))
    print(f"exported {ckpt.path.name} -> {out}")
    return 0
