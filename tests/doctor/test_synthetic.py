import pytest

from tests.doctor import synthetic


def test_clean_run_plants_nothing_and_is_deterministic():
    a = synthetic.generate(5, n_steps=1200)
    b = synthetic.generate(5, n_steps=1200)
    assert not a.planted and a.lines() == b.lines()


@pytest.mark.parametrize("code", synthetic.ANOMALIES)
def test_every_anomaly_is_recorded_with_a_location(code):
    run = synthetic.generate(9, anomalies=[code], n_steps=1500)
    planted = [p for p in run.planted if p.code == code]
    assert planted and 0 <= planted[0].steps[0] <= planted[0].steps[1]


def test_unknown_anomaly_is_rejected():
    with pytest.raises(ValueError):
        synthetic.generate(1, anomalies=["gremlins"])
