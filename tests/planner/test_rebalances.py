"""planner.rebalances: rate, age, moves and the stopped verdict from a run's layout changes."""
from __future__ import annotations

import numpy as np

from moe_monitor.planner.rebalances import rebalance_health

A = np.array([[0, 1, 2, 3]])       # 2 GPUs, 2 slots each
B = np.array([[0, 2, 1, 3]])       # experts 1 and 2 swap GPUs: two copies
C = np.array([[0, 3, 1, 2]])       # from B: expert 3 onto GPU 0, expert 2 onto GPU 1: two copies


def test_rate_age_moves_and_bytes():
    changes = [(1000.0, B, 2, "engine"), (1600.0, C, 2, "engine"), (2200.0, B, 2, "apply")]
    health = rebalance_health(changes, now_s=2500.0, initial_LP=A, expert_bytes=44e6)
    assert (health.changes, health.last_age_s, health.interval_s, health.per_hour) == (3, 300.0, 600.0, 3.0)
    assert health.moves == 6 and health.bytes_moved == 6 * 44e6 and not health.stopped
    assert "3 rebalances, the last 300 s ago" in health.sentence()


def test_stopped_when_the_last_change_is_three_gaps_old():
    changes = [(0.0, B, 2, "engine"), (600.0, C, 2, "engine"), (1200.0, B, 2, "engine")]
    health = rebalance_health(changes, now_s=1200.0 + 3 * 600.0 + 1)
    assert health.stopped and "looks stopped (usually every 600 s)" in health.sentence()
    assert health.bytes_moved is None and health.moves == 4   # the first change counts from no known layout


def test_initial_layouts_are_not_changes():
    health = rebalance_health([(0.0, A, 2, "initial")], now_s=10.0)
    assert health.changes == 0 and not health.stopped and "no rebalance seen" in health.sentence()
