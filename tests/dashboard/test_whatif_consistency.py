"""The What-if page's numbers agree with the Overview's for the same layout and steps (idle (step, layer)
pairs excluded, NaN-safe means), and the run's sizes fall back to DeepSeek-V3 when unknown."""
import warnings

import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.core import loadmodel
from moe_monitor.dashboard.analytics.balance import balancedness
from moe_monitor.dashboard.whatif import score as whatif_score

# 3 layers, 8 experts, 4 GPUs, R = 4; layer 2 is dense (never any token)
LAYOUT = np.array([[0, 1, 2, 3, 4, 0, 5, 6, 1, 7, 2, 3]] * 3)
G = 4


def _counts() -> np.ndarray:
    rng = np.random.default_rng(7)
    c = rng.integers(0, 60, size=(6, 3, 8))
    c[:, 0, 0] *= 5                   # a hot expert: real imbalance
    c[:, 2] = 0                       # dense layer
    c[2, 1] = 0                       # layer 1 idle in step 2
    c[4] = 0                          # a step with no tokens at all
    return c


def _overview(counts_TLE):
    """The Overview's window numbers, by dashboard.analytics (as dashboard/live/snapshot.py computes them)."""
    loads_TLG = loadmodel.weighted_loads(counts_TLE, loadmodel.gpu_weights(LAYOUT.tolist(), 8, G))
    eta_TL = balancedness(loads_TLG)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        step_mean_L = np.nanmean(eta_TL, axis=0)
    return {"idle_share": 1.0 - np.nanmean(eta_TL), "step_p50": np.nanpercentile(step_mean_L, 50),
            "sum_L": balancedness(loads_TLG.sum(0)), "sum_p50": np.nanpercentile(balancedness(loads_TLG.sum(0)), 50)}


def test_current_layout_balancedness_equals_overview_with_idle_steps():
    counts = _counts()
    want = _overview(counts)
    got = whatif_score.score(LAYOUT, counts, G)
    assert got.step_balancedness == pytest.approx(1.0 - want["idle_share"], rel=1e-6)
    assert got.step_spread.p50 == pytest.approx(want["step_p50"], rel=1e-6)
    assert got.sum_spread.p50 == pytest.approx(want["sum_p50"], rel=1e-6)
    assert got.balancedness == pytest.approx(np.nanmean(want["sum_L"]), rel=1e-6)
    # the old rule (idle steps count as eta = 1) reads higher
    assert got.step_balancedness < np.mean([np.mean(np.nan_to_num(loadmodel.balancedness(
        loadmodel.gpu_loads(counts[s], LAYOUT, G)), nan=1.0)[:2]) for s in range(len(counts))])
    assert np.isnan(got.eta_sum_L[2]) and np.isnan(got.eta_step_TL[4]).all() and np.isnan(got.eta_step_TL[2, 1])


def test_one_even_split_implementation_both_forms_agree():
    counts = _counts().astype(np.float64)
    slot_form = loadmodel.gpu_loads(counts, LAYOUT, G)
    matmul_form = loadmodel.weighted_loads(counts, loadmodel.gpu_weights(LAYOUT, 8, G))
    np.testing.assert_allclose(matmul_form, slot_form, rtol=1e-6)
    np.testing.assert_allclose(matmul_form, loadmodel.weighted_loads(counts, loadmodel.gpu_weights(LAYOUT, 8, G)))
    eta = loadmodel.balancedness(slot_form)
    np.testing.assert_array_equal(np.isnan(eta), np.isnan(balancedness(slot_form)))
    with pytest.raises(ValueError, match="no slot"):
        loadmodel.gpu_weights([[0, 1, 2, 2]], 4, 2)


def _meta(hidden: int, inter: int, dtype_bytes: int = 2) -> core.RunMeta:
    return core.RunMeta(run="r", model_name="m", layer_names=["a"], num_experts=8, top_k=2, hidden_size=hidden,
                        moe_intermediate_size=inter, dtype_bytes=dtype_bytes,
                        layout=core.Layout(4, 1, core.contiguous_layout(1, 8)))


def test_zero_sizes_are_unknown_and_fall_back_to_deepseek_v3():
    from moe_monitor.dashboard.whatif.traffic import DEFAULT_SIZES, run_sizes
    from moe_monitor.planner.budget import bytes_per_expert

    assert run_sizes(_meta(64, 32)) == ((64, 32, 2), None)
    sizes, note = run_sizes(_meta(0, 0))                 # the generic collector API's defaults
    assert sizes == DEFAULT_SIZES == (7168, 2048, 2)
    assert "hidden_size = 7168" in note and "moe_intermediate_size = 2048" in note and "0 (unknown)" in note
    assert bytes_per_expert(*sizes) > 0                    # no silent 0 bytes
    sizes, note = run_sizes(_meta(64, 0))
    assert sizes == (64, 2048, 2) and "hidden_size" not in note
    sizes, note = run_sizes(None)
    assert sizes == DEFAULT_SIZES and "no metadata" in note
