"""The exporter's rebalance health: moe_layout_change_* from a run's layout changes (planner.rebalances)."""
from __future__ import annotations

import numpy as np

from moe_monitor.exporter.metrics import layout_change_families
from moe_monitor.planner.rebalances import rebalance_health


def _values(families):
    return {f.name: s.value for f in families for s in f.samples}


def test_age_interval_and_moves_once_changes_are_seen():
    a, b = np.array([[0, 1, 2, 3]]), np.array([[0, 2, 1, 3]])
    health = rebalance_health([(100.0, b, 2, "engine"), (700.0, a, 2, "engine")], now_s=1000.0, initial_LP=a)
    assert _values(layout_change_families("r", health)) == {
        "moe_layout_changes_last_hour": 2.0, "moe_layout_change_experts_moved": 4.0,
        "moe_layout_change_age_seconds": 300.0, "moe_layout_change_interval_seconds": 600.0}


def test_no_age_or_interval_without_changes():
    values = _values(layout_change_families("r", rebalance_health([], now_s=10.0)))
    assert values == {"moe_layout_changes_last_hour": 0.0, "moe_layout_change_experts_moved": 0.0}
