"""GPU load under a layout with the even-split rule, hand-computed."""
import numpy as np
import pytest

from moe_monitor.core.loadmodel import gpu_weights, replica_counts, validated_layout, weighted_loads


def test_gpu_load_with_replicas_even_split():
    # E=4 experts, 2 GPUs x 3 slots. Expert 0 has 3 replicas: two on GPU 0, one on GPU 1.
    p2l = [[0, 1, 0, 2, 3, 0]]
    counts_TLE = np.array([[[30, 10, 20, 5]]])
    loads = weighted_loads(counts_TLE, gpu_weights(p2l, num_experts=4, gpus=2))
    # GPU 0: 30/3 + 10 + 30/3 = 30; GPU 1: 20 + 5 + 30/3 = 35
    np.testing.assert_allclose(loads[0, 0], [30.0, 35.0])
    assert loads.shape == (1, 1, 2)
    assert loads.sum() == pytest.approx(counts_TLE.sum())


def test_contiguous_layout_is_a_reshape_sum():
    rng = np.random.default_rng(1)
    counts_TLE = rng.integers(0, 50, size=(5, 3, 8))
    p2l = [list(range(8))] * 3
    loads = weighted_loads(counts_TLE, gpu_weights(p2l, 8, 4))
    np.testing.assert_allclose(loads, counts_TLE.reshape(5, 3, 4, 2).sum(-1))


def test_layers_use_their_own_row():
    p2l = [[0, 1, 2, 3], [3, 2, 1, 0]]
    counts = np.array([[[1, 2, 3, 4], [1, 2, 3, 4]]])
    loads = weighted_loads(counts, gpu_weights(p2l, 4, 2))
    np.testing.assert_allclose(loads[0], [[3, 7], [7, 3]])


def test_replica_counts():
    np.testing.assert_array_equal(replica_counts(np.array([[0, 1, 0, 2, 3, 0]]), 4), [[3, 1, 1, 1]])


@pytest.mark.parametrize("p2l, num_experts, gpus, message", [
    ([[0, 1, 2]], 3, 2, "do not split evenly"),
    ([[0, 1, 1, 1]], 3, 2, "expert 2 has no slot"),
    ([[0, 1, 2, 7]], 4, 2, "outside"),
    ([[0, 1], [0]], 2, 1, "rectangular"),
])
def test_bad_layouts_raise_value_error(p2l, num_experts, gpus, message):
    with pytest.raises(ValueError, match=message):
        validated_layout(p2l, num_experts, gpus)


def test_counts_shape_mismatch():
    with pytest.raises(ValueError, match="layout is for"):
        weighted_loads(np.zeros((1, 2, 4)), gpu_weights([[0, 1, 2, 3]], 4, 2))
