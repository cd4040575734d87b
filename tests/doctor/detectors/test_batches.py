import numpy as np

from ..conftest import codes, find


def test_homogeneous_batches_and_loss_modes(run_factory):
    _, _, findings = run_factory(1, ("homogeneous_batches",))
    found = find(findings, "homogeneous_batches")
    assert found and found[0].severity in ("warning", "error")
    assert found[0].evidence["max_run"] > found[0].evidence["limit"]
    modes = find(findings, "bucket_loss_modes")
    assert modes and modes[0].severity == "warning"


def test_interleaved_batches_are_quiet(run_factory):
    _, _, findings = run_factory(1)
    assert "homogeneous_batches" not in codes(findings)
    assert all(f.severity == "info" for f in find(findings, "bucket_loss_modes"))


def test_runs_forced_by_one_dominant_bucket_are_not_a_batching_bug():
    """One bucket with 94% of batches: the sampler can only bound runs at 15 and says so in its
    `data` record; runs within that bound are not reported (the demo corpus is like this)."""
    from blockdraft.doctor.detectors import diagnose
    from blockdraft.doctor.records import run_from_records

    pattern = ([1] * 14 + [0]) * 20
    steps = [{"kind": "step", "step": i + 1, "time": float(i), "loss": 3.0, "buckets": [b]}
             for i, b in enumerate(pattern)]
    start = {"kind": "run_start", "step": 0, "time": 0.0, "config": {"data": {"max_same_bucket_run": 3}}}
    data = {"kind": "data", "step": 0, "time": 0.0, "run_bound": 15}
    codes = {f.code for f in diagnose(run_from_records([start, data, *steps]))}
    assert "homogeneous_batches" not in codes
    codes = {f.code for f in diagnose(run_from_records([start, *steps]))}
    assert "homogeneous_batches" in codes


def _updates(mixed: bool, n: int = 300, per_update: int = 8):
    from blockdraft.doctor.detectors import diagnose
    from blockdraft.doctor.records import run_from_records

    rng = np.random.default_rng(0)
    recs = []
    for k in range(1, n + 1):
        buckets = (rng.integers(0, 4, per_update) if mixed else np.full(per_update, k % 4)).tolist()
        recs.append({"kind": "step", "time": float(k), "step": k, "loss": 2.0 + 0.01 * rng.standard_normal(),
                     "lr": 1e-3, "buckets": buckets})
    return [f for f in diagnose(run_from_records(recs)) if f.code == "homogeneous_batches"]


def test_updates_of_one_bucket_each_are_found_even_when_buckets_alternate():
    """The seed's failure at the update level: 8 ranks all on one bucket, a new bucket every update."""
    found = _updates(mixed=False)
    assert found and "hold a single length bucket" in found[0].summary
    assert found[0].evidence["share_single_bucket"] == 1.0


def test_updates_that_mix_buckets_are_quiet():
    assert not _updates(mixed=True)
