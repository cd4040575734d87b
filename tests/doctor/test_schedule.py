import subprocess
import sys

import numpy as np

from blockdraft import schedule as shared
from blockdraft.config import NoiseConfig, OptimConfig, total_updates, warmup_updates
from blockdraft.doctor import schedule
from blockdraft.doctor.records import run_from_records
from blockdraft.doctor.run import LoggedRun, StepTable


def _run(run_start: dict, config: dict) -> LoggedRun:
    empty = np.zeros(0)
    table = StepTable(cols={"step": empty}, bucket=empty, bucket_seq=empty, bucket_row=empty, segment=empty)
    return LoggedRun(source="x", steps=table, run_start=run_start, config=config)


def test_warmup_uses_k_over_w_from_update_one():
    lr = shared.lr_curve(np.array([1, 5, 10, 11]), 1e-3, 10, 110, "cosine", 0.1)
    assert lr[0] == 1e-4 and lr[1] == 5e-4 and lr[2] == 1e-3
    end = shared.lr_curve(np.array([110]), 1e-3, 10, 110, "cosine", 0.1)
    assert np.isclose(end[0], 1e-4)


def test_noise_warmup_then_cosine():
    run = _run({"total_steps": 1000},
               {"noise": {"std": 0.2, "warmup_steps": 100, "schedule": "cosine", "final_std": 0.0}})
    noise = schedule.expected_noise(run, np.array([1, 50, 100, 550, 1000]))
    np.testing.assert_allclose(noise, [0.002, 0.1, 0.2, 0.1, 0.0], atol=1e-12)


def test_the_doctor_expects_exactly_what_the_trainer_applies():
    """One schedule for both: a run's logged LR and noise are the doctor's expected curves, bit for bit."""
    total, warmup, k = 1000, 40, np.arange(1, 1001)
    for shape in ("cosine", "linear", "constant"):
        optim = OptimConfig(lr=6e-4, schedule=shape, min_lr_ratio=0.1, warmup_steps=warmup)
        noise = NoiseConfig(std=0.2, final_std=0.05, warmup_steps=25, schedule="cosine")
        run = _run({"total_steps": total, "warmup_steps": warmup},
                   {"optim": optim.model_dump(mode="json"), "noise": noise.model_dump(mode="json")})
        applied_lr = [shared.lr_at(int(i), optim, total, warmup) for i in k]
        applied_noise = [shared.noise_std_at(int(i), noise, total) for i in k]
        assert schedule.expected_lr(run, k).tolist() == applied_lr, shape
        assert schedule.expected_noise(run, k).tolist() == applied_noise


def test_the_shared_schedule_imports_no_torch():
    code = "import sys, blockdraft.schedule; print([m for m in ('torch', 'transformers') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_run_of_partial_epochs_lasts_as_long_as_the_trainer_runs_it():
    """0.3 epochs of 101 updates: the trainer runs 31 updates (a partial update counts), so must the doctor."""
    run = _run({}, {"train": {"epochs": 0.3, "steps_per_epoch": 101}})
    assert total_updates(None, 0.3, 101) == 31
    assert schedule.total_steps(run) == 31


def test_the_doctor_derives_the_warmup_the_trainer_applies():
    for optim in (OptimConfig(warmup_ratio=0.07), OptimConfig(warmup_steps=5)):
        run = _run({}, {"optim": optim.model_dump(mode="json"), "train": {"epochs": 0.3, "steps_per_epoch": 101}})
        trainer = warmup_updates(optim.warmup_steps, optim.warmup_ratio, total_updates(None, 0.3, 101))
        assert schedule.warmup_steps(run) == trainer


def test_lengths_logged_as_infinity_or_nan_are_unknown_not_a_crash():
    """A JSON log can hold Infinity and NaN where a length belongs; the doctor then derives the length
    or goes without it."""
    inf, nan = float("inf"), float("nan")
    run = _run({"total_steps": inf, "warmup_steps": inf},
               {"optim": {"warmup_steps": nan, "warmup_ratio": inf}, "train": {"epochs": inf, "max_steps": nan}})
    assert schedule.total_steps(run) is None
    assert schedule.warmup_steps(run) is None
    run = _run({"warmup_steps": inf}, {"optim": {"warmup_ratio": 0.1}, "train": {"epochs": 1, "steps_per_epoch": 50}})
    assert schedule.total_steps(run) == 50
    assert schedule.warmup_steps(run) == warmup_updates(None, 0.1, 50)


def test_steps_per_epoch_measured_from_the_epoch_field_is_the_whole_number_the_trainer_used():
    """A log without total_steps or steps_per_epoch: 1,500 updates an epoch, read off epoch + epoch_progress
    (a fitted slope, so 1/slope is a hair under 1,500), gives the trainer's 2.5 epochs x 1,500 updates."""
    per_epoch = 1500
    recs = [{"kind": "run_start", "time": 0.0, "step": 0, "config": {"train": {"epochs": 2.5}}}]
    recs += [{"kind": "step", "time": float(k), "step": k, "loss": 1.0, "epoch": (k - 1) // per_epoch,
              "epoch_progress": ((k - 1) % per_epoch + 1) / per_epoch} for k in range(1, 3001)]
    assert schedule.total_steps(run_from_records(recs)) == total_updates(None, 2.5, per_epoch) == 3750
