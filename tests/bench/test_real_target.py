"""bench/real_target.sh, the real-target recipe of docs/real-targets.md, end to end on a SmolLM2-shaped tiny
target: regenerate -> data -> train (a copy of configs/smollm2-135m.yaml at test sizes) -> export -> eval.
The prompts are written here; the stage that makes them is tests/scripts/test_make_stdlib_prompts.py's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[2]
SHRINK = {"drafter": {"target_layer_ids": [0, 2], "block_size": 4}, "data": {"max_len": 96, "tokens_per_batch": 384},
          "train": {"max_steps": 4, "save_every": 4, "eval_every": 4, "num_anchors": 8, "precision": "fp32"},
          "eval": {"max_prompts": 2, "max_new_tokens": 8}}


def _shrunk_config(path: Path) -> Path:
    """configs/smollm2-135m.yaml with the sizes of a test: every stage reads the same file, as a user's would."""
    cfg = yaml.safe_load((ROOT / "configs" / "smollm2-135m.yaml").read_text())
    for section, values in SHRINK.items():
        cfg[section].update(values)
    path.write_text(yaml.safe_dump(cfg))
    return path


def _prompts(path: Path, n: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"messages": [{"role": "user", "content": f"Write a function number {i}."}]}) + "\n")


def test_the_recipe_runs_from_written_prompts_to_a_measured_drafter(tmp_path: Path, tiny_llama_target: Path) -> None:
    out = tmp_path / "smollm2"
    _prompts(out / "prompts" / "train.jsonl", 24)
    _prompts(out / "prompts" / "heldout.jsonl", 4)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "LAYERS": "1", "REGEN_BATCH": "8", "REGEN_TOKENS": "12", "REGEN_SHARD": "16", "REGEN_PROMPT_TOKENS": "64",
           "REGEN_CHUNK": "4", "EVAL_PROMPTS": "2", "EVAL_TOKENS": "8", "BUDGETS": "4", "DEVICE": "cpu",
           "TRAIN_MINUTES": "10", "CONFIG": str(_shrunk_config(tmp_path / "smollm2-tiny.yaml"))}
    done = subprocess.run(["bash", str(ROOT / "bench" / "real_target.sh"), str(tiny_llama_target), str(out),
                           "regen", "data", "train", "eval"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list((out / "regenerated").glob("shard-*.jsonl"))) == 2  # 24 conversations, 16 a shard
    data = json.loads((out / "data.json").read_text())  # blockdraft data's report of the regenerated set
    assert data["samples_total"] == 24 and data["samples_used"] > 0 and data["loss_tokens"] > 0
    run = out / "run-l1"
    steps = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r["kind"] == "step"] == [1, 2, 3, 4]
    assert (run / "export" / "config.json").is_file()
    b1, b8 = (json.loads((run / name).read_text()) for name in ("eval-b1.json", "eval-b8.json"))
    assert (b1["prompts"], b1["batch_size"], b8["prompts"], b8["batch_size"]) == (2, 1, 4, 8)
    assert len(b1["modes"]) == 2  # the path decoder and DDTree at budget 4
    assert all(r["tau"] >= 1.0 and r["tokens"] > 0 for r in (b1, b8))
