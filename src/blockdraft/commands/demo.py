"""`blockdraft demo`: the embedded default, end to end, on the bundled demo target.

Writes the bundled corpus and held-out prompts (held-out stdlib files) into RUN/data, trains a
drafter within the time budget, checkpoints, exports to RUN/export, measures tau of the EXPORTED
drafter with real speculative decoding on held-out files (an `eval` record in RUN/log.jsonl), and
prints where everything is.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import time
from importlib import resources
from pathlib import Path

ASSETS = resources.files("blockdraft") / "assets"
# Updates per minute of budget with the demo config: 0.13-0.16 s an update on an idle 2-core CPU (measured
# with cost-balanced micro-batches, benchmarks/2026-12-01-cpu-demo.md); the GPU figure is a plan, not
# measured. The LR schedule is planned for this many updates; `train.max_minutes` re-plans it from the
# measured rate on a slower machine.
STEPS_PER_MINUTE = {"cpu": 360, "cuda": 500}
CHUNK_CHARS = 1500


def add_arguments(p: argparse.ArgumentParser) -> None:
    from blockdraft.device import DEVICES

    p.add_argument("--minutes", type=float, default=9.0,
                   help="training budget in minutes (default 9: with export and evaluation, 10 on a 2-core CPU)")
    p.add_argument("--out", default="runs/demo", help="run folder (default runs/demo)")
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. drafter.num_layers=1")


def write_corpus(data_dir: Path) -> tuple[Path, Path]:
    """train.jsonl: the bundled on-policy corpus (prompts from the drafter's stdlib files, the target's own
    continuations; scripts/make_demo_corpus.py); heldout.jsonl: chunks of held-out stdlib files (prompts)."""
    from blockdraft.corpus import stdlib_files, write_text_jsonl
    from blockdraft.errors import UserError, make_dir

    make_dir(data_dir)
    train, heldout = data_dir / "train.jsonl", data_dir / "heldout.jsonl"
    with gzip.open(str(ASSETS / "demo-corpus.jsonl.gz"), "rb") as src, train.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    held_files = stdlib_files("heldout")
    if not held_files:
        raise UserError("no Python standard-library source found for the demo's held-out prompts")
    step = max(1, len(held_files) // 32)
    write_text_jsonl(held_files[::step], heldout, CHUNK_CHARS)
    return train, heldout


def run(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    from blockdraft.config import load_config
    from blockdraft.device import pick_device
    from blockdraft.evaluate.prompts import load_prompts
    from blockdraft.evaluate.runner import evaluate as evaluate_modes
    from blockdraft.model.export import load_drafter, save_drafter
    from blockdraft.model.target import load_target
    from blockdraft.telemetry.log import RunLog, read_log
    from blockdraft.telemetry.step_record import TAU_EST_WINDOW, tau_est_over_window
    from blockdraft.train.checkpoint import load_checkpoint
    from blockdraft.train.loop import Trainer

    console = Console()
    out = Path(args.out).resolve()
    device = pick_device(args.device)
    t0 = time.time()
    train_file, heldout_file = write_corpus(out / "data")
    steps = max(20, int(args.minutes * STEPS_PER_MINUTE[device.type]))
    overrides = [
        f"target.path={ASSETS / 'demo-target'}",
        f"data.train_files=[{train_file}]",
        f"eval.prompts=[{heldout_file}]",
        f"train.out_dir={out}",
        f"train.device={device.type}",
        f"train.max_steps={steps}",
        f"train.max_minutes={args.minutes}",
        *args.overrides,
    ]
    cfg = load_config(Path(str(ASSETS / "demo.yaml")), overrides)
    console.print(f"[bold]blockdraft demo[/]: {steps} updates within {args.minutes:g} min on {device.type}; run {out}")
    result = Trainer(cfg, resume=False).run()

    ckpt = load_checkpoint(result.run_dir / "checkpoints", with_training_state=False)
    export_dir = save_drafter(ckpt.drafter_state, ckpt.drafter_config, out / "export", torch.float32)
    drafter = load_drafter(export_dir, device)
    target, tokenizer, _ = load_target(cfg.target.path, drafter.target_layer_ids, device, cfg.target.dtype)
    prompts = load_prompts(cfg.eval.prompts, tokenizer, cfg.eval)[0]
    (report,), _ = evaluate_modes(target, drafter, prompts, cfg.eval.max_new_tokens, tokenizer.eos_token_id, budgets=[],
                                  batch_size=cfg.eval.batch_size)
    steps_logged = [r for r in read_log(out / "log.jsonl") if r.get("kind") == "step"]
    log = RunLog(out / "log.jsonl")
    tau_est_train = tau_est_over_window(r.get("tau_est") for r in steps_logged[-TAU_EST_WINDOW:])
    log.write("eval", result.last_step, **report.eval_record(len(prompts), tau_est_train), source="export")
    log.close()

    table = Table(title="blockdraft demo", show_header=False)
    table.add_row("tau (held-out, greedy, exported drafter)", f"{report.tau:.2f} over {len(prompts)} prompts")
    table.add_row("output identical to target-only greedy", "yes" if report.lossless else "NO")
    table.add_row("speedup vs target-only decoding", f"{report.speedup:.2f}x" if report.speedup else "n/a")
    table.add_row("updates", f"{result.last_step} ({result.status})")
    table.add_row("wall time", f"{(time.time() - t0) / 60:.1f} min")
    table.add_row("run folder", str(out))
    table.add_row("log", str(out / "log.jsonl"))
    table.add_row("checkpoint", str(ckpt.path))
    table.add_row("export", str(export_dir))
    console.print(table)
    console.print("next: [bold]blockdraft doctor[/] " + str(out) + "   |   [bold]blockdraft eval[/] --target "
                  f"{ASSETS / 'demo-target'} --drafter {export_dir} --prompts {heldout_file}")
    return 0
