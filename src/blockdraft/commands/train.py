"""`blockdraft train CONFIG.yaml [key=value ...] [--resume]`, alone or under `torchrun` (one process per GPU)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML config (see configs/)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=3e-4 train.out_dir=runs/x")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    p.add_argument("--no-console", action="store_true", help="no live progress line (log.jsonl is unchanged)")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config (paths made absolute, every default filled in) and exit")


def run(args: argparse.Namespace) -> int:
    from blockdraft.config import dump_config, load_config

    cfg = load_config(args.config, args.overrides)
    if args.print_config:
        print(dump_config(cfg), end="")
        return 0
    from blockdraft.telemetry.trackers import require_trackers
    from blockdraft.train import distributed
    from blockdraft.train.loop import Trainer

    require_trackers(cfg.train.trackers)  # before minutes of model loading
    trainer = Trainer(cfg, resume=args.resume, show_console=not args.no_console)
    result = trainer.run()
    distributed.shutdown()  # after a clean run only: with a rank gone, it could wait for that rank
    if trainer.dp.is_main:
        print(f"{result.status} at step {result.last_step}: {result.run_dir}")
    return 0
