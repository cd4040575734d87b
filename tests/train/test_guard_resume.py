"""The guard's windows are train state: a run resumed at a step, even one right before a bucket's
spike test would refuse a batch, makes the uninterrupted run's guard decisions and losses."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from blockdraft.config import GuardConfig
from blockdraft.telemetry.log import read_log
from blockdraft.train import loop
from blockdraft.train.checkpoint import committed_checkpoints
from blockdraft.train.guard import StepGuard
from blockdraft.train.loop import Trainer
from blockdraft.train.loss import summarize

MIN_HISTORY = 3
STEPS = 9


def _spiked_guard() -> tuple[StepGuard, float]:
    guard = StepGuard(GuardConfig(min_history=MIN_HISTORY, spike_k=10))
    for loss in (2.0, 2.1, 1.9, 2.05):
        assert guard.check(0, loss, 0.5) is None
    return guard, 50.0


def test_a_guard_restored_through_a_checkpoint_file_refuses_what_the_original_refuses(tmp_path):
    guard, spike = _spiked_guard()
    guard.check(0, float("nan"), 0.5)
    torch.save({"guard": guard.state_dict()}, tmp_path / "trainer.pt")  # as a checkpoint writes it
    restored = StepGuard(GuardConfig(min_history=MIN_HISTORY, spike_k=10))
    restored.load_state_dict(torch.load(tmp_path / "trainer.pt", weights_only=True)["guard"])
    assert StepGuard(GuardConfig(min_history=MIN_HISTORY, spike_k=10)).check(0, spike, 0.5) is None  # no history
    assert restored.state_dict()["consecutive"] == guard.state_dict()["consecutive"] == 1
    assert restored.check(0, spike, 0.5) == guard.check(0, spike, 0.5) == "loss_spike"
    assert restored.state_dict() == guard.state_dict()


def test_a_smaller_window_keeps_the_newest_values():
    guard, _ = _spiked_guard()
    restored = StepGuard(GuardConfig(min_history=MIN_HISTORY, window=3))
    restored.load_state_dict(guard.state_dict())
    (loss,) = [e for e in restored.state_dict()["history"] if e["metric"] == "loss"]
    assert loss["values"] == [2.1, 1.9, 2.05]


def _plant_spike(monkeypatch, trainer: Trainer, planted: list[str]) -> None:
    """The batches in `planted` report 100x their loss. With `planted` empty, the first batch whose
    bucket already has `min_history` accepted losses is chosen (and appended), so the spike test refuses it."""
    train_step, current = trainer.train_step, []

    def tracked(micro_batches):
        current[:] = [mb.batch_id for mb in micro_batches]
        if not planted:
            seen = {e["bucket"]: len(e["values"]) for e in trainer.guard.state_dict()["history"]
                    if e["metric"] == "loss"}
            if seen.get(max(mb.bucket for mb in micro_batches), 0) >= MIN_HISTORY:
                planted.extend(current)
        return train_step(micro_batches)

    def spiky(vector, grad_norm):
        metrics = summarize(vector, grad_norm)
        if set(current) & set(planted):
            metrics["loss"] *= 100.0
        return metrics

    monkeypatch.setattr(trainer, "train_step", tracked)
    monkeypatch.setattr(loop, "summarize", spiky)


def _decisions(run_dir: Path) -> list[tuple[int, float, bool, str | None]]:
    return [(r["step"], r["loss"], r["skipped"], r["skip_reason"])
            for r in read_log(run_dir / "log.jsonl") if r["kind"] == "step"]


def _resume_at(full_run: Path, step: int, cfg_for, monkeypatch, planted: list[str]) -> Path:
    """The uninterrupted run's folder as it was after `step`'s checkpoint, resumed to the end."""
    run_dir = full_run.parent / f"resumed-at-{step}"
    shutil.copytree(full_run, run_dir, symlinks=True)
    (run_dir / "log.jsonl").unlink()
    for ckpt in committed_checkpoints(run_dir / "checkpoints"):
        if int(ckpt.name.split("-")[1]) > step:
            shutil.rmtree(ckpt)
    trainer = Trainer(cfg_for(run_dir), resume=True, show_console=False)
    assert trainer.step == step
    _plant_spike(monkeypatch, trainer, planted)
    assert trainer.run().status == "completed"
    return run_dir


def test_a_resumed_run_makes_the_uninterrupted_runs_guard_decisions_and_losses(tiny_config, tmp_path, monkeypatch):
    def cfg_for(run_dir: Path):
        return tiny_config(guard={"min_history": MIN_HISTORY},
                           train={"max_steps": STEPS, "save_every": 1, "keep_last": STEPS + 1,
                                  "out_dir": str(run_dir)})

    full = Trainer(cfg_for(tmp_path / "full"), show_console=False)
    planted: list[str] = []
    _plant_spike(monkeypatch, full, planted)
    assert full.run().status == "completed"
    expected = _decisions(full.run_dir)
    (spiked,) = [d for d in expected if d[2]]  # the planted batch is refused, its update made by the next one
    assert planted and spiked[3] == "loss_spike", expected
    spike_step = spiked[0]
    assert spike_step < STEPS

    # resumed right before the spike: no accepted step of its bucket since the checkpoint, so only the
    # restored window can refuse it; and resumed once early, before any bucket has a full history
    for step in sorted({spike_step - 1, 1}):
        resumed = _resume_at(full.run_dir, step, cfg_for, monkeypatch, list(planted))
        got = _decisions(resumed)
        assert got == [d for d in expected if d[0] > step], f"resumed at {step}"
