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


def _guarded_log(n_steps: int, skipped_at: tuple[int, ...]) -> bytes:
    recs = [{"kind": "step", "step": i, "loss": 1.0, "grad_norm": 0.5, "skipped": i in skipped_at}
            for i in range(1, n_steps + 1)]
    skips = [{"kind": "skip", "step": i, "reason": "grad_norm_spike", "batch_ids": ["1:7"], "bucket": 1}
             for i in skipped_at]
    return "".join(json.dumps(r) + "\n" for r in recs + skips).encode()


def test_one_refused_outlier_is_info_however_short_the_run():
    for n_steps in (400, 2000):
        found = find(diagnose(parse_log_bytes(_guarded_log(n_steps, (256,)), {})), "skipped_steps")
        assert found[0].severity == "info" and found[0].evidence["skipped"] == 1 and found[0].steps == (256, 256)


def test_repeated_refusals_in_a_short_run_are_a_warning():
    found = find(diagnose(parse_log_bytes(_guarded_log(400, (186, 312)), {})), "skipped_steps")
    assert found[0].severity == "warning" and found[0].evidence["skipped"] == 2
    found = find(diagnose(parse_log_bytes(_guarded_log(4000, (186, 312)), {})), "skipped_steps")
    assert found[0].severity == "info"  # 2 in 4,000: under 0.1% and fewer than 4
