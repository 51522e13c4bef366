"""Invariants on every layout the planner produces, on synthetic (seeded) and real DeepSeek-V3 counts."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dashboard.planner.api import plan
from dashboard.planner.bounds import best_bound, group_partition_bound, replica_bound, slot_bound
from dashboard.planner.loads import (check_layout, duplicates_on_gpu, gpu_loads, layer_imbalance,
                                     replica_counts)
from dashboard.planner.synthetic import skewed_counts

DATA = Path(__file__).parent / "data" / "sglang_deepseek_v3"


def real(name: str) -> np.ndarray:
    return np.array(json.loads((DATA / f"{name}.json").read_text())["logical_count"], dtype=float)


def assert_valid(layout, E, G, allow_dup=False):
    L, P = layout.shape
    assert P % G == 0
    assert (replica_counts(layout, E) >= 1).all(), "an expert lost its last replica"
    assert layout.min() >= 0 and layout.max() < E
    if not allow_dup:
        assert not duplicates_on_gpu(layout, G).any(), "two replicas of one expert on one GPU"
        check_layout(layout, E, G)


CASES = [("synthetic", 0), ("synthetic", 32), ("synthetic", 64), ("prefill_in1024", 32),
         ("decode_in1000out1000", 0), ("decode_in1000out1000", 64)]


@pytest.mark.parametrize("policy", ["eplb", "refined", "robust"])
@pytest.mark.parametrize("source,R", CASES)
def test_global_layouts_are_valid_and_above_bound(policy, source, R):
    c = skewed_counts(layers=12, seed=3) if source == "synthetic" else real(source)
    G = 32
    res = plan(c, G, R, policy=policy)
    assert res.layout_LP.shape == (c.shape[0], c.shape[1] + R)
    assert_valid(res.layout_LP, c.shape[1], G, allow_dup=(policy == "eplb"))
    imb = layer_imbalance(c, res.layout_LP, G)
    np.testing.assert_allclose(imb[res.active_L], res.imbalance_L[res.active_L])
    assert (imb >= res.bound_L - 1e-9).all()
    # S slots per GPU, and the loads conserve the tokens
    np.testing.assert_allclose(gpu_loads(c, res.layout_LP, G).sum(1), c.sum(1), rtol=1e-9)


@pytest.mark.parametrize("policy", ["eplb", "hierarchical"])
def test_hierarchical_layouts_valid_and_primaries_home(policy):
    c = real("prefill_in2048")
    G, R, N, K = 32, 32, 4, 8
    res = plan(c, G, R, nodes=N, groups=K, policy=policy)
    E = c.shape[1]
    assert_valid(res.layout_LP, E, G, allow_dup=(policy == "eplb"))
    assert (res.imbalance_L >= res.bound_L - 1e-9).all()
    P = E + R
    node_P = (np.arange(P) // (P // G)) // (G // N)
    for l in np.nonzero(res.active_L)[0][:10]:
        # every group's experts all have a copy on one node (the group's home)
        for k in range(K):
            ids = np.arange(k * E // K, (k + 1) * E // K)
            homes = [set(node_P[np.isin(res.layout_LP[l], [e])]) for e in ids]
            assert set.intersection(*homes), f"layer {l} group {k} has no common node"
    if policy == "eplb":  # replicas never leave the node: the group floor binds
        floor = group_partition_bound(c, G, N, K)
        assert (res.imbalance_L >= floor - 1e-9).all()
        assert np.allclose(res.off_node_L, 0)
    else:
        assert (res.off_node_L[res.active_L] > 0).any()


def test_bounds_are_ordered_and_valid_on_small_exhaustive_case():
    # 6 experts, 3 GPUs, R = 0: brute force over all assignments with 2 slots per GPU
    from itertools import permutations
    rng = np.random.default_rng(7)
    c = rng.integers(1, 100, size=(5, 6)).astype(float)
    best = np.full(5, np.inf)
    for perm in permutations(range(6)):
        best = np.minimum(best, layer_imbalance(c, np.tile(perm, (5, 1)), 3))
    b = best_bound(c, 3, 0)
    assert (b <= best + 1e-12).all()
    assert (slot_bound(c, 3) >= replica_bound(c, 3, 0) - 1e-12).all()


def test_zero_layers_get_a_valid_layout():
    c = real("prefill_in512")
    assert (c[:3] == 0).all()
    res = plan(c, 32, 32)
    assert_valid(res.layout_LP, 256, 32)
    assert (res.imbalance_L[:3] == 1.0).all() and not res.active_L[:3].any()
