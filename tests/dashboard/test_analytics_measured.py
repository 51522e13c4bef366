"""Measured vs estimated (dashboard.analytics.measured) on a hand-worked case: the even-split estimate from
logical counts and a layout with a replicated expert, beside the loads an engine measured per physical slot."""
from __future__ import annotations

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.dashboard.analytics.measured import compare, even_estimate, imbalance

# 1 layer, 3 experts, 2 GPUs, 4 slots: GPU 0 = [0, 1], GPU 1 = [0, 2] (expert 0 replicated over both GPUs)
LAYOUT_LP = np.array([[0, 1, 0, 2]])
# step 10: counts [8, 4, 0]. Even split: expert 0's 8 tokens 4 + 4 -> GPU 0 = 4 + 4 = 8, GPU 1 = 4 + 0 = 4:
#   busiest / mean = 8 / 6 = 4/3. The engine's balancer sent expert 0's tokens 2 to GPU 0 and 6 to GPU 1:
#   measured GPU 0 = 2 + 4 = 6, GPU 1 = 6 + 0 = 6: busiest / mean = 1. Won: 1/3.
# step 11: counts [0, 2, 6]. Even split: GPU 0 = 2, GPU 1 = 6 (expert 0 has no tokens): 6 / 4 = 1.5; the
#   engine cannot do better (nothing replicated carries tokens): measured the same, won 0.
COUNTS_TLE = np.array([[[8, 4, 0]], [[0, 2, 6]]])
PHYSICAL_TLP = np.array([[[2, 4, 6, 0]], [[0, 2, 0, 6]]], dtype=np.int32)  # tokens per slot, as engines count


def _measured_TLG() -> np.ndarray:
    rec = [core.PhysicalRecord(run="m", step=10 + t, rank=0, time_s=1.0, counts_LP=PHYSICAL_TLP[t], gpus=2)
           for t in range(2)]
    return np.stack([core.measured_gpu_loads([r]) for r in rec])


def test_the_hand_case():
    est_TLG = even_estimate(COUNTS_TLE, LAYOUT_LP, 3, 2)
    np.testing.assert_array_equal(est_TLG, [[[8, 4]], [[2, 6]]])
    np.testing.assert_array_equal(_measured_TLG(), [[[6, 6]], [[2, 6]]])
    result = compare(est_TLG, [10, 11], _measured_TLG(), [10, 11])
    np.testing.assert_array_equal(result.step_T, [10, 11])
    np.testing.assert_allclose(result.estimated_T, [4 / 3, 1.5])
    np.testing.assert_allclose(result.measured_T, [1.0, 1.5])
    np.testing.assert_allclose(result.won_T, [1 / 3, 0.0], atol=1e-12)
    np.testing.assert_allclose(result.coverage_T, [1.0, 1.0])
    assert result.mean(result.won_T) == pytest.approx(1 / 6)


def test_steps_are_matched_by_id_and_partial_steps_show_in_coverage():
    est_TLG = even_estimate(COUNTS_TLE, LAYOUT_LP, 3, 2)
    half = _measured_TLG()[::-1] / 2  # steps 11, 10, with half their tokens (a rank missing)
    result = compare(est_TLG, [10, 11], np.concatenate([half, half[:1]]), [11, 10, 99])
    np.testing.assert_array_equal(result.step_T, [10, 11])
    np.testing.assert_allclose(result.coverage_T, [0.5, 0.5])
    np.testing.assert_allclose(result.measured_T, [1.0, 1.5])
    assert compare(est_TLG, [10, 11], _measured_TLG(), [5, 6]).num_steps == 0


def test_layer_choices_and_idle_steps():
    loads = np.array([[[4, 0], [1, 1]], [[0, 0], [0, 0]]], dtype=np.float64)  # 2 steps, 2 layers, 2 GPUs
    np.testing.assert_allclose(imbalance(loads), [1.5, np.nan])          # layer 0: 2, layer 1: 1 -> mean 1.5
    np.testing.assert_allclose(imbalance(loads, summed=True), [5 / 3, np.nan])
    np.testing.assert_allclose(imbalance(loads, layer=1), [1.0, np.nan])
    with pytest.raises(ValueError, match="layer 2 is outside"):
        imbalance(loads, layer=2)
    assert np.isnan(compare(loads, [0, 1], loads, [0, 1]).mean(np.array([np.nan])))


def test_shapes_that_do_not_fit_are_one_value_error():
    est_TLG = even_estimate(COUNTS_TLE, LAYOUT_LP, 3, 2)
    with pytest.raises(ValueError, match="2 GPUs"):
        compare(est_TLG, [10, 11], np.zeros((2, 1, 3)), [10, 11])
    with pytest.raises(ValueError, match="one step id per step"):
        compare(est_TLG, [10], _measured_TLG(), [10, 11])
