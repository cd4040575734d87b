"""A resumed run continues the tracker runs it started (W&B id, MLflow run_id, Trackio name, the
TensorBoard log dir with purge_step); read back with each library, offline."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest

from blockdraft.telemetry.log import read_log
from blockdraft.telemetry.trackers import IDS_FILE, TRACKERS
from blockdraft.train.loop import Trainer
from tests.telemetry.test_trackers import _wandb_records


@pytest.fixture
def resumed_run(tiny_config, tmp_path, monkeypatch):
    """6 steps with every tracker (checkpoints at 3 and 6); the step-6 checkpoint removed, as after a
    crash before it was committed; then `--resume`: steps 4-6 again, from step 3."""
    for var in ("WANDB_PROJECT", "WANDB_DIR", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "TRACKIO_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    cfg = tiny_config(train={"trackers": list(TRACKERS)})
    run_dir = Trainer(cfg, show_console=False).run().run_dir
    first = json.loads((run_dir / IDS_FILE).read_text())
    shutil.rmtree(run_dir / "checkpoints" / "step-000006")
    resumed = Trainer(cfg, resume=True, show_console=False)
    assert resumed.step == 3
    resumed.run()
    return {"dir": run_dir, "first": first, "ids": json.loads((run_dir / IDS_FILE).read_text()),
            "log": read_log(run_dir / "log.jsonl"), "tmp": tmp_path}


def test_resumed_steps_land_in_the_same_tracker_runs(resumed_run):
    run_dir, ids, log = resumed_run["dir"], resumed_run["ids"], resumed_run["log"]
    assert ids == resumed_run["first"] and set(ids) == set(TRACKERS)
    steps = [r["step"] for r in log if r["kind"] == "step"]
    assert steps == [1, 2, 3, 4, 5, 6, 4, 5, 6]
    loss = {r["step"]: r["loss"] for r in log if r["kind"] == "step"}  # the resumed values (last ones)

    # TensorBoard: the same log dir; purge_step drops the first attempt's steps 4-6
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(ids["tensorboard"]["logdir"])
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [
        (s, pytest.approx(loss[s], rel=1e-6)) for s in range(1, 7)]

    # W&B offline: a second segment of the same run id (`wandb sync` uploads both into one run)
    segments = sorted((run_dir / "wandb").glob("offline-run-*"), key=lambda p: p.stat().st_mtime)
    assert len(segments) == 2
    wandb_steps = []
    for seg in segments:
        (path,) = seg.glob("run-*.wandb")
        records = _wandb_records(path)
        (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        assert run.run_id == ids["wandb"]["id"]
        rows = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
                for r in records if r.WhichOneof("record_type") == "history"]
        wandb_steps.append([row["step"] for row in rows if "train/loss" in row])
    assert wandb_steps == [[1, 2, 3, 4, 5, 6], [4, 5, 6]]

    # MLflow: one run, reopened by run_id, finished again; the replayed steps appended to its history
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=ids["mlflow"]["tracking_uri"])
    (run,) = client.search_runs([client.get_experiment_by_name("blockdraft").experiment_id])
    assert run.info.run_id == ids["mlflow"]["run_id"] and run.info.status == "FINISHED"
    history = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss"))
    assert history == [1, 2, 3, 4, 4, 5, 5, 6, 6]

    # Trackio: the same project and run name
    with sqlite3.connect(resumed_run["tmp"] / "trackio" / f"{ids['trackio']['project']}.db") as db:
        rows = [s for s, m in db.execute("select step, metrics from metrics where run_name = ? order by id",
                                         (ids["trackio"]["name"],)) if "train/loss" in json.loads(m)]
    assert rows == [1, 2, 3, 4, 5, 6, 4, 5, 6]


def test_a_fresh_run_in_the_folder_starts_new_tracker_runs(tiny_config, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = tiny_config(train={"trackers": ["wandb"], "max_steps": 1, "save_every": 100})
    run_dir = Trainer(cfg, show_console=False).run().run_dir
    first = json.loads((run_dir / IDS_FILE).read_text())["wandb"]["id"]
    shutil.rmtree(run_dir / "checkpoints")
    Trainer(cfg, show_console=False).run()
    assert json.loads((run_dir / IDS_FILE).read_text())["wandb"]["id"] != first
