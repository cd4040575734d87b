"""Queue drain, data wait and throughput drift."""

from __future__ import annotations

from blockdraft.doctor.detectors import diagnose

from ..conftest import codes, find, log_of, step_records


def test_queue_drain_projects_time_to_empty():
    recs = step_records(2000)
    for r in recs:
        r["queue_depth"] = round(300 - 0.04 * r["step"])
    found = find(diagnose(log_of(recs)), "queue_drain")
    assert found
    assert 4000 <= found[0].evidence["steps_to_empty"] <= 6000


def test_full_queue_is_quiet():
    recs = step_records(2000)
    for r in recs:
        r["queue_depth"] = 4 if r["step"] % 7 else 3
    assert "queue_drain" not in codes(diagnose(log_of(recs)))


def test_data_wait_stretch(run_factory):
    run, _, findings = run_factory(6, ("data_wait",))
    found = find(findings, "data_wait")
    assert found and found[0].severity == "warning"
    assert found[0].evidence["worst_window_share"] >= 0.2


def test_throughput_drift(run_factory):
    _, _, findings = run_factory(8, ("throughput_drift",))
    found = find(findings, "throughput_drift")
    assert found and found[0].evidence["ratio_late_to_early"] < 0.85
