"""What an eval record sets beside its measured tau: the training estimate over a window of updates."""

import math

from blockdraft.telemetry.step_record import TAU_EST_WINDOW, tau_est_over_window


def test_the_training_estimate_is_the_median_of_the_finite_values_of_its_window():
    window = [2.0] * (TAU_EST_WINDOW - 1) + [4.7]  # one lucky batch last
    assert tau_est_over_window(window) == 2.0
    assert tau_est_over_window([3.0, math.nan, None, 1.0, math.inf, 2.0]) == 2.0
    assert tau_est_over_window([]) is None and tau_est_over_window([None, math.nan]) is None
