def test_tau_gap(run_factory):
    _, _, findings = run_factory(5, ("tau_gap",))
    found = [f for f in findings if f.code == "tau_gap"]
    assert found and found[0].severity == "warning" and found[0].evidence["median_ratio"] >= 1.3


def test_matching_tau_is_quiet(run_factory):
    _, _, findings = run_factory(5)
    assert not [f for f in findings if f.code == "tau_gap" and f.severity != "info"]
