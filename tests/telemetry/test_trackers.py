"""Trackers: one real `blockdraft train` run with all four, offline; each one's files are read back
with that tracker's own format (TensorBoard's event reader, the W&B transaction log, the MLflow
file store, Trackio's SQLite) and must hold what log.jsonl holds."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from blockdraft.cli import main
from blockdraft.config import dump_config
from blockdraft.telemetry.log import RunLog, read_log
from blockdraft.telemetry.trackers import SINKS, TRACKERS, hyperparameters, metrics
from tests.conftest import make_config

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def tracked_run(tiny_target, tiny_corpus, tmp_path_factory):
    """A 6-step run with all four trackers, an eval at steps 3 and 6 and checkpoints at 3 and 6,
    as a user starts it: the CLI in its own process, stdout and stderr not a terminal."""
    tmp = tmp_path_factory.mktemp("tracked")
    cfg = make_config(tiny_target, tiny_corpus, tmp, train={"trackers": list(TRACKERS), "eval_every": 3,
                                                             "log_every_s": 3600},
                      eval={"prompts": [str(tiny_corpus)], "max_prompts": 2, "max_new_tokens": 4, "prompt_tokens": 16})
    (tmp / "run.yaml").write_text(dump_config(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "TRACKIO_"))}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", TRACKIO_DIR=str(tmp / "trackio"),
               PYTHONPATH=os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "blockdraft", "train", str(tmp / "run.yaml")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = Path(cfg.train.out_dir)
    return {"dir": run_dir, "log": read_log(run_dir / "log.jsonl"), "stdout": proc.stdout, "tmp": tmp}


def _by_kind(log: list[dict], kind: str) -> list[dict]:
    return [r for r in log if r["kind"] == kind]


def test_the_run_log_stays_complete_with_trackers_on(tracked_run):
    log = tracked_run["log"]
    assert [r["step"] for r in _by_kind(log, "step")] == [1, 2, 3, 4, 5, 6]
    assert not _by_kind(log, "warning") or all(w["code"] != "tracker_failed" for w in _by_kind(log, "warning"))
    assert log[-1]["kind"] == "run_end" and log[-1]["status"] == "completed"


def test_tensorboard_holds_steps_config_eval_and_checkpoints(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(tracked_run["dir"] / "tensorboard"))
    events.Reload()
    log = tracked_run["log"]
    loss = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert loss == [(r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in _by_kind(log, "step")]
    assert [e.step for e in events.Scalars("eval/tau")] == [3, 6]
    assert [e.step for e in events.Scalars("checkpoint/stall_s")] == [r["step"] for r in _by_kind(log, "checkpoint")]
    start = plugin_data_pb2.HParamsPluginData.FromString(
        events.PluginTagToContent("hparams")["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["optim.lr"].number_value == pytest.approx(1e-3)
    assert start.hparams["train.trackers"].string_value == json.dumps(list(TRACKERS))


def _wandb_records(path: Path) -> list:
    """The records of a W&B offline transaction log: a 7-byte header, then LevelDB-log framing
    (32 KiB blocks; chunks of [crc u32, length u16, type u8]; type 1 whole, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, out, buf = 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if kind == 0:
            break
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            out.append(record)
    return out


def test_wandb_offline_run_holds_steps_config_eval_and_checkpoints(tracked_run):
    (path,) = (tracked_run["dir"] / "wandb").glob("offline-run-*/run-*.wandb")
    records = _wandb_records(path)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["optim.lr"] == pytest.approx(1e-3) and config["train.trackers"] == list(TRACKERS)
    assert run.display_name == tracked_run["dir"].name
    rows = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]
    log = tracked_run["log"]
    losses = [(row["step"], row["train/loss"]) for row in rows if "train/loss" in row]
    assert losses == [(r["step"], pytest.approx(r["loss"])) for r in _by_kind(log, "step")]
    assert [row["step"] for row in rows if "eval/tau" in row] == [3, 6]
    checkpoints = [r["step"] for r in _by_kind(log, "checkpoint")]
    assert [row["step"] for row in rows if "checkpoint/write_s" in row] == checkpoints
    exits = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert exits and exits[-1].exit_code == 0


def test_mlflow_file_store_holds_steps_config_eval_and_checkpoints(tracked_run, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(tracked_run["dir"] / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("blockdraft").experiment_id])
    assert run.info.run_name == tracked_run["dir"].name and run.info.status == "FINISHED"
    assert float(run.data.params["optim.lr"]) == pytest.approx(1e-3)
    log = tracked_run["log"]
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss"))
    assert history == [(r["step"], pytest.approx(r["loss"])) for r in _by_kind(log, "step")]
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "eval/tau")) == [3, 6]
    assert run.data.tags["checkpoint"] == _by_kind(log, "checkpoint")[-1]["path"]


def test_trackio_database_holds_steps_config_and_eval(tracked_run):
    with sqlite3.connect(tracked_run["tmp"] / "trackio" / "blockdraft.db") as db:
        rows = [(step, json.loads(m)) for step, m in db.execute(
            "select step, metrics from metrics where run_name = ? order by id", (tracked_run["dir"].name,))]
        (config,) = [json.loads(c) for (c,) in db.execute("select config from configs where run_name = ?",
                                                          (tracked_run["dir"].name,))]
    log = tracked_run["log"]
    assert [(s, m["train/loss"]) for s, m in rows if "train/loss" in m] == [
        (r["step"], pytest.approx(r["loss"])) for r in _by_kind(log, "step")]
    assert [s for s, m in rows if "eval/tau" in m] == [3, 6]
    assert config["optim.lr"] == pytest.approx(1e-3)


def test_without_a_terminal_progress_is_whole_plain_lines(tracked_run):
    """log_every_s=3600: the first step, each checkpoint and eval, and the end print a progress line."""
    lines = [line for line in tracked_run["stdout"].splitlines() if " step " in line and "/6 " in line]
    assert "step 1/6" in lines[0] and "ETA --" in lines[0] and "ETA 0:00" not in lines[0]
    assert any("step 3/6" in line for line in lines) and "step 6/6" in lines[-1]
    assert all("\x1b[" not in line and "\r" not in line for line in lines)


def test_every_tracker_name_has_a_sink():
    assert set(SINKS) == set(TRACKERS)


def test_metrics_name_fields_by_record_kind_and_skip_text():
    step = {"kind": "step", "time": 1.0, "step": 4, "loss": 2.5, "skipped": False, "acc_per_pos": [0.5, 0.25],
            "skip_reason": None, "buckets": [1]}
    assert metrics(step) == {"train/loss": 2.5, "train/skipped": 0.0, "train/acc_per_pos/1": 0.5,
                             "train/acc_per_pos/2": 0.25, "train/buckets/1": 1.0}
    assert metrics({"kind": "eval", "time": 1.0, "step": 4, "tau": 3.1, "mode": "path"}) == {"eval/tau": 3.1}
    assert metrics({"kind": "warning", "time": 1.0, "step": 4, "code": "x"}) == {}
    params = hyperparameters({"config": {"optim": {"lr": 1e-3, "betas": [0.9, 0.95]}}, "world_size": 8,
                              "flex_backend": "flash"})
    assert params == {"optim.lr": 1e-3, "optim.betas": [0.9, 0.95], "run.world_size": 8,
                      "run.flex_backend": "flash"}  # the kernels that ran, beside the config's `auto`


def test_a_missing_tracker_library_is_one_line_naming_the_extra(tiny_config, tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"target": {"path": "/nowhere"}, "train": {"trackers": ["tensorboard", "wandb"]}}))
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "blockdraft train: error: train.trackers: wandb not installed; pip install 'blockdraft[wandb]'"


def test_a_failing_tracker_is_dropped_with_a_warning_and_the_log_goes_on(tmp_path):
    class Broken:
        name = "broken"

        def write(self, record):
            raise ConnectionError("server gone")

        def close(self):
            pass

    log = RunLog(tmp_path / "log.jsonl", sinks=[Broken()])
    log.write("step", 1, loss=1.0)
    log.write("step", 2, loss=0.5)
    log.close()
    records = read_log(tmp_path / "log.jsonl")
    assert [r["kind"] for r in records] == ["step", "warning", "step"]
    assert records[1]["code"] == "tracker_failed" and "server gone" in records[1]["message"]
