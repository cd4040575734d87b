"""scripts/make_stdlib_prompts.py: the real-target recipe's prompts, split by file as the demo corpus is."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from blockdraft.corpus import part_of

SCRIPT = Path(__file__).parents[2] / "scripts" / "make_stdlib_prompts.py"
_spec = importlib.util.spec_from_file_location("make_stdlib_prompts", SCRIPT)
prompts_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prompts_script)

SOURCE = '''
def {name}_clamp(x, lo, hi):
    """Return x limited to the closed range [lo, hi]."""
    return max(lo, min(x, hi))


def {name}_mean(values):
    """The arithmetic mean of a non-empty sequence."""
    return sum(values) / len(values)
'''


def _names(part: str, n: int) -> list[str]:
    names = (f"pkg/mod{i}.py" for i in range(10_000))
    return [name for name in names if part_of(name) == part][:n]


def test_prompts_come_from_the_files_of_their_split(tmp_path: Path) -> None:
    (heldout,), train = _names("heldout", 1), _names("target", 2)
    for rel, name in ((heldout, "held"), *((t, f"train{i}") for i, t in enumerate(train))):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(SOURCE.format(name=name))
    held = prompts_script.build("heldout", 100, seed=0, root=tmp_path)
    trained = prompts_script.build("train", 100, seed=0, per_function=2, root=tmp_path)
    assert len(held) == 2 and all("held_" in p for p in held)  # one prompt per documented function
    assert len(trained) == 2 * 2 * 2 and not any("held_" in p for p in trained)
    assert len(set(trained)) == len(trained)  # two templates per function, never the same prompt twice


def test_the_command_writes_chat_records_and_a_manifest(tmp_path: Path, monkeypatch) -> None:
    for rel in (*_names("heldout", 2), *_names("target", 2)):
        (tmp_path / "lib" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "lib" / rel).write_text(SOURCE.format(name="f"))
    monkeypatch.setattr(prompts_script, "STDLIB", tmp_path / "lib")
    out = tmp_path / "prompts"
    subprocess.run([sys.executable, str(SCRIPT), "--help"], check=True, capture_output=True)
    argv = ["make_stdlib_prompts.py", "--out", str(out), "--max-train", "3", "--max-heldout", "2"]
    monkeypatch.setattr(sys, "argv", argv)
    prompts_script.main()
    lines = (out / "train.jsonl").read_text().splitlines()
    assert len(lines) == 3
    assert json.loads(lines[0])["messages"][0]["role"] == "user"
    assert json.loads((out / "manifest.json").read_text())["counts"] == {"train": 3, "heldout": 2}
