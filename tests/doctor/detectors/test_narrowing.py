"""Missing or odd fields narrow what is checked; they never crash a detector."""

import json

import pytest

from blockdraft.doctor.detectors import diagnose
from blockdraft.doctor.fields import STEP_FIELDS
from blockdraft.doctor.records import parse_log_bytes
from tests.doctor import synthetic

BASE = synthetic.generate(31, anomalies=["loss_spike", "checkpoint_stall"], n_steps=700, style="ours").records


def _diagnose(records):
    return diagnose(parse_log_bytes("".join(json.dumps(r) + "\n" for r in records).encode(), {}))


@pytest.mark.parametrize("field", STEP_FIELDS + ("buckets", "kind"))
def test_dropping_a_field_never_crashes(field):
    records = [{k: v for k, v in r.items() if not (r.get("kind") == "step" and k == field)} for r in BASE]
    for f in _diagnose(records):
        assert f.code and f.summary


def test_strings_and_garbage_values_are_tolerated():
    records = [dict(r) for r in BASE]
    for i, r in enumerate(records):
        if r.get("kind") == "step":
            r["loss"] = str(r["loss"]) if i % 3 else "n/a"
            r["buckets"] = "3" if i % 5 == 0 else r["buckets"]
            r["time"] = None if i % 7 == 0 else r["time"]
    records[0]["config"] = "not a dict"
    _diagnose(records)


def test_only_step_and_loss():
    found = _diagnose([{"step": i, "loss": 2.0 + (i % 3) * 0.01} for i in range(1, 400)])
    assert not [f for f in found if f.severity != "info"]


def test_a_log_with_only_run_start_still_checks_the_config():
    config = {
        "optim": {"betas": [0.9, 0.999]},
        "drafter": {"block_size": 16},
        "loss": {"weighting": "exp_decay", "gamma": 4},
    }
    found = _diagnose([{"kind": "run_start", "time": 1.0, "step": 0, "config": config}])
    assert {f.code for f in found} == {"optimizer_betas", "loss_decay_gamma"}
