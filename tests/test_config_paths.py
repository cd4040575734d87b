"""Paths in a config file are read against the file's folder, hub ids are left for the cache, and
`blockdraft train CONFIG --print-config` shows the resolved config without training."""

from __future__ import annotations

from pathlib import Path

import yaml

from blockdraft.cli import main
from blockdraft.config import CONFIG_PATHS, Config, load_config

ROOT = Path(__file__).resolve().parents[1]


def _write(folder: Path, raw: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_relative_paths_are_read_against_the_config_folder(tmp_path, monkeypatch):
    (tmp_path / "exp" / "models" / "tiny").mkdir(parents=True)
    config = _write(tmp_path / "exp", {
        "target": {"path": "models/tiny"},
        "data": {"train_files": ["data/a.jsonl", "/abs/b.jsonl"], "cache_dir": "~/cache"},
        "train": {"out_dir": "../runs/x"},
        "eval": {"prompts": ["data/heldout.jsonl"]},
    })
    monkeypatch.chdir(tmp_path / "exp" / "models")  # anywhere else
    cfg = load_config(config, ["train.seed=3"])
    assert cfg.target.path == str(tmp_path / "exp" / "models" / "tiny")
    assert cfg.data.train_files == [str(tmp_path / "exp" / "data" / "a.jsonl"), "/abs/b.jsonl"]
    assert cfg.data.cache_dir == str(Path("~/cache").expanduser())
    assert cfg.train.out_dir == str(tmp_path / "runs" / "x")
    assert cfg.eval.prompts == [str(tmp_path / "exp" / "data" / "heldout.jsonl")]


def test_a_hub_id_stays_a_hub_id_and_overrides_stay_relative_to_the_shell(tmp_path):
    config = _write(tmp_path, {"target": {"path": "Qwen/Qwen3-8B"}})
    assert load_config(config).target.path == "Qwen/Qwen3-8B"
    assert load_config(config, ["train.out_dir=runs/y"]).train.out_dir == "runs/y"


def test_every_listed_path_is_a_config_field():
    for dotted in CONFIG_PATHS:
        section, key = dotted.split(".")
        assert key in Config.model_fields[section].annotation.model_fields, dotted


def test_shipped_demo_config_works_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    assert Path(cfg.target.path, "config.json").is_file()
    assert cfg.train.out_dir == str(ROOT / "runs" / "demo")


def test_print_config_prints_every_default_resolved_and_does_not_train(tmp_path, capsys):
    config = _write(tmp_path / "exp", {"target": {"path": "./models/tiny"}, "train": {"max_steps": 5}})
    assert main(["train", str(config), "optim.lr=1e-4", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["target"]["path"] == str(tmp_path / "exp" / "models" / "tiny")
    assert printed["optim"]["lr"] == 1e-4 and printed["train"]["max_steps"] == 5
    assert printed["train"]["log_every_s"] == 30 and printed["train"]["trackers"] == []
    assert set(printed) == set(Config.model_fields)
    assert Config.model_validate(printed).model_dump(mode="json") == printed  # a config one can run as is
    assert not (tmp_path / "exp" / "runs").exists()
