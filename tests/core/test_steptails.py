"""core.steptails: the per-step figures (imbalance p50/p99/max, ideal fraction, expert skew, window imbalance)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from moe_monitor.core.steptails import step_tails


def test_figures_of_a_hand_counted_window():
    layout = np.array([[0, 1, 2, 3], [0, 1, 2, 3]])   # 2 GPUs x 2 slots; layer 1 idle
    counts = np.zeros((2, 2, 4))
    counts[0, 0] = [3, 1, 2, 2]   # GPU loads 4, 4: imbalance 1; skew max(3/2, 2/2) = 1.5
    counts[1, 0] = [6, 0, 1, 1]   # loads 6, 2: imbalance 1.5; skew max(6/3, 1/1) = 2
    tails = step_tails(counts, layout, 2, "even")
    assert np.isnan(tails.imbalance_TL[:, 1]).all()
    assert tails.imbalance_TL[:, 0].tolist() == [1.0, 1.5] and tails.skew_TL[:, 0].tolist() == [1.5, 2.0]
    assert tails.imbalance_summary() == {"p50": 1.25, "p99": pytest.approx(1.495), "max": 1.5}
    assert tails.ideal_fraction == pytest.approx((1 + 2 / 3) / 2)
    assert tails.window_imbalance == pytest.approx(10 / 8)   # window loads 10, 6
    out = json.loads(json.dumps(tails.to_json(), allow_nan=False))
    assert out["steps"] == 2 and out["dispatch"] == "even" and out["expert_skew_p99"] == pytest.approx(1.995)
    assert out["per_layer"]["p99"][1] is None


def test_ideal_and_lp_are_never_above_even():
    rng = np.random.default_rng(1)
    layout = np.stack([np.concatenate([rng.permutation(12), rng.choice(12, 4, replace=False)]) for _ in range(3)])
    counts = rng.gamma(0.7, 20, size=(30, 3, 12)).round()
    even, lp, ideal = (step_tails(counts, layout, 4, p) for p in ("even", "lp", "ideal"))
    assert (lp.imbalance_TL <= even.imbalance_TL + 1e-9).all()
    np.testing.assert_allclose(ideal.imbalance_TL, 1.0)
    assert ideal.ideal_fraction == pytest.approx(1.0) and lp.ideal_fraction >= even.ideal_fraction


def test_an_idle_window_has_no_figures():
    tails = step_tails(np.zeros((3, 1, 4)), np.arange(4)[None], 2, "lp")
    assert tails.imbalance_summary() == {"p50": None, "p99": None, "max": None}
    assert tails.ideal_fraction is None and tails.window_imbalance is None
