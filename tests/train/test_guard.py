"""The step guard: non-finite or spiking steps apply no update, the run goes on, and a run of them
rolls back to the last committed checkpoint with the offending batches put on a persistent skip list."""

import math

import pytest
import torch

from blockdraft.config import GuardConfig
from blockdraft.telemetry.log import read_log
from blockdraft.train.guard import StepGuard
from blockdraft.train.loop import Trainer


def test_nonfinite_values_are_refused():
    guard = StepGuard(GuardConfig())
    assert guard.check(0, float("nan"), 1.0) == "nonfinite_loss"
    assert guard.check(0, 1.0, float("inf")) == "nonfinite_grad_norm"
    assert guard.check(0, 1.0, 1.0) is None


def test_spikes_are_judged_per_bucket_and_never_raise_their_own_bar():
    guard = StepGuard(GuardConfig(min_history=5, spike_k=10))
    for i in range(10):
        assert guard.check(0, 1.0 + 0.01 * (i % 3), 0.5) is None  # bucket 0: loss about 1
        assert guard.check(1, 5.0 + 0.01 * (i % 3), 0.5) is None  # bucket 1: loss about 5
    assert guard.check(1, 5.05, 0.5) is None  # normal for bucket 1
    assert guard.check(0, 5.05, 0.5) == "loss_spike"  # the same loss is a spike in bucket 0
    for _ in range(20):  # refused values stay out of the window: the bar does not creep up
        assert guard.check(0, 5.05, 0.5) == "loss_spike"
    assert guard.check(0, 1.0, 50.0) == "grad_norm_spike"
    assert guard.state_dict()["consecutive"] == 22 and guard.must_roll_back
    assert guard.check(0, 1.0, 0.5) is None and guard.state_dict()["consecutive"] == 0


def test_a_spike_must_also_be_a_multiple_of_the_median():
    """A narrow window makes median + k*MAD a low bar; a few times the median grad norm is small-batch noise."""
    guard = StepGuard(GuardConfig(min_history=5, spike_k=10))
    for i in range(10):
        assert guard.check(0, 2.0 + 0.01 * (i % 3), 0.2 + 0.002 * (i % 3)) is None
    assert guard.check(0, 2.0, 0.68) is None  # far above median + 10 MAD, but only 3.4x the median
    assert guard.check(0, 2.0, 1.1) == "grad_norm_spike"  # 5.5x
    assert guard.check(0, 5.5, 0.2) is None  # 2.75x the median loss
    assert guard.check(0, 6.8, 0.2) == "loss_spike"  # 3.4x: a loss that far out is not noise


def test_the_grad_norm_ratio_is_its_own_setting():
    guard = StepGuard(GuardConfig(min_history=5, spike_k=10, grad_norm_min_ratio=3.0))
    for i in range(10):
        assert guard.check(0, 2.0 + 0.01 * (i % 3), 0.2 + 0.002 * (i % 3)) is None
    assert guard.check(0, 2.0, 0.68) == "grad_norm_spike"


def test_disabled_guard_lets_everything_through():
    assert StepGuard(GuardConfig(enabled=False)).check(0, float("nan"), float("nan")) is None


def _plant_nan(monkeypatch, trainer: Trainer, attempts: set[int]) -> None:
    """Target features turn NaN during the given (1-based) step attempts: a poisoned batch."""
    features, train_step, count = trainer.target.features, trainer.train_step, [0]

    def counted(micro_batches):
        count[0] += 1
        return train_step(micro_batches)

    def poisoned(*args, **kwargs):
        taps, final = features(*args, **kwargs)
        if count[0] in attempts:
            taps = taps * float("nan")
        return taps, final

    monkeypatch.setattr(trainer, "train_step", counted)
    monkeypatch.setattr(trainer.target, "features", poisoned)


def _adam_state(trainer: Trainer) -> list[dict[str, torch.Tensor]]:
    return [{k: v.clone() for k, v in s.items()} for s in trainer.optimizer.state.values()]


def test_a_nan_batch_changes_no_weight_no_moment_and_no_schedule(tiny_config, monkeypatch):
    trainer = Trainer(tiny_config(), show_console=False)
    _plant_nan(monkeypatch, trainer, {2})
    try:
        trainer.train_step([trainer.hot.to_device(trainer.prefetcher.next())])
        weights = {k: v.clone() for k, v in trainer.drafter.state_dict().items()}
        adam = _adam_state(trainer)
        rec = trainer.train_step([trainer.hot.to_device(trainer.prefetcher.next())])
    finally:
        trainer.prefetcher.close()
    assert rec["skipped"] and rec["skip_reason"] == "nonfinite_loss"
    assert trainer.step == 1
    for k, v in trainer.drafter.state_dict().items():
        assert torch.equal(v, weights[k]), k
    for before, after in zip(adam, _adam_state(trainer), strict=True):
        for k in before:
            assert torch.equal(before[k], after[k]), k  # includes Adam's step count
    assert all(p.grad is None for p in trainer.drafter.parameters())


def test_run_skips_a_nan_batch_and_goes_on(tiny_config, monkeypatch):
    trainer = Trainer(tiny_config(), show_console=False)
    _plant_nan(monkeypatch, trainer, {2})
    result = trainer.run()
    assert result.status == "completed" and result.last_step == 6
    assert all(torch.isfinite(p).all() for p in trainer.drafter.parameters())
    records = read_log(result.run_dir / "log.jsonl")
    steps = [r for r in records if r["kind"] == "step"]
    assert [(r["step"], r["skipped"]) for r in steps][:3] == [(1, False), (2, True), (2, False)]
    assert [r["step"] for r in steps if not r["skipped"]] == [1, 2, 3, 4, 5, 6]
    assert steps[1]["skip_reason"] == "nonfinite_loss" and steps[1]["lr"] == steps[2]["lr"]
    (skip,) = [r for r in records if r["kind"] == "skip"]
    assert skip["reason"] == "nonfinite_loss" and skip["step"] == 2 and skip["loss"] is None
    assert len(skip["batch_ids"]) == 1 and isinstance(skip["bucket"], int)
    assert any(r["kind"] == "warning" and r["code"] == "step_skipped" for r in records)
    assert not any(r["kind"] == "rollback" for r in records)


def test_consecutive_skips_roll_back_and_the_skip_list_persists(tiny_config, monkeypatch):
    cfg = tiny_config(guard={"max_consecutive_skips": 2})
    trainer = Trainer(cfg, show_console=False)
    _plant_nan(monkeypatch, trainer, {5, 6})  # updates 1-4 applied, checkpoint at 3, then two NaN batches
    result = trainer.run()
    assert result.status == "completed" and result.last_step == 6
    records = read_log(result.run_dir / "log.jsonl")
    skips = [r for r in records if r["kind"] == "skip"]
    offenders = [b for r in skips[:2] for b in r["batch_ids"]]
    (rollback,) = [r for r in records if r["kind"] == "rollback"]
    assert rollback["to_step"] == 3 and rollback["skipped_batches"] == offenders
    # the replay after the rollback passes over exactly the offending batches
    assert [r["reason"] for r in skips] == ["nonfinite_loss", "nonfinite_loss", "skip_list", "skip_list"]
    assert [b for r in skips[2:] for b in r["batch_ids"]] == offenders
    applied = [r["step"] for r in records if r["kind"] == "step" and not r["skipped"]]
    assert applied == [1, 2, 3, 4, 4, 5, 6]
    assert all(math.isfinite(r["loss"]) for r in records if r["kind"] == "step" and not r["skipped"])
    resumed = Trainer(cfg, resume=True, show_console=False)
    resumed.prefetcher.close()
    assert resumed.feed.skip_list == set(offenders)


@pytest.mark.parametrize("k", [0.0, -1.0])
def test_guard_config_rejects_a_non_positive_k(k, tiny_config):
    from blockdraft.errors import UserError

    with pytest.raises(UserError, match="guard.spike_k"):
        tiny_config(guard={"spike_k": k})


def test_a_damaged_checkpoint_met_in_a_rollback_is_in_the_log(tiny_config, monkeypatch):
    """The rollback passes over a damaged checkpoint as a resume does, and the log says so."""
    cfg = tiny_config(guard={"max_consecutive_skips": 2}, train={"save_every": 2})
    trainer = Trainer(cfg, show_console=False)
    _plant_nan(monkeypatch, trainer, {5, 6})  # checkpoints at 2 and 4, then two NaN batches: a rollback
    newest = trainer.checkpointer.newest

    def damaging_newest(warn):
        shard = trainer.run_dir / "checkpoints" / "step-000004" / "__0_0.distcp"
        shard.write_bytes(shard.read_bytes()[:-8] + bytes(8))
        return newest(warn)

    monkeypatch.setattr(trainer.checkpointer, "newest", damaging_newest)
    result = trainer.run()
    records = read_log(result.run_dir / "log.jsonl")
    (rollback,) = [r for r in records if r["kind"] == "rollback"]
    assert rollback["to_step"] == 2  # step 4's checkpoint is passed over
    (damaged,) = [r for r in records if r["kind"] == "warning" and r["code"] == "checkpoint_damaged"]
    assert "step-000004" in damaged["message"] and "previous checkpoint" in damaged["message"]
