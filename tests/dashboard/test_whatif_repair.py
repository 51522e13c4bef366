"""The What-if move budget: a repair of the current layout within the budget, and its curve, with moves counted
one way (planner.repair.experts_copied)."""
import numpy as np
import pytest

from moe_monitor.dashboard.whatif import repair as whatif_repair
from moe_monitor.planner.loads import check_layout
from moe_monitor.planner.repair import experts_copied
from moe_monitor.planner.synthetic import skewed_counts


def test_repair_stays_within_the_budget_and_the_curve_falls():
    fit_WLE = np.stack([skewed_counts(layers=4, experts=32, seed=s) for s in range(3)])
    current = np.tile(np.arange(32), (4, 1))                   # contiguous, R = 0, 8 GPUs x 4 slots
    out = whatif_repair.repair(fit_WLE, current, 8, 6)
    check_layout(out.layout_LP, 32, 8)
    assert not out.layout_LP.flags.writeable
    assert experts_copied(current, out.layout_LP, 8) == out.moves_used <= 6
    means = [r["mean_imbalance"] for r in out.curve]
    assert means == sorted(means, reverse=True) and means[-1] < means[0]
    assert "<= 6 moves" in out.policy
    assert whatif_repair.curve_horizon(58, 10) == 232 and whatif_repair.curve_horizon(58, 500) == 500
    with pytest.raises(ValueError, match="move budget"):
        whatif_repair.repair(fit_WLE, current, 8, 0)
