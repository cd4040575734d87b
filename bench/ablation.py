"""Training-objective ablation on the demo target: measured tau on held-out files, several seeds each.

Every run is `blockdraft demo` (same data, same number of updates, same held-out prompts) with one
variant's overrides and one seed; tau is what the demo measures with real speculative decoding of the
exported drafter (greedy, fp32 target). Runs go in parallel, spread over the visible GPUs (or run on
the CPU, slowly). Writes RUNS/results.jsonl (one line per run) and RUNS/summary.md (mean, spread).

  python bench/ablation.py --grid objective --seeds 0,1,2 --steps 400 --out /tmp/ablation --jobs 12
  python bench/ablation.py --grid demo --seeds 0,1 --steps 385 --out /tmp/ablation-demo

Grids (the overrides are config keys; see `blockdraft train --help` and README):
  objective  issue 10 at the published block size B=16: the recipe (exp_decay gamma 7, hard CE, no
             noise) against +KL soft labels, target argmax labels, streak weighting, noise injection,
             each of the seed pipeline's broken settings, and all of them together
  demo       the demo's own settings (B=8, 2 layers) against changes that might raise tau per update
  updates    the demo's settings at more updates than its CPU budget allows: how far tau goes with steps
  targets    candidate demo targets (vocabulary size; whether the target trained on the drafter's
             prompt files), each at the updates a 2-core CPU makes in the demo's budget with it. Each
             candidate is a folder under --targets made by scripts/make_demo_target.py, holding its
             corpus from scripts/make_demo_corpus.py as corpus.jsonl.gz; the grid fixes max_steps itself

The objective, demo and updates figures in benchmarks/ were measured with the first demo target (6.8M
parameters; in git history); run now, those grids use the bundled target.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

# Each variant states every setting it was measured with, so a changed default cannot change a row.
EXP = ["loss.weighting=exp_decay"]  # the default when these grids were run; streak won and is the default now
B16 = ["drafter.block_size=16", *EXP]
SEED_BROKEN = ["loss.gamma=4", "optim.betas=[0.9,0.999]", "data.interleave=false", "optim.warmup_steps=0"]


def candidate(name: str, steps: int) -> list[str]:
    """A candidate demo target under --targets, with its own on-policy corpus."""
    return [f"target.path={{targets}}/{name}", f"data.train_files=[{{targets}}/{name}/corpus.jsonl.gz]",
            f"train.max_steps={steps}"]


GRIDS: dict[str, dict[str, list[str]]] = {
    "objective": {
        "recipe": B16,
        "kl": [*B16, "loss.kl_weight=1.0"],
        "target_labels": [*B16, "loss.labels=target"],
        "streak": [*B16, "loss.weighting=streak"],
        "noise": [*B16, "noise.std=0.1", "noise.schedule=cosine", "noise.warmup_steps=20", "noise.final_std=0.0"],
        "gamma4": [*B16, "loss.gamma=4"],
        "beta2_0.999": [*B16, "optim.betas=[0.9,0.999]"],
        "homogeneous": [*B16, "data.interleave=false"],
        "peak_lr_first": [*B16, "optim.warmup_steps=0"],
        "seed_broken_all": [*B16, *SEED_BROKEN],
    },
    "demo": {
        "demo": EXP,
        "kl": [*EXP, "loss.kl_weight=1.0"],
        "target_labels": [*EXP, "loss.labels=target"],
        "lr_6e-3": [*EXP, "optim.lr=6e-3"],
        "anchors_64": [*EXP, "train.num_anchors=64"],
        "layers_3": [*EXP, "drafter.num_layers=3"],
        "streak": ["loss.weighting=streak"],
    },
    "updates": {
        "exp_385": EXP,
        "streak_385": ["loss.weighting=streak"],
        "streak_1000": ["loss.weighting=streak", "train.max_steps=1000"],
        "streak_2000": ["loss.weighting=streak", "train.max_steps=2000"],
        "exp_2000": [*EXP, "train.max_steps=2000"],
    },
    # updates: about 9 minutes of a 2-core CPU with that target and settings (README, "The demo target")
    "targets": {
        "v8192_train": candidate("v8192_train", 480),
        "v8192": candidate("v8192", 480),
        "v4096": candidate("v4096", 555),
        "v2048": candidate("v2048", 600),
        "v2048_a16": [*candidate("v2048", 790), "train.num_anchors=16"],
        "v2048_lr6e-3": [*candidate("v2048", 600), "optim.lr=6e-3"],
        "h128": candidate("v4096_h128", 1120),
        "h128_lr6e-3": [*candidate("v4096_h128", 1120), "optim.lr=6e-3"],
        "h128_l4": [*candidate("v4096_h128_l4", 1120), "drafter.target_layer_ids=[1,2,3]"],
        "h128_d3": [*candidate("v4096_h128", 870), "drafter.num_layers=3"],
        "h192": candidate("v4096_h192", 745),
        "l4_lr2e-3": [*candidate("v4096_h128_l4", 1120), "drafter.target_layer_ids=[1,2,3]", "optim.lr=2e-3"],
        "l4_lr1.5e-3": [*candidate("v4096_h128_l4", 1120), "drafter.target_layer_ids=[1,2,3]", "optim.lr=1.5e-3"],
        "l4_d3": [*candidate("v4096_h128_l4", 870), "drafter.target_layer_ids=[1,2,3]", "drafter.num_layers=3"],
        "l3": [*candidate("v4096_h128_l3", 1180), "drafter.target_layer_ids=[1,2]"],
        "l3_lr2e-3": [*candidate("v4096_h128_l3", 1180), "drafter.target_layer_ids=[1,2]", "optim.lr=2e-3"],
        "l3_lr1.5e-3": [*candidate("v4096_h128_l3", 1180), "drafter.target_layer_ids=[1,2]", "optim.lr=1.5e-3"],
    },
}


EVAL = ["target.dtype=float32", "eval.max_prompts=32", "eval.batch_size=8"]


def run_one(name: str, overrides: list[str], seed: int, args: argparse.Namespace, gpu: str | None) -> dict:
    out = args.out / f"{name}-s{seed}"
    cmd = [sys.executable, "-m", "blockdraft", "demo", "--out", str(out), "--minutes", "600",
           "--device", "cuda" if gpu is not None else "cpu",
           f"train.max_steps={args.steps}", f"train.seed={seed}", f"train.compile={args.compile}", *EVAL,
           *(o.format(targets=args.targets) for o in overrides)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    row = {"variant": name, "seed": seed, "overrides": overrides, "wall_s": time.time() - t0, "rc": proc.returncode}
    log = out / "log.jsonl"
    if proc.returncode != 0 or not log.exists():
        row["error"] = (proc.stderr or proc.stdout)[-600:]
        return row
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    steps = [r for r in records if r["kind"] == "step"]
    evals = [r for r in records if r["kind"] == "eval"]
    tail = steps[-20:]
    row.update(tau=evals[-1]["tau"], tau_hist=evals[-1]["tau_hist"], lossless=evals[-1]["lossless"],
               updates=steps[-1]["step"], loss_last20=statistics.mean(r["loss"] for r in tail),
               acc_last20=statistics.mean(r["acc"] for r in tail),
               tau_est_last20=statistics.mean(r["tau_est"] for r in tail),
               skipped=sum(bool(r.get("skipped")) for r in steps))
    return row


def summarize(rows: list[dict], grid: dict[str, list[str]]) -> str:
    lines = ["| variant | tau mean | tau std | tau min-max | seeds | train loss (last 20) | train acc | overrides |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, overrides in grid.items():
        ok = [r for r in rows if r["variant"] == name and "tau" in r]
        if not ok:
            lines.append(f"| {name} | failed | | | 0 | | | `{' '.join(overrides)}` |")
            continue
        taus = [r["tau"] for r in ok]
        std = statistics.stdev(taus) if len(taus) > 1 else 0.0
        lines.append(f"| {name} | {statistics.mean(taus):.3f} | {std:.3f} | {min(taus):.2f}-{max(taus):.2f} | "
                     f"{len(ok)} | {statistics.mean(r['loss_last20'] for r in ok):.3f} | "
                     f"{statistics.mean(r['acc_last20'] for r in ok):.3f} | `{' '.join(overrides) or '(defaults)'}` |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", choices=sorted(GRIDS), default="objective")
    ap.add_argument("--variants", default=None, help="comma-separated subset of the grid's variants")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=4, help="runs at once (they share the GPUs)")
    ap.add_argument("--gpus", default=None, help="GPU ids to spread runs over; default all visible, none on CPU")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads per run")
    ap.add_argument("--compile", default="false", choices=["false", "auto"], help="train.compile of each run")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    ap.add_argument("--targets", type=Path, default=None, help="folder of candidate demo targets (grid targets)")
    args = ap.parse_args()

    import torch

    grid = GRIDS[args.grid]
    if args.variants:
        grid = {k: grid[k] for k in args.variants.split(",")}
    gpus = args.gpus.split(",") if args.gpus else [str(i) for i in range(torch.cuda.device_count())]
    seeds = [int(s) for s in args.seeds.split(",")]
    jobs = [(name, overrides, seed) for seed in seeds for name, overrides in grid.items()]
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool, (args.out / "results.jsonl").open("a") as fh:
        futures = [pool.submit(run_one, n, o, s, args, gpus[i % len(gpus)] if gpus else None)
                   for i, (n, o, s) in enumerate(jobs)]
        for fut in concurrent.futures.as_completed(futures):
            row = fut.result()
            rows.append(row)
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            print(f"{row['variant']} seed {row['seed']}: tau {row.get('tau', 'FAILED')} ({row['wall_s']:.0f}s)",
                  flush=True)
    table = summarize(rows, grid)
    (args.out / "summary.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
