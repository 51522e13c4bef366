"""Balancedness, p99, per-step vs window-sum imbalance and the straggler, hand-computed."""
import math

import numpy as np
import pytest

from moe_monitor.dashboard.analytics.balance import (
    across_layers,
    balancedness,
    imbalance,
    step_vs_window,
    straggler,
    window_stats,
)
from tests.support.assembled import add_rank


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


def test_per_layer_straggler_differs_from_the_summed_one():
    # one step, three layers, three GPUs. Summed over layers GPU 2 carries the most (21 vs 20 vs 10), but
    # each layer waits on its own busiest GPU: GPU 0 in layers 0 and 1, GPU 1 in layer 2. GPU 2 is never
    # the one a layer waits for.
    from moe_monitor.dashboard.analytics.balance import layer_straggler

    loads_TLG = np.array([[[10.0, 0.0, 7.0], [10.0, 0.0, 7.0], [0.0, 10.0, 7.0]]])
    assert straggler(loads_TLG.sum(axis=1)).gpu == 2
    s = layer_straggler(loads_TLG)
    assert s.gpu == 0 and s.basis == "(step, layer) pairs"
    assert s.busiest_share == pytest.approx(2 / 3)
    assert s.ratio_to_mean == pytest.approx((20 / 3) / (51 / 9))
    assert layer_straggler(np.zeros((2, 3, 4))) is None


def test_snapshot_defaults_to_the_per_layer_view():
    from moe_monitor import core
    from moe_monitor.dashboard.live.layout import resolve_layout
    from moe_monitor.dashboard.live.snapshot import analyse
    from moe_monitor.dashboard.live.window import StepWindow

    # 3 layers, 3 experts, 3 GPUs (one expert each): counts are the loads of the test above
    window = StepWindow(4, 3, 3)
    counts = np.array([[10, 0, 7], [10, 0, 7], [0, 10, 7]], dtype=np.int32)
    add_rank(window, core.StepRecord(run="s", rank=0, world_size=1, step=0, time_s=1.0, phase="decode", tokens=17,
                               counts_LE=counts))
    layout = resolve_layout(None, 3, 3, gpus=3)
    per_layer, summed = analyse(window, layout, "both"), analyse(window, layout, "both", summed=True)
    assert per_layer.straggler.gpu == 0 and summed.straggler.gpu == 2
    np.testing.assert_allclose(per_layer.loads_TG, [[10, 10, 7]])  # each GPU's busiest layer
    np.testing.assert_allclose(per_layer.stats.max_G, [10, 10, 7])
    np.testing.assert_allclose(summed.loads_TG, [[20, 10, 21]])
    assert "busiest layer" in per_layer.load_label and summed.load_label == "all layers summed"


def test_the_worst_layer_by_mean_balancedness_idle_layers_left_out():
    from moe_monitor.dashboard.analytics.balance import worst_layer

    eta_TL = np.array([[0.9, 0.5, np.nan], [0.7, 0.6, np.nan], [0.8, np.nan, np.nan]])
    assert worst_layer(eta_TL) == 1  # means 0.8, 0.55, idle
    assert worst_layer(np.full((2, 3), np.nan)) == 0
