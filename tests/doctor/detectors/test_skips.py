"""Non-finite values and skipped steps."""

from __future__ import annotations

import json

from blockdraft.doctor.detectors import diagnose
from blockdraft.doctor.records import parse_log_bytes

from ..conftest import find


def test_unguarded_nan_is_an_error_guarded_is_a_warning():
    def log(skipped):
        recs = [{"kind": "step", "step": i, "loss": 1.0, "grad_norm": 0.5, "skipped": False} for i in range(1, 100)]
        recs[50].update(loss=float("nan"), skipped=skipped)
        return "".join(json.dumps(r) + "\n" for r in recs).encode()


    assert find(diagnose(parse_log_bytes(log(False), {})), "nonfinite")[0].severity == "error"
    found = find(diagnose(parse_log_bytes(log(True), {})), "nonfinite")[0]
    assert found.severity == "warning" and found.steps == (51, 51)


def test_skipped_burst(run_factory):
    run, _, findings = run_factory(2, ("skipped_steps",))
    found = find(findings, "skipped_steps")
    assert found and found[0].severity == "warning"
    assert found[0].evidence["skipped"] >= 5
