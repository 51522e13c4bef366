"""The Overview's answer: the GPU it names (or "no persistent straggler" under the stated thresholds), what it
costs, its hottest experts with their shares, the advisor's line, and the series its picture marks."""
import numpy as np
import pytest

from moe_monitor.core.costmodel import ModelDims, TimeModel, reduce_times
from moe_monitor.core.hardware import GPU_PROFILES
from moe_monitor.core.loadmodel import slot_weights
from moe_monitor.dashboard.analytics.answer import (
    answer,
    fair_share,
    hottest_on,
    named,
    persistent,
    wait_by_gpu,
)
from moe_monitor.dashboard.analytics.balance import Straggler

DSV3 = ModelDims(7168, 2048, 3, 1.0, 2.0)


def _rows(counts_TLE, layout_LP, gpus):
    model = TimeModel(DSV3, GPU_PROFILES["H100 SXM"], gpus)
    return reduce_times(model.gpu_times(slot_weights(counts_TLE, layout_LP)), model.ridge_tokens)


def test_thresholds_of_a_token_straggler():
    assert fair_share(4) == 0.5 and fair_share(32) == pytest.approx(3 / 32) and fair_share(1) == 0.5
    assert persistent(Straggler(1, 1.30, 0.9), 4)
    assert not persistent(Straggler(1, 1.04, 0.9), 4)   # the "straggler" at 1.04x the mean
    assert not persistent(Straggler(1, 0.99, 0.9), 4)
    assert not persistent(Straggler(1, 1.30, 0.3), 4)   # busiest in 30% of steps of 4 GPUs: chance-like
    assert persistent(Straggler(1, 1.30, 0.3), 32)
    assert not persistent(None, 4)


def test_hottest_experts_of_a_gpu_with_replicas():
    counts_LE = np.array([[60, 30, 10, 0], [0, 0, 0, 100]], dtype=np.int64)
    layout_LP = np.array([[0, 1, 2, 3, 2, 1], [3, 0, 1, 2, 3, 1]])  # 3 slots per GPU; some experts on both
    hot = hottest_on(counts_LE, layout_LP, 2, 0)
    # GPU 0: layer 0 expert 0 (60), expert 1 (half of 30), expert 2 (half of 10); layer 1 expert 3 (half of 100)
    assert [(h.layer, h.expert) for h in hot] == [(0, 0), (1, 3), (0, 1)]
    assert [h.share for h in hot] == pytest.approx([60 / 130, 50 / 130, 15 / 130])
    assert hottest_on(np.zeros((2, 4)), layout_LP, 2, 0) == []


def test_in_time_names_the_gpu_the_layers_wait_for_and_what_it_costs():
    rng = np.random.default_rng(0)
    T, L, E, G = 20, 2, 8, 4
    layout_LP = np.tile(np.arange(E), (L, 1))          # GPU g holds experts 2g, 2g+1
    counts = rng.poisson(40, size=(T, L, E)).astype(np.float64)
    counts[:, :, 4] *= 6                              # expert 4 (GPU 2) runs hot in every step
    rows = _rows(counts, layout_LP, G)
    wait_G = wait_by_gpu(rows)
    assert wait_G.argmax() == 2 and wait_G.sum() > 0
    who = named(None, G, rows)
    assert who.gpu == 2
    hot = hottest_on(counts.sum(0), layout_LP, G, 2)
    got = answer(who, None, G, 2, 0.3, np.ones(G), "tokens", hot, steps_per_s=10.0,
                 advice="rebalance now: 2 moves, predicted gain 9%")
    assert got.gpu == 2 and got.tone in ("warn", "bad")
    assert got.sentence.startswith("**GPU 2 (node 1) holds the MoE layers back**")
    assert "of MoE time waiting" in got.sentence and "GPU-hours a day" in got.sentence
    assert "layer 0 expert 4" in got.sentence or "layer 1 expert 4" in got.sentence
    assert got.sentence.endswith("To do: rebalance now: 2 moves, predicted gain 9%.")
    np.testing.assert_allclose(got.series_G, wait_G * 1e3)


def test_a_balanced_run_says_no_persistent_straggler():
    T, L, E, G = 20, 2, 8, 4
    layout_LP = np.tile(np.arange(E), (L, 1))
    rng = np.random.default_rng(1)
    counts = rng.poisson(400, size=(T, L, E)).astype(np.float64)  # even routing: the busiest GPU changes
    rows = _rows(counts, layout_LP, G)
    who = named(Straggler(0, 1.01, 0.3), G, rows)
    assert who.gpu is None and who.verdict is not None
    got = answer(who, Straggler(0, 1.01, 0.3), G, 2, 0.02, np.ones(G), "tokens", [], steps_per_s=10.0)
    assert got.gpu is None and got.tone == "ok" and got.sentence.startswith("**No persistent straggler**")
    assert got.sentence.endswith("To do: the rebalance advisor is weighing the window.")
    mean_G = np.array([101.0, 100.0, 99.0, 100.0])
    tokens = answer(named(Straggler(0, 1.01, 0.3), G, None), Straggler(0, 1.01, 0.3), G, 2, 0.02, mean_G,
                    "tokens/step", [], time_note="no model dimensions")
    assert tokens.gpu is None and "No persistent straggler** (in tokens: no model dimensions)" in tokens.sentence
    np.testing.assert_array_equal(tokens.series_G, mean_G)  # in tokens, the picture is each GPU's mean load
    assert tokens.series_unit == "tokens/step"
    assert "1.01× the mean" in tokens.sentence


def test_in_tokens_names_the_straggler_and_its_experts():
    hot = hottest_on(np.array([[10, 90, 0, 0]]), np.array([[0, 1, 2, 3]]), 2, 0)
    straggler = Straggler(0, 1.8, 0.95, "(step, layer) pairs")
    got = answer(named(straggler, 2, None), straggler, 2, 8, 0.4, np.array([1.8, 0.2]), "tokens", hot,
                 advice="not worth it yet (x)")
    assert got.gpu == 0 and got.tone == "bad"
    assert "busiest in 95% of (step, layer) pairs at 1.80× the mean load" in got.sentence
    assert "layer 0 expert 1 (90% of its tokens), layer 0 expert 0 (10% of its tokens)" in got.sentence
    assert got.sentence.endswith("To do: not worth it yet (x).")


def test_one_gpus_share_equals_the_load_models_weights():
    from moe_monitor.core.loadmodel import gpu_weights
    from moe_monitor.dashboard.analytics.answer import gpu_share

    rng = np.random.default_rng(3)
    L, E, G, per_gpu = 3, 16, 4, 6
    layout_LP = np.stack([np.concatenate([rng.permutation(E), rng.choice(E, G * per_gpu - E, replace=False)])
                          for _ in range(L)])
    weights = gpu_weights(layout_LP, E, G)
    for gpu in range(G):
        np.testing.assert_allclose(gpu_share(layout_LP, E, G, gpu), weights[:, :, gpu], rtol=1e-6)
