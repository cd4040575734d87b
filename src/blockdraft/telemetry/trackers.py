"""Experiment trackers (TensorBoard, W&B, Trackio, MLflow), fed from the run log.

log.jsonl stays the source of truth: each tracker is a `Sink` that the RunLog hands every record once
it is on disk. `run_start` opens a run with the resolved config as hyperparameters, `step`, `eval` and
`checkpoint` records become metrics at their step, `run_end` closes the run. Each library is an
optional extra, imported only when asked for, writing locally unless its own settings say otherwise
(docs/trackers.md). A resume continues the tracker runs it started: RUN/trackers.json keeps their ids.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Protocol, get_args

import yaml

from blockdraft.config import TrackerName
from blockdraft.errors import UserError

TRACKERS: tuple[str, ...] = get_args(TrackerName)
METRIC_KINDS = {"step": "train", "eval": "eval", "checkpoint": "checkpoint"}  # record kind -> metric prefix
_NOT_METRICS = {"kind", "time", "step"}


class Sink(Protocol):
    """What the RunLog fans records out to."""

    name: str

    def write(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


IDS_FILE = "trackers.json"


def _stored(run_dir: Path) -> dict[str, Any]:
    """RUN/trackers.json; {} when it is missing or damaged."""
    try:
        known = json.loads((run_dir / IDS_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return known if isinstance(known, dict) else {}


def recall(run_dir: Path, name: str, record: dict[str, Any]) -> dict[str, Any] | None:
    """What `name` stored for this run folder, when `record` (a run_start) resumes a run."""
    return _stored(run_dir).get(name) if record.get("resumed_from") is not None else None


def remember(run_dir: Path, name: str, info: dict[str, Any]) -> None:
    """Store `name`'s run ids in RUN/trackers.json (written whole, then renamed into place)."""
    known = {**_stored(run_dir), name: info}
    tmp = run_dir / f".{IDS_FILE}.tmp"
    tmp.write_text(json.dumps(known, indent=2) + "\n")
    os.replace(tmp, run_dir / IDS_FILE)


def require_trackers(names: list[str]) -> None:
    """Fail at once, in one line, when a tracker's library is not installed."""
    missing = [n for n in dict.fromkeys(names) if importlib.util.find_spec(n) is None]
    if missing:
        extras = ",".join(missing)
        raise UserError(f"train.trackers: {', '.join(missing)} not installed; pip install 'blockdraft[{extras}]'")


def metrics(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of a step, eval or checkpoint record, named `prefix/field` (`train/loss`,
    `eval/tau`, `checkpoint/stall_s`); a list of numbers becomes `prefix/field/1`, `/2`, ..."""
    prefix = METRIC_KINDS.get(record["kind"])
    if prefix is None:
        return {}
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in _NOT_METRICS:
            continue
        if isinstance(value, (bool, int, float)):
            out[f"{prefix}/{key}"] = float(value)
        elif isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
            out.update({f"{prefix}/{key}/{i}": float(v) for i, v in enumerate(value, 1)})
    return out


def hyperparameters(run_start: dict[str, Any]) -> dict[str, Any]:
    """The resolved config, flattened to dotted keys (`optim.lr`), plus the run's shape (`run.*`)."""
    flat: dict[str, Any] = {}

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = value

    walk(run_start.get("config", {}), "")
    for key in ("world_size", "device", "flex_backend", "resumed_from", "total_steps", "warmup_steps", "drafter_params",
                "target_layer_ids", "mask_token_id"):
        if key in run_start:
            flat[f"run.{key}"] = run_start[key]
    return flat


def _scalar(value: Any) -> bool | int | float | str:
    """Hyperparameter values as the stricter trackers take them: lists and None as text."""
    return value if isinstance(value, (bool, int, float, str)) else json.dumps(value)


class TensorBoardSink:
    """Event files in RUN/tensorboard: scalars, the config in the HParams tab and as text."""

    name = "tensorboard"

    def __init__(self, run_dir: Path) -> None:
        import torch.utils.tensorboard  # noqa: F401 - fail here, not at the first record

        self._dir = run_dir
        self.logdir = run_dir / "tensorboard"
        self._writer: Any = None

    def write(self, record: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        kind, step = record["kind"], record["step"]
        if kind == "run_start":
            self.close()
            prev = recall(self._dir, self.name, record)
            # purge_step: events at or after the first replayed step are dropped from the old files
            purge = record["resumed_from"] + 1 if prev else None
            self._writer = SummaryWriter(log_dir=prev["logdir"] if prev else str(self.logdir), purge_step=purge)
            remember(self._dir, self.name, {"logdir": str(self.logdir)})
            params = {k: _scalar(v) for k, v in hyperparameters(record).items()}
            file_writer = self._writer._get_file_writer()
            for summary in hparams(params, {"train/loss": 0.0, "train/tau_est": 0.0, "eval/tau": 0.0}):
                file_writer.add_summary(summary)
            config_yaml = yaml.safe_dump(record.get("config", {}), sort_keys=False)
            self._writer.add_text("config", "    " + config_yaml.replace("\n", "\n    "), step)
        if self._writer is None:
            return
        for key, value in metrics(record).items():
            self._writer.add_scalar(key, value, step, walltime=record["time"])
        if kind == "checkpoint":
            self._writer.add_text("checkpoint", record.get("path", ""), step)
        elif kind == "run_end":
            self._writer.add_text("run_end", f"{record['status']}: {record.get('reason') or ''}", step)
            self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class WandbSink:
    """A W&B run in RUN/wandb; WANDB_MODE=offline keeps it local (`wandb sync` uploads it later).
    Every metric is plotted against `step`, so the steps a rollback repeats are kept, not dropped."""

    name = "wandb"

    def __init__(self, run_dir: Path) -> None:
        import wandb

        self._wandb = wandb
        self._dir = run_dir
        self._run: Any = None

    def write(self, record: dict[str, Any]) -> None:
        kind = record["kind"]
        if kind == "run_start":
            self.close()
            prev = recall(self._dir, self.name, record)
            self._run = self._wandb.init(
                project=prev["project"] if prev else os.environ.get("WANDB_PROJECT", "blockdraft"),
                id=prev["id"] if prev else None, resume="allow" if prev else None, name=self._dir.name,
                dir=str(self._dir), config=None if prev else hyperparameters(record),
                settings=self._wandb.Settings(console="off"))
            if prev:  # a resume may change settings (a longer max_steps): the config takes the new values
                self._run.config.update(hyperparameters(record), allow_val_change=True)
            remember(self._dir, self.name, {"id": self._run.id, "project": self._run.project})
            self._run.define_metric("step")
            self._run.define_metric("*", step_metric="step")
        if self._run is None:
            return
        values = metrics(record)
        if values:
            self._run.log({"step": record["step"], **values})
        if kind == "checkpoint":
            self._run.summary["checkpoint"] = record.get("path")
        elif kind == "run_end":
            self._run.summary["status"] = record["status"]
            self._run.finish(exit_code=1 if record["status"] == "failed" else 0)
            self._run = None

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


class TrackioSink:
    """A Trackio run (local SQLite under TRACKIO_DIR; `trackio show` opens the dashboard); the
    project is TRACKIO_PROJECT or `blockdraft`, the run is named after the run folder."""

    name = "trackio"

    def __init__(self, run_dir: Path) -> None:
        import trackio

        self._trackio = trackio
        self._dir = run_dir
        self._run: Any = None

    def write(self, record: dict[str, Any]) -> None:
        kind = record["kind"]
        if kind == "run_start":
            self.close()
            prev = recall(self._dir, self.name, record) or {}
            project = prev.get("project") or os.environ.get("TRACKIO_PROJECT", "blockdraft")
            name = prev.get("name") or self._dir.name
            self._run = self._trackio.init(project=project, name=name, config=hyperparameters(record),
                                           resume="allow")
            remember(self._dir, self.name, {"project": project, "name": name})
        if self._run is None:
            return
        values = metrics(record)
        if values:
            self._run.log(values, step=record["step"])
        if kind == "run_end":
            self.close()

    def close(self) -> None:
        if self._run is not None:
            self._trackio.finish()  # the module's finish, which also clears the run its exit hook would finish
            self._run = None


class MlflowSink:
    """An MLflow run: at MLFLOW_TRACKING_URI when set, else in a file store at RUN/mlruns; the
    experiment is MLFLOW_EXPERIMENT_NAME or `blockdraft`."""

    name = "mlflow"
    _STATUS = {"completed": "FINISHED", "interrupted": "KILLED", "failed": "FAILED"}

    def __init__(self, run_dir: Path) -> None:
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (run_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for it; the store works
        from mlflow.tracking import MlflowClient

        self.tracking_uri = uri
        self._client = MlflowClient(tracking_uri=uri)
        self._dir = run_dir
        self._run_id: str | None = None

    def write(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric, Param

        kind = record["kind"]
        if kind == "run_start":
            self.close()
            logged = self._reopen(recall(self._dir, self.name, record))
            if self._run_id is None:
                name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "blockdraft")
                experiment = self._client.get_experiment_by_name(name)
                experiment_id = experiment.experiment_id if experiment else self._client.create_experiment(name)
                self._run_id = self._client.create_run(experiment_id, run_name=self._dir.name).info.run_id
            remember(self._dir, self.name, {"run_id": self._run_id, "tracking_uri": self.tracking_uri})
            # params cannot change once logged: a resume adds only the ones the run lacks
            params = [Param(k, str(_scalar(v))[:6000]) for k, v in hyperparameters(record).items() if k not in logged]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
                self._client.log_batch(self._run_id, params=params[i : i + 100])
        if self._run_id is None:
            return
        stamp = int(record["time"] * 1000)
        values = [Metric(k, v, stamp, record["step"]) for k, v in metrics(record).items()]
        if values:
            self._client.log_batch(self._run_id, metrics=values)
        if kind == "checkpoint":
            self._client.set_tag(self._run_id, "checkpoint", record.get("path"))
        elif kind == "run_end":
            self._client.set_terminated(self._run_id, self._STATUS.get(record["status"], "FINISHED"))
            self._run_id = None

    def _reopen(self, prev: dict[str, Any] | None) -> set[str]:
        """Set the stored run running again (same run_id) when it is still in this store; its params."""
        if not prev or prev.get("tracking_uri") != self.tracking_uri:
            return set()
        from mlflow.exceptions import MlflowException

        try:
            run = self._client.get_run(prev["run_id"])
        except MlflowException:
            return set()
        self._run_id = run.info.run_id
        self._client.update_run(self._run_id, status="RUNNING")
        return set(run.data.params)

    def close(self) -> None:
        if self._run_id is not None:
            self._client.set_terminated(self._run_id, "KILLED")
            self._run_id = None


SINKS: dict[str, type] = {sink.name: sink for sink in (TensorBoardSink, WandbSink, TrackioSink, MlflowSink)}


def open_trackers(names: list[str], run_dir: Path) -> list[Sink]:
    """One sink per tracker named in `train.trackers` (duplicates once), for the RunLog to feed."""
    names = list(dict.fromkeys(names))
    require_trackers(names)
    return [SINKS[name](run_dir) for name in names]
