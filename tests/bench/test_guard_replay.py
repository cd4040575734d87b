"""bench/guard_replay.py: a log's updates replayed through the step guard, as the run judged them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from blockdraft.config import GuardConfig

_spec = importlib.util.spec_from_file_location("guard_replay", Path(__file__).parents[2] / "bench" / "guard_replay.py")
guard_replay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(guard_replay)


def _steps(grad_norms: list[float]) -> list[dict]:
    return [{"kind": "step", "step": i + 1, "buckets": [0], "loss": 2.0 + 0.01 * (i % 3), "grad_norm": g}
            for i, g in enumerate(grad_norms)]


def test_ratios_and_refusals_follow_the_settings():
    healthy = [0.2 + 0.002 * (i % 3) for i in range(30)]
    steps = _steps([*healthy, 0.68, *healthy[:5], 1.2])  # 3.4x then 6x the window's median
    ratios, refused = guard_replay.replay(steps, GuardConfig())
    assert refused == [(37, "grad_norm_spike")]
    assert max(ratios["grad_norm"]) == pytest.approx(1.2 / 0.202)
    assert sorted(ratios["grad_norm"])[-2] == pytest.approx(0.68 / 0.202)
    assert len(ratios["loss"]) == len(steps) - 20  # judged once the window holds min_history values
    _, refused_at_3 = guard_replay.replay(steps, GuardConfig(grad_norm_min_ratio=3))
    assert refused_at_3 == [(31, "grad_norm_spike"), (37, "grad_norm_spike")]


def test_the_script_reads_a_log_and_prints_what_it_would_refuse(tmp_path, capsys, monkeypatch):
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in [{"kind": "run_start"}, *_steps([0.2] * 25 + [5.0])]))
    monkeypatch.setattr("sys.argv", ["guard_replay.py", str(log), "grad_norm_min_ratio=30"])
    assert guard_replay.main() == 0
    out = capsys.readouterr().out
    assert "26 step records" in out and "refused with grad_norm_min_ratio=30: 0" in out
    monkeypatch.setattr("sys.argv", ["guard_replay.py", str(log), "guard.grad_norm_min_ratio=30"])  # an override's form
    assert guard_replay.main() == 0
    assert "refused with guard.grad_norm_min_ratio=30: 0" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["/nope.jsonl"], "log not found: /nope.jsonl"),
    (["LOG", "oops"], "setting 'oops' is not of the form key=value"),
    (["LOG", "grad_norm_min_ratio=abc"], "config: guard.grad_norm_min_ratio: Input should be a valid number"),
    (["LOG", "guard.spike_k=abc"], "config: guard.spike_k: Input should be a valid number"),
])
def test_a_users_mistake_is_one_line_and_exit_code_2(tmp_path, capsys, monkeypatch, args, message):
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps(_steps([0.2])[0]) + "\n")
    monkeypatch.setattr("sys.argv", ["guard_replay.py", *(str(log) if a == "LOG" else a for a in args)])
    with pytest.raises(SystemExit) as exit_info:
        guard_replay.exit_script(guard_replay.main)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1
