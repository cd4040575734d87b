import json
import math
import time

from blockdraft.doctor.live import LiveDoctor
from tests.doctor import synthetic


def _steps(n, **extra):
    for i in range(1, n + 1):
        rec = {
            "kind": "step",
            "step": i,
            "time": float(i),
            "step_time": 1.0,
            "lr": 1e-4,
            "loss": 2.0 + 0.01 * math.sin(i),
            "grad_norm": 0.5,
            "skipped": False,
        }
        rec.update(extra)
        yield rec


def test_nan_reported_at_once_and_only_once():
    doctor = LiveDoctor()
    out = []
    for rec in _steps(300):
        if rec["step"] in (120, 121, 200):
            rec["loss"] = float("nan")
        out += [(rec["step"], f) for f in doctor.observe(rec)]
    nan = [(s, f) for s, f in out if f.code == "nonfinite"]
    assert len(nan) == 1 and nan[0][0] == 120 and nan[0][1].severity == "error"


def test_guarded_then_unguarded_escalates_once():
    doctor = LiveDoctor()
    first = doctor.observe({"kind": "step", "step": 1, "loss": float("inf"), "skipped": True})
    again = doctor.observe({"kind": "step", "step": 2, "loss": float("inf"), "skipped": True})
    worse = doctor.observe({"kind": "step", "step": 3, "loss": float("nan"), "skipped": False})
    assert [f.severity for f in first] == ["warning"] and not again and [f.severity for f in worse] == ["error"]


def test_config_problems_reported_early():
    config = {
        "optim": {"betas": [0.9, 0.95]},
        "drafter": {"block_size": 16},
        "loss": {"weighting": "exp_decay", "gamma": 4.0},
    }
    doctor = LiveDoctor(config=config)
    found = []
    for rec in _steps(5):
        found += doctor.observe(rec)
    assert [f.code for f in found] == ["loss_decay_gamma"]


def test_slow_checkpoint_is_reported_when_written():
    doctor = LiveDoctor()
    for rec in _steps(100):
        doctor.observe(rec)
    found = doctor.observe({"kind": "checkpoint", "step": 100, "stall_s": 140.0})
    assert [f.code for f in found] == ["checkpoint_stall"]
    assert not doctor.observe({"kind": "checkpoint", "step": 200, "stall_s": 150.0})


def test_live_finds_the_incident_and_stays_cheap():
    run = synthetic.generate(7, anomalies=["homogeneous_batches", "loss_decay_gamma"], n_steps=1500, style="ours")
    doctor = LiveDoctor()
    found = []
    start = time.perf_counter()
    count = 0
    for rec in run.records:
        rec = json.loads(json.dumps(rec))
        found += doctor.observe(rec)
        count += 1
    per_call = (time.perf_counter() - start) / count
    got = {f.code for f in found}
    assert {"homogeneous_batches", "loss_decay_gamma"} <= got
    assert len(found) == len({(f.code, f.severity) for f in found})
    assert per_call < 0.01


def test_clean_run_is_silent_live():
    run = synthetic.generate(12, n_steps=1500, style="ours")
    doctor = LiveDoctor()
    found = [f for rec in run.records for f in doctor.observe(json.loads(json.dumps(rec)))]
    assert not found


def test_nonfinite_list_from_our_writer():
    doctor = LiveDoctor()
    found = doctor.observe({"kind": "step", "step": 7, "loss": None, "nonfinite": ["loss"], "skipped": False})
    assert [(f.code, f.severity) for f in found] == [("nonfinite", "error")]


def test_live_doctor_keeps_the_data_record_for_forced_bucket_runs():
    """The trainer writes `data` at step 0; the live window must still see its run_bound."""
    from blockdraft.doctor.live import LiveDoctor

    doctor = LiveDoctor(every=50)
    doctor.observe({"kind": "run_start", "step": 0, "time": 0.0, "config": {"data": {"max_same_bucket_run": 3}}})
    doctor.observe({"kind": "data", "step": 0, "time": 0.0, "run_bound": 15})
    found = []
    for i, b in enumerate(([1] * 14 + [0]) * 10):
        found += doctor.observe({"kind": "step", "step": i + 1, "time": float(i), "loss": 3.0, "buckets": [b]})
    assert "homogeneous_batches" not in {f.code for f in found}
