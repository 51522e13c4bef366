"""Edits (click-to-edit), migration-aware repair, replica-budget curve and the traffic model."""
from __future__ import annotations

import numpy as np
import pytest

from moe_monitor.core.loadmodel import replica_counts
from moe_monitor.planner.api import plan
from moe_monitor.planner.budget import bytes_per_expert, knee_index, replica_budget_curve
from moe_monitor.planner.edits import add_replica, move_replica
from moe_monitor.planner.loads import check_layout, layer_imbalance
from moe_monitor.planner.repair import experts_copied, repair_curve, repair_plan
from moe_monitor.planner.synthetic import skewed_counts
from moe_monitor.planner.traffic import route, traffic

G = 8


@pytest.fixture()
def case():
    c = skewed_counts(layers=3, experts=32, seed=2)
    return c, plan(c, G, 8).layout_LP          # S = 5


def test_add_replica_replaces_lowest_value_spare(case):
    c, lay = case
    rep = replica_counts(lay, 32)[1]
    cold = int(np.argmin(c[1]))
    g = next(g for g in range(G) if cold not in lay[1, g * 5:(g + 1) * 5]
             and (rep[lay[1, g * 5:(g + 1) * 5]] >= 2).any())
    new = add_replica(lay, c, 1, cold, g, G)
    assert not new.flags.writeable and lay.flags.writeable
    assert replica_counts(new, 32)[1, cold] == rep[cold] + 1
    check_layout(new, 32, G)
    assert (new[0] == lay[0]).all() and experts_copied(lay, new, G) == 1
    with pytest.raises(ValueError, match="already holds"):
        add_replica(new, c, 1, cold, g, G)


def test_add_replica_refuses_when_all_slots_unique():
    c = np.ones((1, 8))
    lay = np.arange(8)[None]                   # R = 0: every slot is an only replica
    with pytest.raises(ValueError, match="only replica"):
        add_replica(lay, c, 0, 0, 1, 4)


def test_move_replica_swaps(case):
    c, lay = case
    e = lay[0, 0]
    dst = next(g for g in range(1, G) if e not in lay[0, g * 5:(g + 1) * 5])
    new = move_replica(lay, c, 0, e, 0, dst, G)
    check_layout(new, 32, G)
    assert not new.flags.writeable and lay.flags.writeable
    assert e in new[0, dst * 5:(dst + 1) * 5] and e not in new[0, :5]
    assert experts_copied(lay, new, G) == 2            # e onto dst, the swapped expert onto GPU 0
    assert experts_copied(new, lay, G) == 2            # and back
    with pytest.raises(ValueError, match="no replica"):
        move_replica(lay, c, 0, e, dst, 0, G)


def test_repair_curve_is_monotone_and_within_budget():
    c = skewed_counts(layers=6, experts=64, seed=4)
    cur = np.concatenate([np.tile(np.arange(64), (6, 1)), np.tile(np.arange(8, 16) * 4, (6, 1))], 1)
    check_layout(cur, 64, 8)
    lay, curve = repair_curve(c, cur, 8, 12)
    check_layout(lay, 64, 8)
    means = [m for _, m, _ in curve]
    assert means == sorted(means, reverse=True) and means[-1] < means[0]
    assert curve[-1][0] == experts_copied(cur, lay, 8) <= 12      # the curve counts moves as experts_copied
    np.testing.assert_allclose(layer_imbalance(c, lay, 8).mean(), means[-1])
    for budget in (1, 3, 40):
        lay_b, curve_b = repair_curve(c, cur, 8, budget)
        assert curve_b[-1][0] == experts_copied(cur, lay_b, 8) <= budget
        assert all(0 <= m <= budget for m, _, _ in curve_b)
    same, curve0 = repair_curve(c, cur, 8, 0)
    assert (same == cur).all() and len(curve0) == 1


def test_experts_copied_counts_weights_new_on_a_gpu():
    before = np.array([[0, 1, 2, 3]])                            # 2 GPUs x 2 slots
    assert experts_copied(before, [[1, 0, 2, 3]], 2) == 0          # slots reordered on a GPU: nothing copied
    assert experts_copied(before, [[0, 2, 1, 3]], 2) == 2          # a swap across GPUs: two copies
    assert experts_copied(before, [[0, 1, 2, 0]], 2) == 1          # a replica of 0 onto GPU 1 (3 dropped: free)
    assert experts_copied(before, [[0, 1, 2, 2, 3, 0]], 2) == 2    # more slots (R = 2): 2 onto GPU 0, 0 onto 1
    with pytest.raises(ValueError, match="do not split"):
        experts_copied(before, [[0, 1, 2]], 2)


def test_repair_plan_reports_moves_as_experts_copied():
    c = skewed_counts(layers=3, experts=32, seed=9)
    cur = np.array([list(range(32)) + [0, 8, 16, 24]] * 3)
    out = repair_plan(c, cur, 4, 6)
    moves = experts_copied(cur, out["physical_to_logical_map"], 4)
    assert 0 < moves <= 6 and out["moves_budget"] == 6
    assert out["moves_used"] == out["summary"]["moves_used"] == out["moves_vs_imbalance"][-1]["moves"] == moves


def test_budget_curve_memory_and_knee():
    c = skewed_counts(layers=4, experts=64, seed=1)
    out = replica_budget_curve(c, 8, hidden=64, moe_intermediate=32, dtype_bytes=2)
    rs = [r["redundant"] for r in out["rows"]]
    assert rs == list(range(0, 17, 8))
    assert out["bytes_per_expert"] == 3 * 64 * 32 * 2 == bytes_per_expert(64, 32, 2)
    assert out["rows"][2]["extra_bytes_per_gpu"] == 16 * 4 * out["bytes_per_expert"] / 8
    imb = [r["mean_imbalance"] for r in out["rows"]]
    assert imb[0] > imb[-1]
    assert knee_index([0, 1, 2, 3, 4], [2.0, 1.1, 1.05, 1.03, 1.02]) == 1


def test_traffic_rule_and_bytes():
    # 4 GPUs x 3 slots, 2 nodes; expert 0 has replicas on GPU 0 and GPU 3
    layout = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0])
    topk = np.array([[0, 9], [0, 1], [0, -1], [0, -1]])
    g = route(topk, layout, 11, 4, nodes=2)
    assert g[0, 0] == 3        # joins expert 9 on GPU 3
    assert g[1, 0] == 0        # joins expert 1 on GPU 0
    assert g[2, 0] == 0 and g[3, 0] == 3   # untouched: token index mod replicas
    assert g[2, 1] == -1
    out = traffic(topk, layout, 11, 4, nodes=2, hidden=10, dtype_bytes=2, node_cap=1)
    assert out["pairs"] == 6 and out["bytes_per_expert_dispatch"] == 2 * 6 * 10 * 2
    assert out["mean_gpus_per_token"] == 1.0 and out["cross_node_share"] == 0.0
    assert out["rerouted_pair_share"] == 0.0
    topk2 = np.array([[1, 9]])            # GPU 0 (node 0) and GPU 3 (node 1)
    out2 = traffic(topk2, layout, 11, 4, nodes=2, node_cap=1)
    assert out2["mean_nodes_per_token"] == 2 and out2["cross_node_share"] == 0.5
    assert out2["tokens_over_cap_share"] == 1.0 and out2["rerouted_pair_share"] == 0.5
    with pytest.raises(ValueError):
        traffic(np.array([[11, 0]]), layout, 11, 4)
    both_on_node0 = np.array([[1, 2]])   # GPU 0 and GPU 0: home node 0, but the token starts on GPU 3 (node 1)
    src = traffic(both_on_node0, layout, 11, 4, nodes=2, source_gpu_N=[3])
    assert src["cross_node_share"] == 1.0 and src["cross_node_share_lower_bound"] == 0.0
    assert src["cross_node_rule"] == "source rank"
    assert traffic(both_on_node0, layout, 11, 4, nodes=2)["cross_node_share"] == 0.0
    with pytest.raises(ValueError, match="source GPUs"):
        traffic(both_on_node0, layout, 11, 4, nodes=2, source_gpu_N=[4])


def test_repair_curve_means_skip_idle_layers():
    c = skewed_counts(layers=4, experts=64, seed=4)
    c[3] = 0                                                   # a dense layer: no tokens
    cur = np.tile(np.arange(64), (4, 1))
    lay, curve = repair_curve(c, cur, 8, 6)
    imb = layer_imbalance(c, cur, 8)
    assert curve[0][1] == pytest.approx(imb[:3].mean()) and curve[0][2] == pytest.approx(imb[:3].max())
    np.testing.assert_allclose(curve[-1][1], layer_imbalance(c, lay, 8)[:3].mean())
