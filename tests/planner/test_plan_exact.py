"""Replica counts searched exactly on small layers, and bounds that hold (planner.exact, plan's per-layer
max_gpu_load / lower_bound_max_gpu_load / proven_optimal). Small cases: inputs of vLLM's EPLB unit tests,
written here as facts; optima checked by brute force."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from moe_monitor.core.loadmodel import gpu_loads
from moe_monitor.planner.api import plan
from moe_monitor.planner.eplb_ref import eplb_global, eplb_hierarchical
from moe_monitor.planner.exact import exact_layer
from moe_monitor.planner.loads import check_layout, duplicates_on_gpu

# (weights [L][E], physical slots, groups, nodes, GPUs)
VLLM_CASES = [
    ([[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
      [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]], 16, 4, 2, 8),
    ([[50] * 8], 8, 2, 2, 4),
    ([[1000, 1, 1, 1, 1, 1, 1, 1]], 12, 2, 2, 4),
    ([[10, 20, 30, 40, 50, 60], [60, 50, 40, 30, 20, 10], [25] * 6], 8, 2, 2, 4),
    ([[10, 20, 30, 40]], 8, 3, 2, 4),
    ([[100, 50, 200, 75, 150, 25, 300, 80]], 12, 4, 2, 4),
    ([[10, 20, 30, 40, 50, 60]], 8, 3, 2, 4),
    ([[10, 20, 30, 40]], 6, 2, 1, 2),
    ([[50, 100, 75, 120, 90, 60, 80, 110, 40, 70, 95, 85, 65, 55, 45, 35]], 24, 8, 4, 8),
    ([[200, 150, 100, 50, 25, 12], [12, 25, 50, 100, 150, 200]], 10, 3, 1, 2),
]


def brute_force(w, gpus: int, slots: int) -> float:
    """Minimum max GPU load over every layout of ``slots`` slots, S per GPU, one copy of an expert per GPU."""
    E, S = len(w), slots // gpus
    best = np.inf
    for layout in itertools.product(range(E), repeat=slots):
        bins = [layout[g * S:(g + 1) * S] for g in range(gpus)]
        if any(len(set(b)) < S for b in bins) or len(set(layout)) < E:
            continue
        if any(list(b) != sorted(b) for b in bins) or bins != sorted(bins):
            continue                                       # one order per GPU and of the GPUs
        rep = np.bincount(layout, minlength=E)
        best = min(best, max(sum(w[e] / rep[e] for e in b) for b in bins))
    return best


def test_four_experts_on_four_gpus_reach_the_optimum():
    c = np.array([[10.0, 20, 30, 40]])
    res = plan(c, 4, 4)
    check_layout(res.layout_LP, 4, 4)
    assert res.max_load_L[0] == pytest.approx(25.0)
    assert res.replicas_LE[0].tolist() == [2, 2, 2, 2]
    assert res.optimal_L[0] and res.gap_L[0] == pytest.approx(0.0, abs=1e-12)
    assert gpu_loads(c, eplb_global(c, 4, 4), 4).max() == pytest.approx(80 / 3)   # EPLB: two copies on a GPU
    assert duplicates_on_gpu(eplb_global(c, 4, 4), 4)[0]


def test_small_scale_hierarchical_reaches_250():
    c = np.array([[100.0, 50, 200, 75, 150, 25, 300, 80]])
    res = plan(c, 4, 4)
    assert res.max_load_L[0] == pytest.approx(250.0) and res.optimal_L[0]
    assert res.bound_load_L[0] == pytest.approx(250.0)


@pytest.mark.parametrize("w,gpus,slots", [([10, 20, 30, 40], 4, 8), ([5, 1, 9, 3, 7], 3, 6),
                                          ([100, 50, 200, 75, 150], 3, 6), ([4, 4, 1, 1], 2, 6)])
def test_exact_matches_brute_force(w, gpus, slots):
    layout, best, proven, _ = exact_layer(np.array(w, float), gpus, slots - len(w))
    assert proven
    assert best == pytest.approx(brute_force(w, gpus, slots))
    lay = check_layout(layout[None], len(w), gpus)
    assert gpu_loads(np.array([w], float), lay, gpus).max() == pytest.approx(best)


@pytest.mark.parametrize("w,slots,groups,nodes,gpus", VLLM_CASES)
def test_default_is_no_worse_than_eplb_where_eplb_keeps_one_copy(w, slots, groups, nodes, gpus):
    c = np.array(w, dtype=float)
    E = c.shape[1]
    R = slots - E
    res = plan(c, gpus, R)
    check_layout(res.layout_LP, E, gpus)
    ours = gpu_loads(c, res.layout_LP, gpus).max(-1)
    assert np.allclose(ours, res.max_load_L)
    assert (res.bound_load_L <= ours * (1 + 1e-9)).all()
    layouts = [eplb_global(c, gpus, R)]
    if E % groups == 0 and groups % nodes == 0 and R % nodes == 0:
        layouts.append(eplb_hierarchical(c, gpus, R, nodes, groups))
    for lay in layouts:
        keeps = ~duplicates_on_gpu(lay, gpus)
        theirs = gpu_loads(c, lay, gpus).max(-1)
        assert (ours[keeps] <= theirs[keeps] * (1 + 1e-9)).all()
        # a bound under the rule holds for every layout that keeps it
        assert (res.bound_load_L[keeps] <= theirs[keeps] * (1 + 1e-9)).all()


def test_bounds_hold_for_random_layouts_and_json_reports_them():
    rng = np.random.default_rng(0)
    c = rng.integers(1, 100, (3, 6)).astype(float)
    res = plan(c, 3, 3)
    d = res.to_json()
    assert d["proven_optimal"] == res.optimal_L.tolist()
    assert d["max_gpu_load"] == pytest.approx(res.max_load_L.tolist())
    assert all(b <= m * (1 + 1e-9) for b, m in zip(d["lower_bound_max_gpu_load"], d["max_gpu_load"]))
    for _ in range(200):
        lay = np.stack([np.concatenate([rng.permutation(6), rng.choice(6, 3, replace=False)]) for _ in range(3)])
        lay = lay.reshape(3, 3, 3)
        if duplicates_on_gpu(lay.reshape(3, 9), 3).any():
            continue
        assert (gpu_loads(c, lay.reshape(3, 9), 3).max(-1) >= res.bound_load_L * (1 - 1e-9)).all()


def test_a_plan_of_many_hard_layers_stays_within_its_search_budget():
    """16 experts with 8 spares: too many replica vectors to prove; the search spends a bounded budget."""
    c = np.random.default_rng(0).lognormal(0, 1.2, (40, 16)) * 1000
    res = plan(c, 8, 8)
    check_layout(res.layout_LP, 16, 8)
    assert (res.bound_load_L <= res.max_load_L * (1 + 1e-9)).all()


def test_large_layers_are_bounded_not_searched():
    rng = np.random.default_rng(1)
    c = rng.lognormal(0, 1, (2, 64)) * 100
    res = plan(c, 8, 8)
    assert (res.bound_load_L <= res.max_load_L * (1 + 1e-9)).all()
    assert res.optimal_L.tolist() == (res.gap_L <= 1e-9).tolist()
