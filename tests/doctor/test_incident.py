"""The seed incident end to end: every listed cause must show up, each under its own code."""

from blockdraft.doctor.findings import at_least
from tests.doctor import synthetic

from .conftest import analyse

INCIDENT = (
    "homogeneous_batches",
    "checkpoint_stall",
    "loss_decay_gamma",
    "optimizer_betas",
    "noise_schedule_flat",
    "warmup_first_step",
    "epoch_accounting",
    "queue_drain",
)


def test_incident_shaped_run(tmp_path):
    run = synthetic.generate(8743, anomalies=INCIDENT, n_steps=4635, style="ours")
    _, findings = analyse(tmp_path, run)
    found = {f.code for f in findings if at_least(f.severity, "warning")}
    missed = [p.code for p in run.planted if not any(synthetic.matches(p, f) for f in findings)]
    assert not missed, f"missed {missed}; found {sorted(found)}"
    assert findings[0].severity == "error" or findings[0].code in INCIDENT


def test_incident_monitor_window_after_stall(tmp_path):
    """A windowed monitor stalls at a save, then logs a 2-step window with one bad batch (loss 13)."""
    run = synthetic.generate(2029, anomalies=["window_artifact"], n_steps=4635)
    _, findings = analyse(tmp_path, run)
    art = [f for f in findings if f.code == "window_artifact"]
    assert art and art[0].evidence["window_steps"] <= 2
    assert not [f for f in findings if f.code == "loss_spike"]
