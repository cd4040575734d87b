"""The seed incident's log in each format users bring, read as a user would: first with no options,
then with --config. Every planted cause must be found at warning or above within 30 steps of where
it was planted; the same formats without the anomalies must give no warning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blockdraft import cli
from blockdraft.doctor.findings import at_least
from tests.doctor import formats
from tests.doctor.seed_log import seed_incident
from tests.doctor.synthetic import Planted

NEED_CONFIG = {"noise_schedule_flat", "loss_decay_gamma", "optimizer_betas"}
FORMATS = ("seed-jsonl", "wandb-csv", "wandb-history", "tensorboard")


def _write(fmt: str, records: list[dict], folder: Path) -> Path:
    if fmt == "seed-jsonl":
        path = folder / "train_log.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return path
    if fmt == "wandb-csv":
        return formats.write_wandb_csv(records, folder / "wandb_export.csv")
    if fmt == "wandb-history":
        formats.write_wandb_history(records, folder)
        return folder
    pytest.importorskip("tensorboard")
    return formats.write_tensorboard(records, folder / "tb")


def _doctor(capsys, *argv: str) -> list[dict]:
    assert cli.main(["doctor", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _missed(planted: list[Planted], findings: list[dict], tolerance: int = 30) -> list[str]:
    def hit(p: Planted, f: dict) -> bool:
        first, last = f["steps"]
        return (
            f["code"] == p.code
            and at_least(f["severity"], "warning")
            and first <= p.steps[1] + tolerance
            and last >= p.steps[0] - tolerance
        )

    return [p.code for p in planted if not any(hit(p, f) for f in findings)]


def _config(folder: Path, config: dict) -> str:
    path = folder / "config.yaml"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize("fmt", FORMATS)
def test_seed_incident_found_in_every_format(fmt, tmp_path, capsys):
    log = seed_incident(0)
    path = _write(fmt, log.records, tmp_path)
    plain = _doctor(capsys, str(path))
    assert not _missed([p for p in log.planted if p.code not in NEED_CONFIG], plain)
    assert not [f for f in plain if f["code"] in ("loss_spike", "lr_schedule_mismatch")]
    configured = _doctor(capsys, str(path), "--config", _config(tmp_path, log.config))
    assert not _missed(log.planted, configured)
    art = next(f for f in configured if f["code"] == "window_artifact")
    assert art["evidence"]["window_steps"] == 2 and art["evidence"]["after_gap"] == 2


@pytest.mark.parametrize("fmt", FORMATS)
def test_clean_logs_of_each_format_have_no_warning(fmt, tmp_path, capsys):
    log = seed_incident(3, clean=True)
    path = _write(fmt, log.records, tmp_path)
    for extra in ((), ("--config", _config(tmp_path, log.config))):
        warned = [(f["code"], f["summary"]) for f in _doctor(capsys, str(path), *extra) if f["severity"] != "info"]
        assert not warned


def test_hf_checkpoint_folder(tmp_path, capsys):
    state, planted = formats.hf_state(0)
    ckpt = tmp_path / "out" / "checkpoint-3000"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    found = _doctor(capsys, str(tmp_path / "out"))
    assert not _missed(planted, found)
    epoch = next(f for f in found if f["code"] == "epoch_accounting")
    assert "12000" in epoch["summary"]


def test_hf_clean_trainer_state_has_no_warning(tmp_path, capsys):
    state, _ = formats.hf_state(1, clean=True)
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(state))
    assert not [f["code"] for f in _doctor(capsys, str(path)) if f["severity"] != "info"]


def test_what_was_read_and_what_was_not_checked_are_said(tmp_path, capsys):
    log = seed_incident(0)
    path = _write("seed-jsonl", log.records, tmp_path)
    assert cli.main(["doctor", str(path)]) == 0
    out = capsys.readouterr().out
    assert "queue_depth<-q_pre" in out and "tok_per_s<-tok_s" in out
    assert "optimizer_betas: needs the Adam betas (pass --config)" in out
    assert cli.main(["doctor", str(path), "--config", _config(tmp_path, log.config)]) == 0
    out = capsys.readouterr().out
    assert "loss.gamma<-loss.gamma" in out and "optim.betas<-optimizer.betas" in out
    assert "optimizer_betas: needs" not in out


def test_hf_max_steps_ending_inside_the_last_epoch_is_consistent(tmp_path, capsys):
    """Trainer sets num_train_epochs = ceil(max_steps / steps per epoch) when max_steps is given."""
    state, _ = formats.hf_state(1, clean=True)
    state["max_steps"] = 10_000
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(state))
    assert not [f for f in _doctor(capsys, str(path)) if f["code"] == "epoch_accounting"]
    state["num_train_epochs"] = 6
    path.write_text(json.dumps(state))
    epoch = [f for f in _doctor(capsys, str(path)) if f["code"] == "epoch_accounting"]
    assert epoch and epoch[0]["severity"] == "warning" and "10000" in epoch[0]["summary"]


def test_hf_trainer_keys_in_wandb_mean_a_cumulative_epoch(tmp_path, capsys):
    """HF's WandbCallback logs train/epoch = epochs done (0.4 = 40% of the first): nothing to misread."""
    log = seed_incident(3)
    rows = formats.wandb_rows(log.records)
    for row in rows:
        row["train/global_step"] = row.pop("global_step")
        row["train/learning_rate"] = row.pop("train/lr")
    path = tmp_path / "files" / "wandb-history.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = _doctor(capsys, str(tmp_path), "--config", _config(tmp_path, log.config))
    assert not [f for f in found if f["code"] == "epoch_accounting"]
    assert [f for f in found if f["code"] == "window_artifact"]
