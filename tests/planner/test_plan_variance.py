"""Swaps that even out the GPUs' noise (planner.variance): replica counts kept, the busiest GPU's mean + z sd
lowered (the p99 it buys on held-out steps is measured by bench.planner, against the noise floor)."""
from __future__ import annotations

import numpy as np

from moe_monitor.core.loadmodel import replica_counts
from moe_monitor.planner.api import plan
from moe_monitor.planner.loads import check_layout
from moe_monitor.planner.synthetic import sampled_steps, skewed_counts
from moe_monitor.planner.tail import step_variance
from moe_monitor.planner.variance import drift_sigma, variance_swaps

G, R = 8, 8


def spread(layout_LP, mean_LE, var_LE, z=3.0):
    """max over GPUs of mean + z sd, per layer [L]."""
    rep = replica_counts(layout_LP, mean_LE.shape[1])
    L, P = layout_LP.shape
    m = np.take_along_axis(mean_LE / rep, layout_LP, axis=1).reshape(L, G, -1).sum(-1)
    v = np.take_along_axis(var_LE / rep ** 2, layout_LP, axis=1).reshape(L, G, -1).sum(-1)
    return (m + z * np.sqrt(v)).max(1)


def test_variance_swaps_keep_replicas_and_lower_the_spread():
    pop = skewed_counts(layers=4, experts=64, sigma=1.2, tokens=1e6, seed=4)
    steps = sampled_steps(pop, 400, 256, seed=1)
    window = plan(steps.sum(0), G, R).layout_LP
    mean, var = step_variance(steps)
    out = variance_swaps(window, mean, var, G)
    check_layout(out, 64, G)
    assert (replica_counts(out, 64) == replica_counts(window, 64)).all()
    assert (spread(out, mean, var) <= spread(window, mean, var) + 1e-12).all()
    assert (spread(out, mean, var) < spread(window, mean, var) - 1e-6).any()


def test_drift_sigma_ignores_a_one_off_shift():
    rng = np.random.default_rng(0)
    logp = rng.normal(0, 1, (2, 32))
    w = [logp]
    for t in range(6):
        w.append(w[-1] + rng.normal(0, 0.1, logp.shape) + (3.0 * rng.normal(0, 1, logp.shape) if t == 2 else 0))
    shares = np.exp(np.stack(w))
    shares /= shares.sum(-1, keepdims=True)
    sigma = drift_sigma(shares)
    assert sigma.shape == (2,) and ((sigma > 0.07) & (sigma < 0.15)).all()   # the drift step is 0.1; the shift 3
    assert drift_sigma(shares[:1]).tolist() == [0.0, 0.0]
