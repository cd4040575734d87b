"""Replay a run's step records through the step guard (train/guard.py) with chosen settings.

Why: a guard setting is chosen against healthy logs. This prints, for the loss and the grad norm, how far
each update stood from its bucket's window median (the guard's own ratio), and which updates the guard
would refuse with the settings given. Records are replayed in order, each under its largest bucket as
the trainer judges it, so a log's own skips are reproduced when its settings are given.

  python bench/guard_replay.py runs/demo/log.jsonl                          # the default settings
  python bench/guard_replay.py runs/demo/log.jsonl grad_norm_min_ratio=3    # one changed (guard. optional)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import ValidationError

from blockdraft.config import GuardConfig, config_error
from blockdraft.errors import UserError, exit_script
from blockdraft.telemetry.log import read_log
from blockdraft.train.guard import StepGuard

CUTS = (1.5, 2.0, 2.5, 3.0, 4.0, 5.0)


def replay(steps: list[dict], cfg: GuardConfig) -> tuple[dict[str, list[float]], list[tuple[int, str]]]:
    """Each update's loss and grad norm over its bucket's window median, and the updates refused."""
    guard, refused = StepGuard(cfg), []
    ratios: dict[str, list[float]] = {"loss": [], "grad_norm": []}
    for r in steps:
        bucket = int(max(r["buckets"]))  # the trainer judges an update by its largest bucket
        for name in ratios:
            if (med := guard.window_median(name, bucket)) is not None:
                ratios[name].append(r[name] / med)
        if reason := guard.check(bucket, r["loss"], r["grad_norm"]):
            refused.append((int(r["step"]), reason))
    return ratios, refused


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("settings", nargs="*", help="guard settings as key=value or guard.key=value")
    args = parser.parse_args()
    if not args.log.is_file():
        raise UserError(f"log not found: {args.log}")
    if bad := [s for s in args.settings if "=" not in s]:
        raise UserError(f"setting {bad[0]!r} is not of the form key=value")
    try:
        cfg = GuardConfig(**{key.removeprefix("guard."): value  # as in the config file or as an override
                             for key, value in (s.split("=", 1) for s in args.settings)})
    except ValidationError as exc:
        raise config_error(exc, "guard") from None
    steps = [r for r in read_log(args.log) if r.get("kind") == "step"]
    ratios, refused = replay(steps, cfg)
    print(f"{args.log}: {len(steps)} step records; ratio to the bucket window's median "
          f"({len(ratios['loss'])} updates with {cfg.min_history}+ values in their window)")
    for name, values in ratios.items():
        above = ", ".join(f">{c:g}x {sum(v > c for v in values)}" for c in CUTS)
        print(f"  {name}: largest {max(values, default=0):.2f}x; {above}")
    listed = ", ".join(f"{step} ({reason})" for step, reason in refused)
    print(f"refused with {' '.join(args.settings) or 'the defaults'}: {len(refused)} {listed}")
    return 0


if __name__ == "__main__":
    exit_script(main)
