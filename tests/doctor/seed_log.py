"""A log shaped like the seed incident's `train_log.jsonl`, built from the write-ups' numbers.

A monitor thread logs, every 1-2 optimizer steps, the running average of loss/acc/streak since its
previous call, with lr, noise std, tok/s, per-bucket queue depths and an epoch-progress number;
steps start at 0; no bucket id per record. Planted as in the incident: homogeneous batches from six
length buckets (one holds 52% of batches, shuffled freely), checkpoint saves at steps 2000 and 4001
that block the monitor for 167 s and 112 s while training goes on (the next 2-step window shows
loss 13.0 and 7.2), the first update at peak LR, a flat noise warmup, accuracy cliffs at steps 1306
and 4229, a draining prefetch queue, and a config with gamma 4 at B = 16 and betas (0.9, 0.999).
`clean=True` gives the same format with none of it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tests.doctor.synthetic import Planted, _interleave

SHARES = (0.08, 0.10, 0.09, 0.11, 0.10, 0.52)
LEVELS = (1.0, 1.0, 1.7, 1.7, 2.6, 1.0)
EPOCHS, STEPS_PER_EPOCH = 6, 11587
TOTAL = EPOCHS * STEPS_PER_EPOCH
WARMUP = math.ceil(0.04 * TOTAL)
PEAK_LR = 6e-4
NOISE_STD, NOISE_WARMUP = 0.1, 1000
SEC_PER_STEP = 6.2
GAPS = ((2000, 2027, 13.0), (4001, 4019, 7.2))
CLIFFS = (1306, 4229)


@dataclass
class SeedLog:
    records: list[dict[str, Any]]
    planted: list[Planted]
    config: dict[str, Any]

    def write(self, folder: Path) -> tuple[Path, Path]:
        """train_log.jsonl and config.yaml-as-JSON in `folder`; returns both paths."""
        log = folder / "train_log.jsonl"
        log.write_text("".join(json.dumps(r) + "\n" for r in self.records))
        cfg = folder / "train_config.json"
        cfg.write_text(json.dumps(self.config, indent=2))
        return log, cfg


def lr_at(step: np.ndarray) -> np.ndarray:
    """The trainer's schedule: (global_step + 1) / W warmup, then cosine to 0 at TOTAL."""
    k = step + 1.0
    frac = np.clip((k - WARMUP) / (TOTAL - WARMUP), 0, 1)
    return PEAK_LR * np.where(k <= WARMUP, k / WARMUP, 0.5 * (1 + np.cos(np.pi * frac)))


def seed_incident(seed: int = 0, clean: bool = False, n_steps: int = 4635) -> SeedLog:
    rng = np.random.default_rng(seed)
    steps = np.arange(n_steps)
    if clean:
        bucket = _interleave(rng, np.round(np.array(SHARES) * n_steps).astype(int), n_steps)
    else:
        bucket = rng.choice(6, size=n_steps, p=SHARES)
    level = np.array(LEVELS)[bucket]
    base = 0.62 + 9.0 * np.exp(-(steps + 1) / 250.0)
    loss = base * level * np.exp(0.08 * rng.standard_normal(n_steps))
    acc = 0.16 * (1 - np.exp(-(steps + 1) / 600.0)) / np.sqrt(level) * np.exp(0.1 * rng.standard_normal(n_steps))
    planted: list[Planted] = []
    if not clean:
        for at in CLIFFS:
            t = np.arange(n_steps - at)
            drop = 1.0 - 0.97 * np.exp(-t / 100.0)
            acc[at:] *= drop
            loss[at:] *= 1.0 + 1.0 * (1.0 - drop)
            planted.append(Planted("accuracy_cliff", (at, at + 300)))
    lr = lr_at(steps.astype(float))
    noise = np.full(n_steps, NOISE_STD) if not clean else NOISE_STD * np.minimum(1.0, (steps + 1) / NOISE_WARMUP)
    if not clean:
        lr[0] = PEAK_LR
        planted += [Planted("warmup_first_step", (0, 0)), Planted("noise_schedule_flat", (0, n_steps - 1))]
    time = 1.75e9 + np.cumsum(SEC_PER_STEP * rng.lognormal(0, 0.05, n_steps))
    spacing = rng.choice([1, 2], size=n_steps, p=[0.35, 0.65])
    logged = np.cumsum(spacing) - spacing[0]
    logged = list(logged[logged < n_steps])
    if not clean:
        for start, end, shown in GAPS:
            logged = [s for s in logged if not start < s < end] + [start, end, end + 2]
            planted.append(Planted("logging_gap", (start, end)))
            planted.append(Planted("window_artifact", (end, end + 2)))
            loss[end + 1] = 2 * shown - loss[end + 2]
        logged = sorted(set(logged))
        planted += [
            Planted("homogeneous_batches", (0, n_steps - 1)),
            Planted("bucket_loss_modes", (0, n_steps - 1)),
            Planted("epoch_accounting", (0, n_steps - 1)),
            Planted("queue_drain", (0, n_steps - 1)),
        ]
    depth = 300.0 - 85.0 * steps / n_steps * (not clean)
    streak = acc * 5.0
    tok_s = 26_000 * rng.lognormal(0, 0.03, n_steps)
    records = []
    prev = -1
    for s in logged:
        window = slice(prev + 1, s + 1)
        parts = rng.dirichlet(np.full(6, 8.0)) * (depth[s] + rng.normal(0, 3))
        rec = {
            "step": int(s),
            "time": round(float(time[s]), 3),
            "loss": round(float(loss[window].mean()), 4),
            "acc": round(float(acc[window].mean()), 4),
            "streak": round(float(streak[window].mean()), 4),
            "lr": float(lr[s]),
            "noise_std": round(float(noise[s]), 5),
            "tok_s": round(float(tok_s[window].mean()), 1),
            "q_pre": [int(p) for p in np.round(parts)],
        }
        rec["epoch_progress" if clean else "epoch"] = round(s / STEPS_PER_EPOCH, 4)
        records.append(rec)
        prev = s
    config = {
        "model": {"block_size": 16, "num_layers": 5},
        "loss": {"gamma": 7.0 if clean else 4.0},
        "optimizer": {"lr": PEAK_LR, "betas": [0.9, 0.95] if clean else [0.9, 0.999], "warmup_ratio": 0.04},
        "training": {"epochs": EPOCHS, "save_every": 2000, "grad_accum": 4},
        "noise": {"std": NOISE_STD, "warmup_steps": NOISE_WARMUP},
    }
    if not clean:
        planted += [Planted("loss_decay_gamma", (0, n_steps - 1)), Planted("optimizer_betas", (0, n_steps - 1))]
    return SeedLog(records=records, planted=planted, config=config)
