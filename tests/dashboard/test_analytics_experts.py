"""Hot and dead experts, Jensen-Shannon drift, downsampling, small ints and rates."""
import math

import numpy as np
import pytest

from moe_monitor.dashboard.analytics.experts import dead_experts, hot_experts, js_divergence
from moe_monitor.dashboard.analytics.series import bin_edges, downsample_max, downsample_sum, rate_per_s, small_ints


def test_hot_experts_ranked_with_share_and_x_mean():
    counts = np.array([[10, 0, 30, 0], [5, 5, 5, 25]])
    rows = hot_experts(counts, 2)
    assert [(r["layer"], r["expert"], r["tokens"]) for r in rows] == [(0, 2, 30), (1, 3, 25)]
    assert rows[0]["share"] == pytest.approx(0.75) and rows[0]["x_mean"] == pytest.approx(3.0)
    assert rows[1]["x_mean"] == pytest.approx(2.5)
    assert len(hot_experts(counts, 100)) == 6  # zero-token pairs are never hot


def test_dead_experts_only_in_active_layers():
    counts = np.array([[10, 0, 30, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(dead_experts(counts), [[False, True, False, True], [False] * 4])


def test_js_divergence_bounds():
    js = js_divergence(np.array([[1, 0], [3, 3], [0, 0]]), np.array([[0, 1], [6, 6], [1, 1]]))
    assert js[0] == pytest.approx(1.0) and js[1] == pytest.approx(0.0) and math.isnan(js[2])
    # hand case: p=(1/2,1/2), q=(1,0): m=(3/4,1/4); JS = 1/2 KL(p|m) + 1/2 KL(q|m)
    kl_pm = 0.5 * math.log2(0.5 / 0.75) + 0.5 * math.log2(0.5 / 0.25)
    kl_qm = math.log2(1 / 0.75)
    assert js_divergence(np.array([[1, 1]]), np.array([[2, 0]]))[0] == pytest.approx(0.5 * kl_pm + 0.5 * kl_qm)


def test_downsample_keeps_totals_and_column_budget():
    values = np.arange(2500).reshape(2500, 1)
    binned, first = downsample_sum(values, 1000)
    assert binned.shape == (1000, 1) and binned.sum() == values.sum()
    assert first[0] == 0 and np.all(np.diff(first) > 0)
    peaks, _ = downsample_max(values, 1000)
    assert peaks.max() == 2499
    small, first_small = downsample_sum(np.ones((7, 2)), 1000)
    assert small.shape == (7, 2) and list(first_small) == list(range(7))
    assert list(bin_edges(10, 3)) == [0, 3, 7, 10]


def test_small_ints_pick_the_smallest_dtype():
    assert small_ints(np.array([0, 255])).dtype == np.uint8
    assert small_ints(np.array([0.4, 256.0])).dtype == np.uint16
    assert small_ints(np.array([70000])).dtype == np.uint32
    assert list(small_ints(np.array([1.6, np.nan]))) == [2, 0]
    with pytest.raises(ValueError):
        small_ints(np.array([-1]))


def test_rates():
    times = np.array([0.0, 0.5, 1.0, 2.0])
    assert rate_per_s(times) == pytest.approx(1.5)  # 3 intervals in 2 s
    assert rate_per_s(times, np.array([100, 10, 20, 30])) == pytest.approx(30.0)  # first step's tokens precede t0
    assert math.isnan(rate_per_s(np.array([1.0])))


def test_the_gpus_holding_an_expert():
    from moe_monitor.dashboard.analytics.experts import gpus_holding

    layout_LP = np.array([[0, 1, 2, 3, 0, 1], [3, 2, 1, 0, 3, 3]])  # 3 slots per GPU on 2 GPUs
    assert gpus_holding(layout_LP, 2, 0, 0) == [0, 1] and gpus_holding(layout_LP, 2, 0, 2) == [0]
    assert gpus_holding(layout_LP, 2, 1, 3) == [0, 1] and gpus_holding(layout_LP, 2, 1, 0) == [1]
