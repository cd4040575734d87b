"""The train hooks, after each update: the live doctor judges every record at once and runs the full
analysis at most every N updates and S seconds; the time budget logs each re-plan of the schedule."""

import time
from types import SimpleNamespace

from blockdraft.telemetry.log import RunLog, read_log
from blockdraft.train.hooks import LiveDoctorHook, StepEnd, TimeBudgetHook


def _hook(tmp_path, **kwargs):
    log = RunLog(tmp_path / "log.jsonl")
    clock = [0.0]
    trainer = SimpleNamespace(log=log, step=0, console=SimpleNamespace(note=lambda *a, **k: None))
    hook = LiveDoctorHook(trainer, clock=lambda: clock[0], **kwargs)
    hook.on_start()
    analyses: list[int] = []
    analyse = hook.doctor.analyse
    hook.doctor.analyse = lambda: analyses.append(trainer.step) or analyse()

    def step(k: int, dt: float, **fields):
        clock[0] += dt
        trainer.step = k
        record = log.write("step", k, loss=fields.pop("loss", 2.0), grad_norm=0.5, skipped=False, step_time=dt,
                           **fields)
        hook.on_step_end(StepEnd(record, [], dt, None))

    return log, step, analyses


def test_the_analysis_waits_for_both_the_update_count_and_the_time(tmp_path):
    _, step, analyses = _hook(tmp_path, every=10, min_interval_s=5.0)
    for k in range(1, 41):
        step(k, 0.1)  # 10 updates take 1 s: the clock decides
    assert analyses == []
    for k in range(41, 61):
        step(k, 1.0)  # 10 updates take 10 s: every 10th update
    assert analyses == [41, 51]  # 5 s reached at update 41; then 10 updates apart


def test_a_nonfinite_loss_is_reported_at_its_own_update(tmp_path):
    log, step, analyses = _hook(tmp_path, every=1000, min_interval_s=1e9)
    step(1, 0.1)
    step(2, 0.1, loss=float("nan"))
    warnings = [r for r in read_log(log.path) if r["kind"] == "warning"]
    assert [(w["code"], w["step"]) for w in warnings] == [("nonfinite", 2)] and analyses == []


def test_every_time_budget_replan_is_logged_and_only_those_that_move_the_end_2_percent_are_shown(tmp_path):
    log, notes, total = RunLog(tmp_path / "log.jsonl"), [], [100_000]
    trainer = SimpleNamespace(
        log=log, step=0, device=SimpleNamespace(type="cpu"), started=time.time(), warmup_steps=10,
        cfg=SimpleNamespace(train=SimpleNamespace(max_minutes=1.0)),
        console=SimpleNamespace(note=lambda message, **_: notes.append(message)),
        shorten_schedule=lambda n: total.__setitem__(0, n))
    hook = TimeBudgetHook(trainer, max_minutes=1.0)
    for k in range(1, 42):
        trainer.step, trainer.total_steps = k, total[0]
        hook.on_step_end(StepEnd({}, [], 0.01, None))  # 0.97 * 60 s at 0.01 s: about 5,800 updates fit
    planned = [r for r in read_log(log.path) if r.get("code") == "schedule_planned"]
    assert [r["step"] for r in planned] == [11, 41]  # the looks after 10 and 40 measured updates
    assert abs(planned[1]["total_steps"] - planned[0]["total_steps"]) < 0.02 * planned[0]["total_steps"]
    assert len(notes) == 1 and "not 100000" in notes[0] and "update 1 took" not in notes[0]  # under 1 s
