"""Balancedness, p99, per-step vs window-sum imbalance and the straggler, hand-computed."""
import math

import numpy as np
import pytest

from dashboard.analytics.balance import (across_layers, balancedness, imbalance, step_vs_window, straggler,
                                         window_stats)


def test_eta_is_mean_over_max():
    assert balancedness(np.array([30.0, 35.0])) == pytest.approx(32.5 / 35)
    assert imbalance(np.array([3.0, 1.0])) == pytest.approx(1.5)
    np.testing.assert_allclose(balancedness(np.array([[2.0, 2.0], [4.0, 0.0]])), [1.0, 0.5])


def test_eta_of_an_idle_layer_is_nan_and_ignored():
    eta = balancedness(np.array([[0.0, 0.0], [1.0, 3.0]]))
    assert math.isnan(eta[0]) and eta[1] == pytest.approx(2 / 3)
    spread = across_layers(eta)
    assert spread.min == pytest.approx(2 / 3) and spread.p50 == pytest.approx(2 / 3)


def test_across_layers_min_p50_p90():
    spread = across_layers(np.array([0.5, 0.6, 0.7, 0.8, 0.9]))
    assert (spread.min, spread.p50) == pytest.approx((0.5, 0.7))
    assert spread.p90 == pytest.approx(0.8 + 0.6 * 0.1)  # rank 0.9*4 = 3.6 -> 0.8 + 0.6*(0.9-0.8)


def test_window_stats_p99_linear_interpolation():
    loads_TG = np.array([[1.0, 10.0], [2.0, 10.0], [3.0, 10.0], [4.0, 10.0], [5.0, 10.0]])
    stats = window_stats(loads_TG)
    np.testing.assert_allclose(stats.max_G, [5, 10])
    np.testing.assert_allclose(stats.mean_G, [3, 10])
    np.testing.assert_allclose(stats.p99_G, [4.96, 10])  # rank 0.99*4 = 3.96 -> 4 + 0.96


def test_per_step_vs_window_sum():
    # two steps, one layer, two GPUs: each step is 1.5x imbalanced, the window sum is perfectly even
    loads_TLG = np.array([[[3.0, 1.0]], [[1.0, 3.0]]])
    svw = step_vs_window(loads_TLG)
    np.testing.assert_allclose(svw.per_step_TL, [[1.5], [1.5]])
    np.testing.assert_allclose(svw.window_sum_L, [1.0])
    np.testing.assert_allclose(svw.per_step_mean_L, [1.5])
    np.testing.assert_allclose(svw.per_step_p99_L, [1.5])


def test_straggler():
    loads_TG = np.array([[3.0, 1.0], [1.0, 2.0], [4.0, 0.0]])
    s = straggler(loads_TG)
    assert s.gpu == 0
    assert s.ratio_to_mean == pytest.approx((8 / 3) / (11 / 6))
    assert s.busiest_share == pytest.approx(2 / 3)
    assert straggler(np.zeros((2, 3))) is None


def test_bad_shapes_raise_value_error():
    with pytest.raises(ValueError):
        window_stats(np.zeros((0, 3)))
    with pytest.raises(ValueError):
        step_vs_window(np.zeros((2, 3)))
