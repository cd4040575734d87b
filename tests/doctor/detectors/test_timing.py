import json

from blockdraft.doctor.detectors import diagnose
from blockdraft.doctor.records import parse_log_bytes

from ..conftest import codes


def _find(findings, code):
    return [f for f in findings if f.code == code]


def _log(recs):
    return parse_log_bytes("".join(json.dumps(r) + "\n" for r in recs).encode(), {})


def _steps(n, dt=1.0, start=1, t0=0.0):
    return [
        {"kind": "step", "step": i, "time": t0 + dt * (i - start), "step_time": dt, "loss": 1.0}
        for i in range(start, start + n)
    ]


def test_checkpoint_that_held_the_loop():
    recs = _steps(400)
    for r in recs[200:]:
        r["time"] += 150.0
    recs.insert(200, {"kind": "checkpoint", "step": 200, "time": 199.5, "stall_s": 150.0, "committed": True})
    found = _find(diagnose(_log(recs)), "checkpoint_stall")
    assert found and found[0].evidence["max_stall_s"] == 150.0 and found[0].evidence["logging_only"] == 0


def test_checkpoint_where_only_logging_stopped():
    """The seed incident: training went on, the monitor was blocked, records 2001-2026 never written."""
    recs = [r for r in _steps(3000, dt=10.0) if not 2000 < r["step"] < 2027]
    recs.insert(2000, {"kind": "checkpoint", "step": 2000, "time": 19990.5, "stall_s": 0.2})
    findings = diagnose(_log(recs))
    found = _find(findings, "checkpoint_stall")
    assert found and found[0].evidence["missing_records"] == 26 and found[0].evidence["logging_only"] == 1
    assert "logging_gap" not in codes(findings)


def test_unexplained_stall_and_missing_records():
    recs = _steps(1000)
    for r in recs[500:]:
        r["time"] += 300.0
    recs = [r for r in recs if not 800 < r["step"] < 850]
    found = _find(diagnose(_log(recs)), "logging_gap")
    assert found and found[0].evidence["stalls"] == 1 and found[0].evidence["missing_records"] == 49


def test_eval_pause_is_explained():
    recs = _steps(1000)
    for r in recs[500:]:
        r["time"] += 120.0
    recs.insert(500, {"kind": "eval", "step": 500, "time": 620.0, "tau": 3.0})
    assert "logging_gap" not in codes(diagnose(_log(recs)))


def test_window_artifact_in_a_windowed_log(run_factory):
    run, _, findings = run_factory(3, ("window_artifact",), style=None)
    found = _find(findings, "window_artifact")
    assert run.style == "windowed" and found
    assert found[0].evidence["window_steps"] <= 2
    assert "loss_spike" not in codes(findings)


def test_queue_drain_projects_time_to_empty():
    recs = _steps(2000)
    for r in recs:
        r["queue_depth"] = round(300 - 0.04 * r["step"])
    found = _find(diagnose(_log(recs)), "queue_drain")
    assert found
    assert 4000 <= found[0].evidence["steps_to_empty"] <= 6000


def test_full_queue_is_quiet():
    recs = _steps(2000)
    for r in recs:
        r["queue_depth"] = 4 if r["step"] % 7 else 3
    assert "queue_drain" not in codes(diagnose(_log(recs)))


def test_data_wait_stretch(run_factory):
    run, _, findings = run_factory(6, ("data_wait",))
    found = _find(findings, "data_wait")
    assert found and found[0].severity == "warning"
    assert found[0].evidence["worst_window_share"] >= 0.2


def test_throughput_drift(run_factory):
    _, _, findings = run_factory(8, ("throughput_drift",))
    found = _find(findings, "throughput_drift")
    assert found and found[0].evidence["ratio_late_to_early"] < 0.85


def test_periodic_pauses_without_records_are_scheduled_work():
    """A foreign log's evals every 500 steps pause training but write no record: info, not a warning."""
    recs = _steps(3000, dt=0.5)
    for r in recs:
        r["time"] += 45.0 * (r["step"] // 500)
    found = _find(diagnose(_log(recs)), "logging_gap")
    assert [f.severity for f in found] == ["info"] and found[0].evidence["period_steps"] == 500


def test_one_odd_stall_among_periodic_ones_still_warns():
    recs = _steps(3000, dt=0.5)
    for r in recs:
        r["time"] += 45.0 * (r["step"] // 500) + (120.0 if r["step"] > 1234 else 0.0)
    found = _find(diagnose(_log(recs)), "logging_gap")
    assert sorted(f.severity for f in found) == ["info", "warning"]
    warn = next(f for f in found if f.severity == "warning")
    assert warn.steps == (1234, 1235)


def test_a_resume_on_fewer_gpus_is_not_a_drift_nor_an_epoch_bug():
    """2 GPUs for 300 updates, then resumed on 1: tokens per update and epoch length halve and double
    there, for a reason the run_start records state (seen on 2x H200, 2026-11-29)."""

    def run_start(step, world):
        return {"kind": "run_start", "step": step, "time": float(step), "world_size": world,
                "batches_per_epoch": 600, "total_steps": 600,
                "config": {"train": {"grad_accum": 1, "epochs": 6, "max_steps": 600}}}

    def steps(lo, hi, world):
        return [{"kind": "step", "step": i, "time": float(i), "step_time": 0.1, "data_wait": 0.0, "loss": 1.0,
                 "tokens": 2048 * world, "epoch": 0, "epoch_progress": i * world / 600, "progress": i / 600}
                for i in range(lo, hi)]

    recs = [run_start(0, 2), *steps(1, 301, 2), run_start(300, 1), *steps(301, 601, 1)]
    found = codes(diagnose(_log(recs)))
    assert "throughput_drift" not in found and "epoch_accounting" not in found, found
    slowing = [{**r, "step_time": 0.1 * (1 + r["step"] / 300)} if r["kind"] == "step" else r for r in recs]
    assert "throughput_drift" in codes(diagnose(_log(slowing)))  # a real slowdown still shows through
