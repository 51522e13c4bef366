"""The default fit of windowed counts picks its blend on held-in data (planner.heldin)."""
from __future__ import annotations

import numpy as np

from moe_monitor.planner.api import plan
from moe_monitor.planner.heldin import fit_heldin
from moe_monitor.planner.loads import layer_imbalance
from moe_monitor.planner.synthetic import skewed_counts


def shifted_windows() -> np.ndarray:
    """[8, 4, 64]: one popularity for 5 windows, then another (a shift the old windows do not know)."""
    old = skewed_counts(layers=4, experts=64, sigma=1.0, tokens=1e6, seed=1)
    new = skewed_counts(layers=4, experts=64, sigma=1.0, tokens=1e6, seed=2)
    return np.stack([old] * 5 + [new] * 3)


def test_after_a_shift_the_default_follows_the_new_traffic():
    c = shifted_windows()
    next_window = c[-1]
    default = plan(c, 8, 8).layout_LP
    robust = plan(c, 8, 8, policy="robust").layout_LP
    _, chosen = fit_heldin(c, 8, 8)
    assert chosen in ("recent", "newest")
    assert layer_imbalance(next_window, default, 8).mean() < layer_imbalance(next_window, robust, 8).mean() - 0.005


def test_one_window_is_the_robust_fit():
    c = shifted_windows()[:1]
    layout, chosen = fit_heldin(c, 8, 8)
    assert chosen == "robust" and layout.shape == (4, 72)
