"""planner.lproom: GPUs linked through replicated experts for the lp dispatch."""
from __future__ import annotations

import numpy as np

from moe_monitor.core.loadmodel import replica_counts
from moe_monitor.planner.api import plan
from moe_monitor.planner.loads import check_layout
from moe_monitor.planner.lproom import connect_replicas, gpu_components
from moe_monitor.planner.synthetic import skewed_counts


def test_components_by_hand():
    # 4 GPUs x 2 slots, experts 0..5; expert 0 on GPUs 0 and 1, expert 1 on GPUs 2 and 3
    layout = np.array([0, 2, 0, 3, 1, 4, 1, 5])
    comp = gpu_components(layout, replica_counts(layout[None], 6)[0], 4)
    assert comp[0] == comp[1] and comp[2] == comp[3] and comp[0] != comp[2]


def test_connect_links_every_gpu_and_keeps_replica_counts():
    c = skewed_counts(layers=4, experts=64, sigma=1.2, seed=4)
    lay = plan(c, 16, 16, policy="refined").layout_LP
    rep = replica_counts(lay, 64)
    before = [np.unique(gpu_components(lay[i], rep[i], 16)).size for i in range(4)]
    out = connect_replicas(lay, c, 16)
    after = [np.unique(gpu_components(out[i], rep[i], 16)).size for i in range(4)]
    check_layout(out, 64, 16)
    np.testing.assert_array_equal(replica_counts(out, 64), rep)
    assert max(before) > 1 and after == [1, 1, 1, 1]
