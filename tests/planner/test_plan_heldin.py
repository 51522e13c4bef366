"""The default fit of windowed counts is chosen by a rolling-origin backtest (planner.heldin): the newest window
under drift or after a shift, the robust fit when the windows are unrelated workloads."""
from __future__ import annotations

import numpy as np

from moe_monitor.planner.api import plan
from moe_monitor.planner.eplb_ref import eplb_global
from moe_monitor.planner.heldin import backtest, candidates, choose, fit_heldin
from moe_monitor.planner.loads import layer_imbalance
from moe_monitor.planner.synthetic import drifting_windows, skewed_counts


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


def test_folds_that_disagree_fall_back_to_the_robust_fit():
    """A challenger that wins half the folds and loses the others badly is not taken."""
    newest = np.array([[1.30], [1.02], [1.30], [1.02]])
    recent = np.array([[1.01], [1.12], [1.01], [1.12]])
    robust = np.array([[1.04], [1.04], [1.04], [1.04]])
    assert choose({"newest": newest, "robust": robust, "recent": recent}) == "robust"
    assert choose({"newest": robust - 0.005, "robust": robust, "recent": recent}) == "newest"


def unrelated_workloads(n: int = 6) -> np.ndarray:
    """[n, 6, 64]: windows of unrelated workloads (each its own popularity), as the leave-one-out protocol
    stacks the real ones."""
    return np.stack([skewed_counts(layers=6, experts=64, sigma=1.0, tokens=1e6, seed=10 + k) for k in range(n)])


def test_unrelated_workloads_held_out_default_is_the_robust_figure():
    """Leave-one-out on generated workloads: the default scores as the robust fit does and beats EPLB."""
    c = unrelated_workloads()
    ours, robust, eplb = [], [], []
    for k in range(c.shape[0]):
        train = np.delete(c, k, axis=0)
        ours.append(layer_imbalance(c[k], plan(train, 8, 8).layout_LP, 8).mean())
        robust.append(layer_imbalance(c[k], plan(train, 8, 8, policy="robust").layout_LP, 8).mean())
        eplb.append(layer_imbalance(c[k], eplb_global(train.sum(0), 8, 8), 8).mean())
    assert np.mean(ours) <= np.mean(robust) + 0.005 and np.max(ours) <= np.max(robust) + 0.01
    assert np.mean(ours) < np.mean(eplb)


def test_random_walk_default_no_worse_than_eplb_on_the_last_window():
    c = drifting_windows(windows=10, layers=8, seed=1)
    ours, eplb = [], []
    for t in range(5, 10):
        ours.append(layer_imbalance(c[t], plan(c[:t], 32, 32).layout_LP, 32).mean())
        eplb.append(layer_imbalance(c[t], eplb_global(c[t - 1], 32, 32), 32).mean())
    assert np.mean(ours) <= np.mean(eplb)


def test_backtest_scores_each_candidate_on_the_last_folds():
    c = drifting_windows(windows=6, layers=20, experts=64, seed=3)
    scores = backtest(c, 8, 8, candidates(1.0, 16), folds=3)
    assert set(scores) == {"newest", "robust", "recent"}
    assert all(s.shape == (3, 16) and (s >= 1.0).all() for s in scores.values())
