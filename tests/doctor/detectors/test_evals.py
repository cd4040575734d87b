def test_tau_gap(run_factory):
    _, _, findings = run_factory(5, ("tau_gap",))
    found = [f for f in findings if f.code == "tau_gap"]
    assert found and found[0].severity == "warning" and found[0].evidence["median_ratio"] >= 1.3


def test_matching_tau_is_quiet(run_factory):
    _, _, findings = run_factory(5)
    assert not [f for f in findings if f.code == "tau_gap" and f.severity != "info"]


def _run(epochs: float, samples: int, steps_per_epoch: int = 40):
    from blockdraft.doctor.detectors import diagnose
    from blockdraft.doctor.records import run_from_records

    recs = [{"kind": "data", "time": 0.0, "step": 0, "samples_used": samples}]
    total = int(epochs * steps_per_epoch)
    for k in range(1, total + 1):
        e = (k - 1) / steps_per_epoch
        recs.append({"kind": "step", "time": float(k), "step": k, "loss": 3.0 - k / total, "acc": 0.3,
                     "tau_est": 1.5 + 5 * k / total, "lr": 1e-3, "epoch": int(e), "epoch_progress": e - int(e)})
    return [f for f in diagnose(run_from_records(recs)) if f.code == "data_repetition"]


def test_many_passes_over_a_few_hundred_samples_is_reported():
    found = _run(epochs=64, samples=320)
    assert found and found[0].severity == "warning"
    assert "64.0 passes over 320 samples" in found[0].summary and "held-out" in found[0].advice


def test_the_recipes_epochs_over_plenty_of_data_are_quiet():
    assert not _run(epochs=6, samples=800_000)
    assert _run(epochs=6, samples=3_778)[0].severity == "warning"  # the recipe's passes, but over little data


def _gap_run(window_tau_est: float, record_tau_est: float | None):
    """100 updates whose tau_est is `window_tau_est` save one lucky last batch at 4.7, then an eval that
    measured tau 2.8 and carries `record_tau_est` as its training estimate (None: the field absent)."""
    from blockdraft.doctor.detectors import diagnose
    from blockdraft.doctor.records import run_from_records

    recs = [{"kind": "step", "time": float(k), "step": k, "loss": 2.0, "acc": 0.4, "lr": 1e-3,
             "tau_est": 4.7 if k == 100 else window_tau_est} for k in range(1, 101)]
    ev = {"kind": "eval", "time": 101.0, "step": 100, "tau": 2.8, "prompts": 8, "mode": "path"}
    recs.append(ev if record_tau_est is None else {**ev, "tau_est_train": record_tau_est})
    return [f for f in diagnose(run_from_records(recs)) if f.code == "tau_gap"]


def test_the_gap_is_judged_on_the_updates_before_the_eval_not_on_one_batch():
    """A log that set its last update's tau_est beside the measured tau (blockdraft's demo did) is read
    by the window of step records before the eval."""
    assert _gap_run(window_tau_est=2.9, record_tau_est=4.7) == []
    (found,) = _gap_run(window_tau_est=4.0, record_tau_est=2.9)
    assert found.severity == "warning" and found.evidence["tau_est_train"] == 4.0
    (found,) = _gap_run(window_tau_est=4.0, record_tau_est=None)
    assert found.evidence["tau_est_train"] == 4.0


def test_a_log_without_training_estimates_in_its_steps_is_judged_on_its_eval_records():
    from blockdraft.doctor.detectors import diagnose
    from blockdraft.doctor.records import run_from_records

    recs = [{"kind": "step", "time": float(k), "step": k, "loss": 2.0, "lr": 1e-3} for k in range(1, 51)]
    recs.append({"kind": "eval", "time": 51.0, "step": 50, "tau": 2.0, "prompts": 8, "mode": "path",
                 "tau_est_train": 3.0})
    (found,) = [f for f in diagnose(run_from_records(recs)) if f.code == "tau_gap"]
    assert found.evidence["tau_est_train"] == 3.0 and found.evidence["median_ratio"] == 1.5
