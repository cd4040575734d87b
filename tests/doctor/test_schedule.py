import numpy as np

from blockdraft.doctor import schedule


def test_warmup_uses_k_over_w_from_update_one():
    lr = schedule.lr_curve(np.array([1, 5, 10, 11]), 1e-3, 10, 110, "cosine", 0.1)
    assert lr[0] == 1e-4 and lr[1] == 5e-4 and lr[2] == 1e-3
    end = schedule.lr_curve(np.array([110]), 1e-3, 10, 110, "cosine", 0.1)
    assert np.isclose(end[0], 1e-4)


def test_noise_warmup_then_cosine():
    from blockdraft.doctor.records import RunLog, StepTable

    empty = np.zeros(0)
    table = StepTable(cols={"step": empty}, bucket=empty, bucket_seq=empty, bucket_row=empty, segment=empty)
    run = RunLog(
        source="x",
        steps=table,
        run_start={"total_steps": 1000},
        config={"noise": {"std": 0.2, "warmup_steps": 100, "schedule": "cosine", "final_std": 0.0}},
    )
    noise = schedule.expected_noise(run, np.array([1, 50, 100, 550, 1000]))
    np.testing.assert_allclose(noise, [0.002, 0.1, 0.2, 0.1, 0.0], atol=1e-12)
