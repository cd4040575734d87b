"""The live-doctor hook judges what the log wrote, after the update: every record at once, the full
analysis runs at most every N updates and S seconds."""

from types import SimpleNamespace

from blockdraft.telemetry.log import RunLog, read_log
from blockdraft.train.hooks import LiveDoctorHook, StepEnd


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
