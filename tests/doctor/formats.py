"""Writers of the seed incident's log in the formats users bring: W&B CSV and history, TensorBoard,
and a Hugging Face trainer_state.json (its own per-step simulation: loss, lr, grad norm, epoch).

The W&B and TensorBoard logs hold what the seed pipeline sent there: the monitor's windowed records,
under a custom pipeline's `train/...` names (not HF Trainer's, whose `epoch` means something else)
and W&B's own `_step` counter.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from tests.doctor import seed_log
from tests.doctor.synthetic import Planted, _interleave

WANDB_KEYS = {
    "loss": "train/loss",
    "acc": "train/acc",
    "streak": "train/streak",
    "lr": "train/lr",
    "noise_std": "train/noise_std",
    "tok_s": "perf/tokens_per_sec",
    "epoch": "train/epoch",
    "epoch_progress": "train/epoch_progress",
}


def wandb_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One W&B history row per monitor record: W&B's own `_step` counter, the trainer's step as a metric."""
    t0 = records[0]["time"]
    rows = []
    for i, rec in enumerate(records):
        row: dict[str, Any] = {"_step": i, "_runtime": rec["time"] - t0, "_timestamp": rec["time"]}
        row["global_step"] = rec["step"]
        for ours, theirs in WANDB_KEYS.items():
            if ours in rec:
                row[theirs] = rec[ours]
        row["perf/prefetch_queue"] = sum(rec["q_pre"])
        rows.append(row)
    return rows


def write_wandb_csv(records: list[dict[str, Any]], path: Path, run_name: str = "orange-7ovseq19") -> Path:
    """A chart-panel style export: `Step`, then `RUN - metric` columns with __MIN/__MAX companions."""
    rows = wandb_rows(records)
    metrics = [k for k in rows[0] if not k.startswith("_")]
    header = ["Step"] + [f"{run_name} - {m}{suffix}" for m in metrics for suffix in ("", "__MIN", "__MAX")]
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        for row in rows:
            cells = [row["_step"]]
            for m in metrics:
                value = row.get(m, "")
                cells += [value, value, value]
            writer.writerow(cells)
    return path


def write_wandb_history(records: list[dict[str, Any]], folder: Path) -> Path:
    """`files/wandb-history.jsonl` inside a W&B run folder."""
    path = folder / "files" / "wandb-history.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in wandb_rows(records)))
    return path


def write_tensorboard(records: list[dict[str, Any]], folder: Path) -> Path:
    """Scalars as a SummaryWriter would write them: one event per tag and step, tagged `train/...`."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(folder))
    for rec in records:
        values = [
            summary_pb2.Summary.Value(tag=theirs, simple_value=float(rec[ours]))
            for ours, theirs in WANDB_KEYS.items()
            if ours in rec
        ]
        values.append(summary_pb2.Summary.Value(tag="perf/prefetch_queue", simple_value=float(sum(rec["q_pre"]))))
        event = event_pb2.Event(wall_time=rec["time"], step=rec["step"], summary=summary_pb2.Summary(value=values))
        writer.add_event(event)
    writer.close()
    return folder


def hf_state(seed: int = 0, clean: bool = False, n_steps: int = 3000) -> tuple[dict[str, Any], list[Planted]]:
    """A Trainer's trainer_state.json, logging_steps=1, for a run with the seed's batching and warmup bugs.

    Planted: one length bucket per batch drawn at random (loss levels), the first update at peak LR,
    and an `epoch` counted in micro-batches (grad_accum=4) so it advances 4x too fast for max_steps.
    """
    rng = np.random.default_rng(seed)
    k = np.arange(1, n_steps + 1)
    if clean:
        bucket = _interleave(rng, np.round(np.array(seed_log.SHARES) * n_steps).astype(int), n_steps)
    else:
        bucket = rng.choice(6, size=n_steps, p=seed_log.SHARES)
    level = np.array(seed_log.LEVELS)[bucket]
    loss = (0.6 + 6.0 * np.exp(-k / 200.0)) * level * np.exp(0.08 * rng.standard_normal(n_steps))
    epochs, per_epoch = 3, 4000
    max_steps = epochs * per_epoch
    warmup = math.ceil(0.05 * max_steps)
    lr = 2e-4 * np.where(
        k <= warmup, k / warmup, 0.5 * (1 + np.cos(np.pi * np.clip((k - warmup) / (max_steps - warmup), 0, 1)))
    )
    epoch = k / per_epoch
    planted = []
    if not clean:
        lr[0] = 2e-4
        epoch = 4 * k / per_epoch
        planted = [
            Planted("homogeneous_batches", (1, n_steps)),
            Planted("warmup_first_step", (1, 1)),
            Planted("epoch_accounting", (1, n_steps)),
        ]
    grad = 0.4 * level * rng.lognormal(0, 0.2, n_steps)
    history: list[dict[str, Any]] = [
        {
            "epoch": round(float(epoch[i]), 4),
            "grad_norm": float(grad[i]),
            "learning_rate": float(lr[i]),
            "loss": round(float(loss[i]), 4),
            "step": int(k[i]),
        }
        for i in range(n_steps)
    ]
    history.insert(n_steps // 2, {"epoch": float(epoch[n_steps // 2]), "eval_loss": 1.1, "step": n_steps // 2})
    state = {
        "best_metric": None,
        "epoch": float(epoch[-1]),
        "global_step": n_steps,
        "log_history": history,
        "logging_steps": 1,
        "max_steps": max_steps,
        "num_train_epochs": epochs,
        "save_steps": 500,
        "train_batch_size": 8,
    }
    return state, planted
