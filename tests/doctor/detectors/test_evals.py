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
