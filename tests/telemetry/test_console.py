"""The console a person watches: a bar cropped to the terminal, plain whole lines elsewhere, an ETA
only once there is a pace to base it on."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from blockdraft.telemetry import console as console_module
from blockdraft.telemetry.console import Pace, TrainConsole


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(console_module.time, "time", c)
    return c


def _rec(k: int, **extra) -> dict:
    return {"kind": "step", "step": k, "loss": 2.5, "acc": 0.41, "tau_est": 3.2, "lr": 3e-4, "tokens": 1000,
            "step_time": 0.5, "epoch": 1, "epoch_progress": 0.41, "skipped": False, "skip_reason": None, **extra}


def test_pace_has_no_rate_on_the_first_step_and_forgets_a_slow_start():
    pace = Pace(window=4)
    pace.add(1, 0.0, 100, 30.0)  # a first step that compiles for 30 s
    assert pace.seconds_per_step() is None
    for k in range(2, 10):
        pace.add(k, 30.0 + (k - 1) * 2.0, 100, 2.0)
    assert pace.seconds_per_step() == pytest.approx(2.0)
    assert pace.tokens_per_second() == pytest.approx(50.0)
    pace.add(5, 100.0, 100, 2.0)  # a rollback to step 5
    assert pace.seconds_per_step() is None


def test_plain_lines_come_every_log_every_s_and_at_notes_and_at_the_end(clock):
    out = io.StringIO()
    with TrainConsole(100, epochs=6, log_every_s=10, terminal=False, stream=out) as tc:
        for k in range(1, 26):
            clock.now += 2.0
            tc.step(_rec(k))
            if k == 15:
                tc.note("checkpoint runs/x/checkpoints/step-000015")
    lines = out.getvalue().splitlines(keepends=True)
    assert all(line.endswith("\n") and line.count("\n") == 1 for line in lines)
    steps = [line.split(" step ")[1].split("/")[0] for line in lines if " step " in line]
    assert steps == ["1", "6", "11", "15", "20", "25"]  # every 10 s at 2 s/step, the note's, the last
    assert "checkpoint runs/x" in lines[4] and " step 15/100" in lines[3]
    first, later = lines[0], lines[2]
    assert "ETA --" in first and "ETA 0:00" not in first
    assert "step 11/100 11%" in later and "ETA 2:58" in later and "2.00 s/step" in later
    assert "loss 2.5000" in later and "acc 0.410" in later and "tau_est 3.20" in later and "lr 3.00e-04" in later
    assert "2,000 tok/s" in later and "epoch 2/6 41%" in later and "elapsed 0:22" in later


def test_nothing_is_printed_when_disabled(clock):
    out = io.StringIO()
    with TrainConsole(10, epochs=1, enabled=False, terminal=False, stream=out) as tc:
        tc.step(_rec(1))
        tc.note("hello")
    assert out.getvalue() == ""


@pytest.mark.parametrize("width", [40, 80, 200])
def test_the_terminal_bar_never_runs_past_the_terminal(clock, width):
    tc = TrainConsole(1000, epochs=6, terminal=True)
    for k in range(1, 12):
        clock.now += 1.5
        tc.step(_rec(k, skipped=k == 11, skip_reason="loss_spike"))
    screen = Console(width=width, file=io.StringIO(), force_terminal=True, color_system=None)
    screen.print(tc)
    lines = screen.file.getvalue().splitlines()
    assert len(lines) == 2 and all(len(line) <= width for line in lines)
    if width == 200:
        assert "step 11/1000" in lines[0] and "ETA 24:43" in lines[0] and "1.50 s/step" in lines[0]
        assert "epoch 2/6 41%" in lines[1] and "[skipped: loss_spike]" in lines[1] and "skips 1" in lines[1]
