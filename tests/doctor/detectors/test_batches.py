from ..conftest import codes


def _find(findings, code):
    return [f for f in findings if f.code == code]


def test_homogeneous_batches_and_loss_modes(run_factory):
    _, _, findings = run_factory(1, ("homogeneous_batches",))
    found = _find(findings, "homogeneous_batches")
    assert found and found[0].severity in ("warning", "error")
    assert found[0].evidence["max_run"] > found[0].evidence["limit"]
    modes = _find(findings, "bucket_loss_modes")
    assert modes and modes[0].severity == "warning"


def test_interleaved_batches_are_quiet(run_factory):
    _, _, findings = run_factory(1)
    assert "homogeneous_batches" not in codes(findings)
    assert all(f.severity == "info" for f in _find(findings, "bucket_loss_modes"))


def test_epoch_progress_of_the_whole_run_is_caught(run_factory):
    for seed in (2, 3):
        _, _, findings = run_factory(seed, ("epoch_accounting",))
        found = _find(findings, "epoch_accounting")
        assert found and found[0].severity == "warning"
