"""The pages' figures in time: the verdict's sums over the window's per-row reductions, a window of known counts
gives the hand-worked headline, and a run without dimensions or profile says so in tokens."""
import numpy as np
import pytest

from moe_monitor import core
from moe_monitor.core.costmodel import ModelDims, TimeModel, reduce_times, verdict, verdict_of
from moe_monitor.core.hardware import GPU_PROFILES
from moe_monitor.core.loadmodel import slot_weights
from moe_monitor.dashboard.analytics.timecost import (
    balanced_backend_line,
    headline,
    layer_regimes,
    router_skew,
    time_model_for,
    tokens_headline,
)
from moe_monitor.dashboard.live.buckets import BucketWindow
from moe_monitor.dashboard.live.layout import resolve_layout
from moe_monitor.dashboard.live.layout_changes import LayoutChange
from moe_monitor.dashboard.live.snapshot import analyse
from moe_monitor.dashboard.live.window import StepWindow
from tests.support.assembled import add_rank

H100 = GPU_PROFILES["H100 SXM"]
DSV3 = ModelDims(7168, 2048, 3, 1.0, 2.0)


def _meta(hidden=7168, inter=2048, profile="H100 SXM", gpus=2, layers=1, experts=4) -> core.RunMeta:
    return core.RunMeta(run="t", model_name="m", layer_names=[f"l{i}" for i in range(layers)], num_experts=experts,
                        top_k=2, hidden_size=hidden, moe_intermediate_size=inter, dtype_bytes=1,
                        layout=core.Layout(gpus, 1, core.contiguous_layout(layers, experts)), act_dtype_bytes=2,
                        gpu_profile=profile)


@pytest.mark.parametrize("scale", [0.3, 8.0, 400.0, 0.0])  # decode-sized, mid, prefill-sized, idle
def test_verdict_sums_of_the_reductions(scale):
    rng = np.random.default_rng(int(scale * 10))
    T, L, E, G = 7, 3, 16, 4
    layout_LP = np.stack([np.concatenate([rng.permutation(E), rng.integers(0, E, 4)]) for _ in range(L)])
    model = TimeModel(DSV3, H100, G, nodes=2)
    counts = rng.poisson(rng.gamma(0.5, size=(L, E)) * scale, size=(T, L, E)).astype(np.float64)
    times = model.gpu_times(slot_weights(counts, layout_LP))
    got = verdict(times, ridge_tokens=model.ridge_tokens)
    total = times.total_s
    moe_s, lost_s = total.max(-1).sum() / T, (total.max(-1) - total.mean(-1)).sum() / T
    np.testing.assert_allclose([got.moe_s, got.lost_s], [moe_s, lost_s], rtol=1e-9)
    assert got.speedup == pytest.approx(moe_s / (moe_s - lost_s)) and 0 <= got.lost_share < 1
    if scale:
        assert got.gpu is not None and (total.argmax(-1) == got.gpu).any() and 0 <= got.memory_bound_share <= 1


def _window(counts_TLE, steps_per_s=10.0) -> StepWindow:
    w = StepWindow(8, counts_TLE.shape[1], counts_TLE.shape[2])
    for step, counts in enumerate(counts_TLE):
        add_rank(w, core.StepRecord(run="t", rank=0, world_size=1, step=step, time_s=100.0 + step / steps_per_s,
                                    phase="decode", tokens=int(counts.sum()), counts_LE=counts.astype(np.int32)))
    return w


def test_known_counts_give_the_hand_worked_headline():
    # 2 GPUs, experts 0, 1 on GPU 0 and 2, 3 on GPU 1; every step GPU 0 runs 2 experts of 1 token, GPU 1 one of 2
    counts = np.array([[[1, 1, 2, 0]]] * 5)
    window = _window(counts, steps_per_s=5000.0)  # 200 us steps: the profile's hardware
    meta = _meta()
    layout = resolve_layout(meta, 1, 4)
    model, note = time_model_for(meta, layout.gpus, layout.nodes)
    assert model is not None and note == ""
    snap = analyse(window, layout, "both", time_model=model)
    # by hand: an expert of t tokens reads its weights and 2 x hidden x t activation bytes; both GPUs receive
    # 2 rows; GPU 0 waits for nothing, GPU 1 for GPU 0's second weight read
    read_s = DSV3.expert_bytes / H100.hbm
    act_s = 2 * 7168 * 2 / H100.hbm
    comm_s = 2 * model.comm_s_per_row + H100.overhead_s
    gpu0, gpu1 = 2 * (read_s + act_s) + comm_s, read_s + 2 * act_s + comm_s
    lost_s = gpu0 - (gpu0 + gpu1) / 2
    v = snap.time.headline.verdict
    assert (v.gpu, v.cause) == (0, "active experts")
    assert v.lost_s == pytest.approx(lost_s) and v.moe_s == pytest.approx(gpu0)
    assert v.lost_share == pytest.approx(lost_s / gpu0) and v.speedup == pytest.approx(gpu0 / (gpu0 - lost_s))
    head = snap.time.headline
    hours = lost_s * 2 * snap.steps_per_s * 24
    assert head.gpu_hours_per_day == pytest.approx(hours)
    assert head.first == (f"The MoE layers lose {lost_s / gpu0:.0%} of their time waiting for the busiest GPU — "
                          f"{lost_s * 1e6:.0f} µs per step, {hours:,.1f} GPU-hours a day at this rate — GPU 0 "
                          "(node 0), because it runs 2.0 active experts per layer against a mean of 1.5 (weight reads "
                          "bound them).")
    step_s = 1 / snap.steps_per_s
    assert head.light_tokens_per_s == pytest.approx(snap.tokens_per_s * step_s / (step_s - lost_s))
    assert head.light.startswith(f"The MoE layers would run {gpu0 / (gpu0 - lost_s):.2f}× faster if every GPU")
    assert head.label.startswith("predicted for H100 SXM, hidden 7168 x expert 2048 x 3 matrices, fp8 weights")
    foreign = analyse(_window(counts, steps_per_s=10.0), layout, "both", time_model=model).time.headline
    assert np.isnan(foreign.light_tokens_per_s) and "no tokens/s derived" in foreign.light  # 100 ms CPU steps
    regimes = layer_regimes(snap.time.rows, model.ridge_tokens)
    assert regimes.active_max_L.tolist() == [2.0] and regimes.active_mean_L.tolist() == [1.5]
    assert regimes.tokens_per_active_L.tolist() == [pytest.approx(4 / 3)] and regimes.memory_bound_L.tolist() == [True]


def test_cached_rows_recomputed_only_when_stale():
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 40, size=(6, 2, 8))
    window = _window(counts)
    layout = resolve_layout(_meta(layers=2, experts=8), 2, 8)
    model = TimeModel(DSV3, H100, 2)
    first = analyse(window, layout, "both", time_model=model).time.rows
    direct = reduce_times(model.gpu_times(slot_weights(counts.astype(np.float64), layout.layout_LP)), model.ridge_tokens)
    np.testing.assert_allclose(first.slowest_TL, direct.slowest_TL)
    window.counts_CLE[0] = 0  # a row changed behind the cache's back: not recomputed while its version stands
    np.testing.assert_allclose(window.row_times(np.arange(6), model, layout.layout_LP).slowest_TL, direct.slowest_TL)
    swapped = layout.layout_LP[:, ::-1].copy()  # a layout change from step 3 recomputes steps 3..5
    change = LayoutChange.of(3, swapped, 2, 1, "engine")
    again = window.row_times(np.arange(6), model, layout.layout_LP, (LayoutChange.of(0, layout.layout_LP, 2, 1, "x"),
                                                                      change))
    later = reduce_times(model.gpu_times(slot_weights(counts[3:].astype(np.float64), swapped)), model.ridge_tokens)
    np.testing.assert_allclose(again.busiest_TL[3:], later.busiest_TL)
    np.testing.assert_allclose(again.slowest_TL[:3], direct.slowest_TL[:3])


def test_a_bucket_counts_as_its_mean_step():
    window = BucketWindow(4, 1, 4, 60)  # a bucket of 3 steps summed: its times are those of its mean step
    window.add_bucket(core.RollupRecord(
        run="t", resolution_s=60, start_s=600, steps=3, tokens=6, steps_by_phase=np.array([0, 3, 0, 0, 0]),
        counts_LE=np.array([[3, 3, 6, 0]]), gpus=2, eta_hist_B=np.zeros(core.ETA_BINS, dtype=np.int64),
        max_load_sum=6.0, mean_load_sum=6.0, max_load_peak=2.0))
    model = TimeModel(DSV3, H100, 2)
    got = window.row_times(window.ordered_slots(), model, core.contiguous_layout(1, 4))
    want = reduce_times(model.gpu_times(slot_weights(np.array([[[1.0, 1, 2, 0]]]), np.array([[0, 1, 2, 3]]))),
                        model.ridge_tokens)
    np.testing.assert_allclose(got.slowest_TL, want.slowest_TL)
    assert got.active_busiest_TL.tolist() == [[2.0]]


def test_unknown_dimensions_or_profile_say_so_in_tokens():
    assert time_model_for(_meta(hidden=0), 2, 1) == (None, "no model dimensions")
    assert time_model_for(_meta(profile=""), 2, 1) == (None, "no GPU profile")
    assert time_model_for(None, 2, 1) == (None, "no model dimensions/GPU profile")
    model, note = time_model_for(_meta(profile=""), 2, 1, ["NVIDIA H100 80GB HBM3"])
    assert note == "" and model.profile.name == "H100 SXM"
    counts = np.array([[[1, 1, 2, 0]]] * 5)
    snap = analyse(_window(counts), resolve_layout(_meta(), 1, 4), "both", time_note="no GPU profile")
    assert snap.time is None and snap.time_note == "no GPU profile"
    first, hint = tokens_headline(snap.time_note, snap.idle_share, snap.straggler.gpu, snap.straggler.ratio_to_mean, 2)
    assert first.startswith("No GPU profile: figures in tokens — idle share 0.0%") and "gpu_profile" in hint


def test_no_time_lost_when_every_gpu_finishes_together():
    model = TimeModel(DSV3, H100, 2)
    times = model.gpu_times(np.array([[[5.0, 5.0]]]))
    v = verdict_of(reduce_times(times, model.ridge_tokens))
    head = headline(v, model, 10.0, 100.0, 8)
    assert v.gpu is None and head.first.startswith("The MoE layers lose no time waiting for the busiest GPU")
    assert head.light == ""


def test_an_engine_that_evens_gpu_tokens_reads_router_skew_and_active_experts():
    counts_sum_LE = np.array([[8, 2, 1, 1], [0, 0, 0, 0], [3, 3, 3, 3]])
    assert router_skew(counts_sum_LE) == pytest.approx((8 / 3 + 1) / 2)   # median of the busy layers
    assert balanced_backend_line("even", 2.0, None) == "" and balanced_backend_line("round_robin", 2.0, None) == ""
    line = balanced_backend_line("ideal", 1.83, None)
    assert "evens GPU tokens by construction (dispatch ideal)" in line and "1.83×" in line
    assert "declare the model's dimensions" in line
    model = TimeModel(DSV3, H100, 2)
    times = model.gpu_times(np.array([[[4.0, 4.0, 8.0, 0.0]]]))       # GPU 0: 2 active experts, GPU 1: 1
    regimes = layer_regimes(reduce_times(times, model.ridge_tokens), model.ridge_tokens)
    assert "active experts per GPU, max/mean 1.33" in balanced_backend_line("lp", 1.5, regimes)


def test_whatif_in_time_prices_both_layouts_on_the_score_window():
    from moe_monitor.dashboard.whatif.score import in_time, time_line

    model = TimeModel(DSV3, H100, 2)
    score_TLE = np.array([[[8.0, 8.0, 0.0, 0.0]]] * 4)      # experts 0, 1 both on GPU 0, or one on each
    stacked, spread = np.array([[0, 1, 2, 3]]), np.array([[0, 2, 1, 3]])
    before, after = in_time(stacked, spread, score_TLE, 2, model)
    assert after.moe_s < before.moe_s and after.lost_s < before.lost_s and before.gpu == 0
    line = time_line(before, after, model.label())
    assert line.startswith("In time (predicted for H100 SXM") and f"{before.moe_s * 1e3:.3f} ms per step" in line


def test_the_whatif_advisor_prices_in_the_pages_time_model():
    from moe_monitor.dashboard.whatif.advice import cost_model

    model = TimeModel(DSV3, H100, 2)
    assert cost_model(_meta(), model).pricing.startswith("predicted time for H100 SXM")
    assert cost_model(_meta()).pricing.startswith("token-slots")
