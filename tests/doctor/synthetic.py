"""Synthetic training logs with planted anomalies, to measure what the doctor finds and invents.

`generate(seed, anomalies=[...])` simulates one run (loss/acc curves per length bucket, LR and noise
schedules, timing, queue, checkpoints, evals, resumes) and plants each named anomaly at a random
place and size, recording where (`Planted`). Three styles: our own log.jsonl ("ours"), a foreign
per-step log with other field names and no run_start ("foreign"), and a foreign log of windowed
averages ("windowed", the seed incident's monitor). Used by the tests, the quality sweep and the bench.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from blockdraft.config import default_gamma
from blockdraft.data.interleave import interleave
from blockdraft.doctor.findings import CODES
from blockdraft.schedule import lr_curve

# every code can be planted; bucket_loss_modes comes with homogeneous_batches, never alone
ANOMALIES = tuple(code for code in CODES if code != "bucket_loss_modes")
FOREIGN_OK = (
    "loss_spike",
    "accuracy_cliff",
    "nonfinite",
    "logging_gap",
    "warmup_first_step",
    "plateau",
    "throughput_drift",
)
FOREIGN_MAP = "loss=train/loss,acc=train/acc,step=global_step,lr=train/lr"
BOUNDARIES = (0, 770, 1216, 1728, 2432, 3296, 8192)


@dataclass
class Planted:
    """Where an anomaly was planted and the least severity a correct doctor gives it."""

    code: str
    steps: tuple[int, int]
    severity: str = "warning"


@dataclass
class SyntheticRun:
    records: list[dict[str, Any]]
    planted: list[Planted]
    style: str
    mapping: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def lines(self) -> list[str]:
        return [json.dumps(r) for r in self.records]

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        with path.open("w") as fh:
            for line in self.lines():
                fh.write(line + "\n")
        return path


def generate(
    seed: int,
    anomalies: Sequence[str] = (),
    n_steps: int | None = None,
    style: str | None = None,
) -> SyntheticRun:
    """One synthetic run; `anomalies` lists the codes to plant (empty: a clean run)."""
    for name in anomalies:
        if name not in ANOMALIES:
            raise ValueError(f"unknown anomaly {name!r}")
    rng = np.random.default_rng(seed)
    if style is None:
        if "window_artifact" in anomalies:
            style = "windowed"
        elif anomalies and all(a in FOREIGN_OK for a in anomalies) and rng.random() < 0.25:
            style = "foreign"
        elif not anomalies and rng.random() < 0.2:
            style = str(rng.choice(["foreign", "windowed"]))
        else:
            style = "ours"
    sim = _Sim(rng, n_steps or int(rng.integers(2500, 9000)), style, set(anomalies))
    first, last = ("homogeneous_batches",), ("plateau",)
    ordered = sorted(anomalies, key=lambda a: (a not in first, a in last))
    for name in ordered:
        getattr(sim, f"plant_{name}")()
    return sim.emit()


class _Sim:
    """Arrays of one run, built clean first and then altered by the plant_* methods."""

    def __init__(self, rng: np.random.Generator, n: int, style: str, anomalies: set[str]) -> None:
        self.rng, self.n, self.style, self.anomalies = rng, n, style, anomalies
        self.planted: list[Planted] = []
        self.k = np.arange(1, n + 1)
        self.block_size = int(rng.choice([8, 16, 16]))
        self.mb = int(rng.choice([1, 1, 1, 2, 4]))
        self.total = n if rng.random() < 0.7 else int(n * rng.uniform(1.1, 3.0))
        self.epochs = int(rng.choice([1, 2, 3, 6]))
        self.steps_per_epoch = max(50, self.total // self.epochs)
        self.lr_peak = float(rng.choice([2e-4, 3e-4, 6e-4, 1e-3]))
        self.warmup = max(1, math.ceil(float(rng.uniform(0.01, 0.05)) * self.total))
        self.schedule = str(rng.choice(["cosine", "cosine", "constant", "linear"]))
        self.min_lr_ratio = float(rng.choice([0.0, 0.1]))
        self.noise = {"std": 0.0, "warmup_steps": 0, "schedule": "constant", "final_std": 0.0}
        if rng.random() < 0.5:
            self.noise = {
                "std": float(rng.uniform(0.02, 0.2)),
                "warmup_steps": int(rng.integers(0, 500)),
                "schedule": str(rng.choice(["constant", "cosine"])),
                "final_std": 0.0,
            }
        self.betas = [0.9, float(rng.choice([0.95, 0.98, 0.99]))]
        self.gamma: float | None = None if rng.random() < 0.6 else default_gamma(self.block_size)
        self.save_every = int(rng.choice([250, 500, 1000, 2000]))
        self.eval_every = int(rng.choice([0, 500, 1000]))
        self.prefetch = int(rng.choice([4, 8, 32, 300]))
        self.grad_clip = 1.0
        self._buckets()
        self._curves()
        self._timing()
        self.missing = np.zeros(n, dtype=bool)
        self.skipped = np.zeros(n, dtype=bool)
        self.skip_reason: dict[int, str] = {}
        self.ckpt_stall = {int(s): float(rng.uniform(0.05, 1.5)) for s in range(self.save_every, n, self.save_every)}
        self.ckpt_logging_only: set[int] = set()
        self.tau_factor = float(rng.uniform(0.9, 1.05))
        self.resume_at: int | None = None
        if style == "ours" and rng.random() < 0.25 and n > 3 * self.save_every:
            self.resume_at = int(rng.integers(2 * self.save_every, n - self.save_every))
        self.window = int(rng.integers(5, 20)) if style == "windowed" else 1
        self.artifacts: list[int] = []
        self.graphs: np.ndarray | None = None  # graphs_compiled, when a plant logs it

    # ---- clean run -------------------------------------------------------------------------
    def _buckets(self) -> None:
        rng = self.rng
        self.n_buckets = int(rng.integers(3, 7))
        shares = rng.dirichlet(np.full(self.n_buckets, 3.0))
        shares = np.minimum(shares, 0.55)
        self.shares = shares / shares.sum()
        total = self.n * self.mb
        counts = np.maximum(1, np.round(self.shares * total).astype(int))
        self.bucket_seq = _interleave(rng, counts, total)
        self.bucket_loss = rng.uniform(0.85, 1.25, self.n_buckets)
        self.bucket_acc = 1.0 / np.sqrt(self.bucket_loss)

    def _step_buckets(self) -> np.ndarray:
        return self.bucket_seq.reshape(self.n, self.mb)

    def _curves(self) -> None:
        rng, n, k = self.rng, self.n, self.k
        self.l0 = float(rng.uniform(6.0, 10.0))
        self.l_inf = float(rng.uniform(0.5, 2.0))
        tau = float(rng.uniform(0.05, 0.3)) * n
        self.base_loss = self.l_inf + (self.l0 - self.l_inf) * np.exp(-k / tau) + 0.3 * self.l_inf * np.exp(-k / n)
        self.a_max = float(rng.uniform(0.12, 0.6))
        self.base_acc = self.a_max * (1.0 - np.exp(-k / (tau * 1.3)))
        self.sigma = float(rng.uniform(0.03, 0.12))
        df = float(rng.choice([6.0, 10.0, 30.0]))
        eps = np.clip(rng.standard_t(df, size=n) * math.sqrt((df - 2) / df), -5.0, 5.0)
        eta = rng.standard_normal(n)
        self.loss_noise = self.sigma * eps
        self.acc_noise = self.sigma * (-0.6 * eps + 0.8 * eta)
        self.loss_mult = np.ones(n)
        self.acc_mult = np.ones(n)
        self.grad = 0.3 + 2.5 * np.exp(-k / (0.3 * tau)) * rng.lognormal(0, 0.3, n)
        self.grad *= rng.lognormal(0, 0.15, n)

    def _timing(self) -> None:
        rng, n = self.rng, self.n
        steps_b = self._step_buckets()
        lo = np.array(BOUNDARIES[:-1])[steps_b % 6]
        hi = np.array(BOUNDARIES[1:])[steps_b % 6]
        self.seq_len = (lo + (hi - lo) * rng.uniform(0.5, 1.0, steps_b.shape)).max(axis=1).astype(int)
        self.base_step_time = float(rng.choice([0.2, 0.5, 1.0, 10.0]))
        self.step_time = self.base_step_time * (0.6 + 0.4 * self.seq_len / 8192) * rng.lognormal(0, 0.05, n)
        self.data_wait = self.step_time * rng.exponential(0.005, n)
        self.extra_gap = np.zeros(n)
        self.tokens = (12288 * self.mb * rng.uniform(0.85, 0.98, n)).astype(int)
        depth = self.prefetch - rng.poisson(0.3 if self.prefetch <= 8 else 0.02 * self.prefetch, n)
        self.queue = np.clip(depth, 0, self.prefetch).astype(float)

    def lr_expected(self, k: np.ndarray) -> np.ndarray:
        return lr_curve(k, self.lr_peak, self.warmup, self.total, self.schedule, self.min_lr_ratio)

    def noise_expected(self, k: np.ndarray) -> np.ndarray:
        cfg = self.noise
        std, final, warm = cfg["std"], cfg["final_std"], cfg["warmup_steps"]
        out = np.full(len(k), std, dtype=float)
        if cfg["schedule"] == "cosine":
            frac = np.clip((k - warm) / max(1, self.total - warm), 0, 1)
            out = final + (std - final) * 0.5 * (1 + np.cos(np.pi * frac))
        if warm:
            out = np.where(k <= warm, std * k / warm, out)
        return out

    # ---- plants ----------------------------------------------------------------------------
    def _where(self, lo: float = 0.1, hi: float = 0.9) -> int:
        return int(self.rng.integers(int(lo * self.n), int(hi * self.n)))

    def plant_loss_spike(self, count: int | None = None) -> None:
        rng = self.rng
        count = count or int(rng.integers(1, 6))
        at = np.sort(rng.choice(np.arange(int(0.05 * self.n), int(0.95 * self.n)), size=count, replace=False))
        for s in at:
            factor = float(rng.uniform(2.5, 15.0))
            self.loss_mult[s] *= factor
            self.acc_mult[s] *= float(rng.uniform(0.3, 0.8))
            self.grad[s] *= factor * float(rng.uniform(1, 3))
        self.planted.append(Planted("loss_spike", (int(at[0]) + 1, int(at[-1]) + 1), "info"))

    def plant_accuracy_cliff(self) -> None:
        rng = self.rng
        s = self._where(0.2, 0.75)
        depth = float(rng.uniform(0.02, 0.3))
        recover = int(rng.integers(150, 600))
        t = np.arange(self.n - s)
        drop = 1.0 - (1.0 - depth) * np.exp(-t / (recover / 3.0))
        self.acc_mult[s:] *= drop
        self.loss_mult[s:] *= 1.0 + float(rng.uniform(0.5, 1.5)) * (1.0 - drop)
        self.planted.append(Planted("accuracy_cliff", (s + 1, min(self.n, s + recover)), "warning"))

    def plant_nonfinite(self) -> None:
        rng = self.rng
        at = np.sort(rng.choice(np.arange(int(0.05 * self.n), self.n - 1), size=int(rng.integers(1, 4)), replace=False))
        guarded = rng.random() < 0.5 and self.style == "ours"
        for s in at:
            self.loss_mult[s] = math.nan if rng.random() < 0.5 else math.inf
            self.grad[s] = math.nan
            if guarded:
                self.skipped[s] = True
                self.skip_reason[int(s)] = "nonfinite loss"
        self.planted.append(Planted("nonfinite", (int(at[0]) + 1, int(at[-1]) + 1), "warning"))

    def plant_skipped_steps(self) -> None:
        rng = self.rng
        s = self._where()
        m = int(rng.integers(5, 40))
        idx = s + np.sort(rng.choice(np.arange(3 * m), size=m, replace=False))
        idx = idx[idx < self.n]
        self.skipped[idx] = True
        for i in idx:
            self.skip_reason[int(i)] = "loss spike"
        self.planted.append(Planted("skipped_steps", (int(idx[0]) + 1, int(idx[-1]) + 1), "warning"))

    def plant_checkpoint_stall(self) -> None:
        rng = self.rng
        stalled = [s for s in self.ckpt_stall if rng.random() < 0.7 and s < self.n - 100] or [
            s for s in self.ckpt_stall if s < self.n - 100
        ][:1]
        if not stalled:
            s = self._where()
            self.ckpt_stall[s] = 0.5
            stalled = [s]
        logging_only = rng.random() < 0.4
        for s in stalled:
            seconds = float(rng.uniform(10, 30)) * self.base_step_time + float(rng.uniform(15, 60))
            self.ckpt_stall[s] = 0.0 if logging_only else seconds
            if logging_only:
                lost = min(max(3, int(seconds / np.median(self.step_time))), self.n - s - 50)
                self.missing[s : s + lost] = True
                self.ckpt_logging_only.add(s)
            else:
                self.extra_gap[s] += seconds
        self.planted.append(Planted("checkpoint_stall", (min(stalled), max(stalled) + 1), "warning"))

    def plant_logging_gap(self) -> None:
        rng = self.rng
        s = self._where()
        while any(abs(s - c) < 5 for c in self.ckpt_stall):
            s = self._where()
        if rng.random() < 0.5:
            m = int(rng.integers(10, 200))
            self.missing[s : s + m] = True
            self.planted.append(Planted("logging_gap", (s, s + m + 1), "warning"))
        else:
            self.extra_gap[s] += float(rng.uniform(300, 900)) + 100 * self.base_step_time
            self.planted.append(Planted("logging_gap", (s, s + 1), "warning"))

    def plant_window_artifact(self) -> None:
        s = self._where(0.3, 0.8)
        self.artifacts.append(s)
        self.planted.append(Planted("window_artifact", (s, s), "warning"))

    def plant_homogeneous_batches(self) -> None:
        rng = self.rng
        self.mb = 1
        shares = self.shares.copy()
        shares[np.argmax(shares)] += float(rng.uniform(0.2, 0.5))
        self.shares = shares / shares.sum()
        if rng.random() < 0.6:
            self.bucket_seq = rng.choice(self.n_buckets, size=self.n, p=self.shares)
        else:
            runs = []
            while sum(len(r) for r in runs) < self.n:
                runs.append(np.full(int(rng.integers(10, 200)), rng.choice(self.n_buckets, p=self.shares)))
            self.bucket_seq = np.concatenate(runs)[: self.n]
        self.bucket_loss = np.sort(rng.uniform(0.6, 1.8, self.n_buckets))
        self.bucket_acc = 1.0 / np.sqrt(self.bucket_loss)
        self._timing()
        self.planted.append(Planted("homogeneous_batches", (1, self.n), "warning"))
        self.planted.append(Planted("bucket_loss_modes", (1, self.n), "warning"))

    def plant_warmup_first_step(self) -> None:
        self.lr_variant = "peak_first" if self.rng.random() < 0.7 else "zero_first"
        self.warmup = max(self.warmup, 20)
        self.planted.append(Planted("warmup_first_step", (1, 1), "warning"))

    def plant_lr_schedule_mismatch(self) -> None:
        variants = ["long_warmup", "constant", "reset"] if self.style == "ours" else ["reset"]
        self.lr_mismatch = str(self.rng.choice(variants))
        if self.lr_mismatch == "constant" and self.schedule == "constant":
            self.schedule = "cosine"
        if self.lr_mismatch == "reset":
            self.lr_reset_at = self._where(0.3, 0.8)
            self.planted.append(Planted("lr_schedule_mismatch", (self.lr_reset_at + 1, self.lr_reset_at + 1)))
        else:
            self.planted.append(Planted("lr_schedule_mismatch", (1, self.n)))

    def plant_noise_schedule_flat(self) -> None:
        rng = self.rng
        self.noise = {
            "std": float(rng.uniform(0.05, 0.2)),
            "warmup_steps": int(rng.integers(200, 1000)),
            "schedule": str(rng.choice(["constant", "cosine"])),
            "final_std": 0.0,
        }
        self.noise_flat = True
        self.planted.append(Planted("noise_schedule_flat", (1, self.n)))

    def plant_optimizer_betas(self) -> None:
        self.betas = [0.9, 0.999]
        self.plant_loss_spike(count=int(self.rng.integers(3, 8)))
        self.planted.append(Planted("optimizer_betas", (1, self.n)))

    def plant_loss_decay_gamma(self) -> None:
        self.gamma = 4.0 if self.block_size == 16 else 7.0
        self.planted.append(Planted("loss_decay_gamma", (1, self.n)))

    def plant_late_recompile(self) -> None:
        """Graphs compiled long after warm-up (a new shape reached the compiled forward): ~30 s stalls."""
        at = np.sort(self.rng.choice(np.arange(int(0.3 * self.n), int(0.9 * self.n)), 3, replace=False))
        grow = np.zeros(self.n)
        grow[:5] = 2.0  # warm-up compiles
        grow[at] = 1.0
        self.graphs = np.cumsum(grow)
        self.step_time[at] += 30.0
        self.planted.append(Planted("late_recompile", (int(at[0]) + 1, int(at[-1]) + 1), "warning"))

    def plant_queue_drain(self) -> None:
        rng = self.rng
        self.prefetch = int(rng.choice([8, 32, 300]))
        end = float(rng.uniform(0.0, 0.45))
        level = self.prefetch * (1.0 - (1.0 - end) * self.k / self.n)
        self.queue = np.clip(np.round(level - rng.poisson(0.2, self.n)), 0, self.prefetch)
        self.planted.append(Planted("queue_drain", (1, self.n), "info"))

    def plant_data_wait(self) -> None:
        rng = self.rng
        s = self._where(0.0, 0.6)
        e = min(self.n, s + int(self.n * rng.uniform(0.15, 0.4)))
        share = float(rng.uniform(0.2, 0.6))
        wait = self.step_time[s:e] * share / (1 - share)
        self.data_wait[s:e] += wait
        self.step_time[s:e] += wait
        self.queue[s:e] = np.minimum(self.queue[s:e], rng.integers(0, 2, e - s))
        self.planted.append(Planted("data_wait", (s + 1, e)))

    def plant_throughput_drift(self) -> None:
        slow = float(self.rng.uniform(0.3, 1.0))
        self.step_time *= 1.0 + slow * self.k / self.n
        self.planted.append(Planted("throughput_drift", (1, self.n)))

    def plant_epoch_accounting(self) -> None:
        self.epochs = max(self.epochs, 3)
        self.steps_per_epoch = max(50, self.total // self.epochs)
        self.epoch_bug = str(self.rng.choice(["progress_of_run", "micro_batches"]))
        self.planted.append(Planted("epoch_accounting", (1, self.n)))

    def plant_plateau(self) -> None:
        s = self._where(0.15, 0.35)
        self.base_loss[s:] = self.base_loss[s]
        self.base_acc[s:] = self.base_acc[s]
        self.schedule = "constant"
        self.planted.append(Planted("plateau", (s + 1, self.n), "info"))

    def plant_data_repetition(self) -> None:
        self.epochs = int(self.rng.integers(12, 30))
        self.steps_per_epoch = max(10, self.total // self.epochs)
        self.planted.append(Planted("data_repetition", (1, self.n)))

    def plant_tau_gap(self) -> None:
        self.eval_every = self.eval_every or 500
        self.tau_factor = float(self.rng.uniform(0.45, 0.72))
        self.planted.append(Planted("tau_gap", (self.eval_every, self.n)))

    # ---- output ----------------------------------------------------------------------------
    def _lr(self) -> np.ndarray:
        k = self.k
        variant = getattr(self, "lr_mismatch", None)
        if variant == "long_warmup":
            lr = lr_curve(
                k,
                self.lr_peak,
                self.warmup * int(self.rng.integers(5, 9)),
                self.total,
                self.schedule,
                self.min_lr_ratio,
            )
        elif variant == "constant":
            lr = lr_curve(k, self.lr_peak, self.warmup, self.total, "constant", 0.0)
        else:
            lr = self.lr_expected(k)
        if variant == "reset":
            s = self.lr_reset_at
            lr[s:] = lr_curve(k[s:] - s, self.lr_peak, self.warmup, self.total, self.schedule, self.min_lr_ratio)
        first = getattr(self, "lr_variant", None)
        if first == "peak_first":
            lr[1:] = self.lr_expected(k[1:] - 1)
            lr[0] = self.lr_peak
        elif first == "zero_first":
            lr = self.lr_expected(k - 1)
        return lr

    def _epochs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        k, spe = self.k, self.steps_per_epoch
        epoch = (k - 1) // spe
        epoch_progress = (k - epoch * spe) / spe
        progress = k / self.total
        bug = getattr(self, "epoch_bug", None)
        if bug == "progress_of_run":
            epoch_progress = progress.copy()
        elif bug == "micro_batches":
            fake = self.mb * 4
            epoch = (k * fake - 1) // spe
            epoch_progress = (k * fake - epoch * spe) / spe
        return epoch, epoch_progress, progress

    def emit(self) -> SyntheticRun:
        rng, n = self.rng, self.n
        steps_b = self._step_buckets()
        bl = self.bucket_loss[steps_b].mean(axis=1)
        ba = self.bucket_acc[steps_b].mean(axis=1)
        loss = self.base_loss * bl * np.exp(self.loss_noise) * self.loss_mult
        acc = np.clip(self.base_acc * ba * np.exp(self.acc_noise) * np.nan_to_num(self.acc_mult, nan=1.0), 0, 0.99)
        lr = self._lr()
        noise = self.noise_expected(self.k)
        if getattr(self, "noise_flat", False):
            noise = np.full(n, self.noise["std"])
        epoch, epoch_progress, progress = self._epochs()
        time = 1.7e9 + np.cumsum(self.step_time + self.extra_gap)
        evals = {}
        if self.eval_every:
            for s in range(self.eval_every, n + 1, self.eval_every):
                pause = float(rng.uniform(5, 60))
                time[s:] += pause
                evals[s] = pause
        for s, stall in self.ckpt_stall.items():
            if s not in self.ckpt_logging_only:
                time[s:] += min(stall, 1.5)
        tok_s = self.tokens / self.step_time
        records: list[dict[str, Any]] = [self._run_start(time[0] - 5.0)]
        pos_w = 0.92 ** np.arange(self.block_size - 1)
        pos_w = pos_w / pos_w.mean()
        grad = self.grad
        lists = {
            name: arr.tolist()
            for name, arr in {
                "lr": lr,
                "loss": loss,
                "acc": acc,
                "grad": grad,
                "noise": noise,
                "epoch": epoch,
                "ep": epoch_progress,
                "progress": progress,
                "time": time,
                "st": self.step_time,
                "dw": self.data_wait,
                "queue": self.queue,
                "tokens": self.tokens,
                "tps": tok_s,
                "seq": self.seq_len,
            }.items()
        }
        buckets = steps_b.tolist()
        resume_from = None
        i = 0
        while i < n:
            step = i + 1
            if self.resume_at is not None and step == self.resume_at and resume_from is None:
                resume_from = (step // self.save_every) * self.save_every
                records.append(
                    {
                        "kind": "run_end",
                        "time": lists["time"][i - 1] + 1,
                        "step": i,
                        "status": "interrupted",
                        "reason": "preempted",
                    }
                )
                start = self._run_start(lists["time"][i] + 600.0)
                start["resumed_from"] = resume_from
                records.append(start)
                shift = 600.0 + (i - resume_from) * float(np.median(self.step_time))
                for name in ("time",):
                    lists[name] = [t + shift if j >= resume_from else t for j, t in enumerate(lists[name])]
                i = resume_from
                continue
            if not self.missing[i]:
                records.append(self._step_record(i, step, lists, buckets[i], pos_w))
            if step in self.ckpt_stall:
                records.append(
                    {
                        "kind": "checkpoint",
                        "time": lists["time"][i] + 0.5,
                        "step": step,
                        "path": f"checkpoints/step-{step:06d}",
                        "stall_s": self.ckpt_stall[step],
                        "write_s": float(rng.uniform(2, 30)),
                        "bytes": 123456789,
                        "committed": True,
                    }
                )
            if step in evals:
                tau_est = 1.0 + float(np.mean(self._streak(np.array(lists["acc"][max(0, i - 50) : i + 1]))))
                records.append(
                    {
                        "kind": "eval",
                        "time": lists["time"][i] + evals[step],
                        "step": step,
                        "tau": tau_est * self.tau_factor * float(rng.uniform(0.97, 1.03)),
                        "tau_hist": [],
                        "prompts": 16,
                        "mode": "path",
                        "budget": None,
                        "tau_est_train": tau_est,
                    }
                )
            i += 1
        records.append(
            {
                "kind": "run_end",
                "time": lists["time"][-1] + 1,
                "step": n,
                "status": "completed" if self.total == n else "interrupted",
                "reason": None,
            }
        )
        if self.style == "windowed":
            records = self._windowed(records)
        elif self.style == "foreign":
            records = self._foreign(records)
        mapping = FOREIGN_MAP if self.style != "ours" else None
        return SyntheticRun(records=records, planted=self.planted, style=self.style, mapping=mapping)

    def _streak(self, acc: np.ndarray) -> np.ndarray:
        p = np.clip(acc[:, None] * 1.6 * (0.95 ** np.arange(self.block_size - 1))[None, :], 0, 0.97)
        return np.cumprod(p, axis=1).sum(axis=1)

    def _step_record(self, i: int, step: int, lists: dict[str, list], buckets: list[int], pos_w: np.ndarray) -> dict:
        acc = lists["acc"][i]
        streak = float(self._streak(np.array([acc]))[0]) if math.isfinite(acc) else None
        skipped = bool(self.skipped[i])
        return {
            "kind": "step",
            "time": lists["time"][i],
            "step": step,
            "lr": lists["lr"][i],
            "loss": lists["loss"][i],
            "loss_tokens": int(lists["tokens"][i] * 0.6),
            "acc": acc,
            "acc_per_pos": [round(acc * w, 5) for w in pos_w.tolist()],
            "streak": streak,
            "tau_est": None if streak is None else 1.0 + streak,
            "grad_norm": lists["grad"][i],
            "clipped": bool(lists["grad"][i] > self.grad_clip),
            "skipped": skipped,
            "skip_reason": self.skip_reason.get(i) if skipped else None,
            "noise_std": lists["noise"][i],
            "epoch": int(lists["epoch"][i]),
            "epoch_progress": lists["ep"][i],
            "progress": lists["progress"][i],
            "samples": 8,
            "tokens": int(lists["tokens"][i]),
            "pad_frac": 0.05,
            "buckets": buckets,
            "seq_len_max": int(lists["seq"][i]),
            "anchors": 512,
            "step_time": lists["st"][i],
            "data_wait": lists["dw"][i],
            "queue_depth": int(lists["queue"][i]),
            "tok_per_s": lists["tps"][i],
            "mfu": None,
            "mem_gb": None,
            **({"graphs_compiled": int(self.graphs[i])} if self.graphs is not None else {}),
        }

    def _run_start(self, time: float) -> dict[str, Any]:
        config = {
            "target": {"path": "synthetic/target", "dtype": "auto"},
            "drafter": {
                "num_layers": 5,
                "block_size": self.block_size,
                "target_layer_ids": None,
                "num_taps": 5,
                "mask_token_id": None,
                "intermediate_size": None,
            },
            "data": {
                "max_len": 8192,
                "buckets": list(BOUNDARIES),
                "tokens_per_batch": 12288,
                "max_same_bucket_run": 3,
                "interleave": "homogeneous_batches" not in self.anomalies,
                "prefetch_depth": self.prefetch,
            },
            "loss": {
                "weighting": "exp_decay",
                "gamma": self.gamma,
                "streak_floor": 0.05,
                "labels": "data",
                "kl_weight": 0.0,
                "kl_temperature": 1.0,
                "logits_chunk": 4096,
            },
            "noise": dict(self.noise),
            "optim": {
                "lr": self.lr_peak,
                "betas": list(self.betas),
                "eps": 1e-8,
                "weight_decay": 0.0,
                "warmup_ratio": self.warmup / self.total,
                "warmup_steps": self.warmup,
                "schedule": self.schedule,
                "min_lr_ratio": self.min_lr_ratio,
                "grad_clip": self.grad_clip,
            },
            "train": {
                "epochs": self.epochs,
                "max_steps": None,
                "grad_accum": self.mb,
                "save_every": self.save_every,
                "eval_every": self.eval_every or None,
            },
        }
        return {
            "kind": "run_start",
            "time": time,
            "step": 0,
            "schema": 1,
            "config": config,
            "versions": {"blockdraft": "0.1.0"},
            "world_size": 1,
            "device": "cpu",
            "resumed_from": None,
            "total_steps": self.total,
            "warmup_steps": self.warmup,
            "batches_per_epoch": self.steps_per_epoch * self.mb,
        }

    def _foreign(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for r in records:
            if r["kind"] != "step":
                continue
            out.append(
                {
                    "global_step": r["step"],
                    "train/loss": r["loss"],
                    "train/acc": r["acc"],
                    "train/lr": r["lr"],
                    "grad_norm": r["grad_norm"],
                    "time": r["time"],
                }
            )
        return out

    def _windowed(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Average steps into monitor windows; a planted artifact stalls the monitor, then logs 2 steps."""
        steps = [r for r in records if r["kind"] == "step"]
        out = []
        i, w = 0, self.window
        artifacts = sorted(self.artifacts)
        while i < len(steps):
            size = w
            if artifacts and steps[i]["step"] >= artifacts[0]:
                stall = int(self.rng.integers(3, 6)) * w
                stalled = steps[i : i + stall]
                out.append(self._window_record(stalled))
                i = min(i + stall, len(steps) - 3)
                bad = dict(steps[i])
                bad["loss"] = bad["loss"] * float(self.rng.uniform(8, 20))
                bad["acc"] = bad["acc"] * 0.2
                steps[i] = bad
                size = 2
                at = artifacts.pop(0)
                for p in self.planted:
                    if p.code == "window_artifact" and p.steps[0] == at:
                        p.steps = (bad["step"], steps[min(i + 1, len(steps) - 1)]["step"])
            out.append(self._window_record(steps[i : i + size]))
            i += size
        return out

    @staticmethod
    def _window_record(chunk: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "global_step": chunk[-1]["step"],
            "time": chunk[-1]["time"],
            "train/loss": float(np.mean([c["loss"] for c in chunk])),
            "train/acc": float(np.mean([c["acc"] for c in chunk])),
            "train/lr": chunk[-1]["lr"],
        }


def _interleave(rng: np.random.Generator, counts: np.ndarray, total: int) -> np.ndarray:
    """The trainer's own bucket order (runs of at most 3), repeated to `total` micro-batches."""
    return np.resize(interleave([int(c) for c in counts], rng, max_run=3), total)


def matches(planted: Planted, finding: Any, tolerance: int = 50) -> bool:
    """A finding recalls a planted anomaly: same code, severe enough, overlapping steps (with slack)."""
    from blockdraft.doctor.findings import SEVERITY_RANK

    if finding.code != planted.code or SEVERITY_RANK[finding.severity] < SEVERITY_RANK[planted.severity]:
        return False
    first, last = finding.steps
    return first <= planted.steps[1] + tolerance and last >= planted.steps[0] - tolerance
