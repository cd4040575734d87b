"""Epoch bookkeeping: the run's progress against the batches, a re-planned schedule."""

from __future__ import annotations

from ..conftest import find


def test_epoch_progress_of_the_whole_run_is_caught(run_factory):
    for seed in (2, 3):
        _, _, findings = run_factory(seed, ("epoch_accounting",))
        found = find(findings, "epoch_accounting")
        assert found and found[0].severity == "warning"


def test_a_replanned_schedule_is_no_epoch_bookkeeping_error():
    """train.max_minutes re-plans total_steps: progress counts against 904 updates, then against 3240."""
    from blockdraft.doctor.detectors import diagnose
    from blockdraft.doctor.records import run_from_records

    recs = [{"kind": "run_start", "time": 0.0, "step": 0, "schema": 1, "total_steps": 3240, "warmup_steps": 130,
             "config": {"train": {"epochs": 1, "max_steps": None}}}]
    total = 904
    for k in range(1, 330):
        if k == 162:
            recs.append({"kind": "warning", "time": float(k), "step": 161, "code": "schedule_planned",
                         "severity": "info", "message": "", "total_steps": 3240, "warmup_steps": 130})
            total = 3240
        recs.append({"kind": "step", "time": float(k), "step": k, "loss": 2.0, "lr": 1e-3, "epoch": 0,
                     "epoch_progress": k / 3240, "progress": k / total})
    assert not [f for f in diagnose(run_from_records(recs)) if f.code == "epoch_accounting"]
