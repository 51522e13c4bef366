"""Figure builders: small payloads (small ints, <= 1000 time columns), the right traces, gaps for values
NVML could not read."""
import json

import numpy as np

from moe_monitor.dashboard.analytics.balance import balancedness, step_vs_window, window_stats
from moe_monitor.dashboard.figures import experts as expert_figures
from moe_monitor.dashboard.figures import gpu as gpu_figures
from moe_monitor.dashboard.figures import load as load_figures


def decoded(fig):
    return json.loads(fig.to_json())


def test_expert_time_heatmap_is_downsampled_and_sent_as_small_ints():
    rng = np.random.default_rng(0)
    counts_TE = rng.integers(0, 200, size=(2500, 64)).astype(np.int32)
    fig = expert_figures.expert_time_heatmap(np.arange(2500), counts_TE, layer=3)
    z = fig.data[0].z
    assert z.shape == (64, 1000) and z.dtype == np.uint16  # sums of 2-3 steps of < 200 tokens
    assert int(z.sum()) == int(counts_TE.sum())
    spec = decoded(fig)["data"][0]["z"]
    assert spec["dtype"] == "u2" and "bdata" in spec  # base64 typed array, not a JSON list of numbers


def test_layer_expert_heatmap_payload_for_deepseek_shape():
    counts_LE = np.full((58, 256), 40_000, dtype=np.int64)
    fig = expert_figures.layer_expert_heatmap(counts_LE)
    assert fig.data[0].z.dtype == np.uint16
    assert len(fig.to_json()) < 58 * 256 * 2 * 4 / 3 + 4000


def test_load_figures_shapes():
    rng = np.random.default_rng(1)
    loads_TLG = rng.random((1500, 3, 4)).astype(np.float32)
    loads_TG = loads_TLG.sum(axis=1)
    step_T = np.arange(1500) + 10
    bars = load_figures.gpu_load_bars(loads_TG[-1], window_stats(loads_TG), straggler_gpu=2, unit="tokens/step")
    assert [t.name for t in bars.data] == ["latest step", "window mean", "window p99", "window max"]
    assert list(bars.data[0].marker.color).count("#d62728") == 1
    bands = load_figures.load_bands(step_T, loads_TG, "tokens/step")
    assert len(bands.data) == 3 and len(bands.data[0].x) == 1000 and bands.data[0].x[0] == 10
    np.testing.assert_allclose(max(bands.data[1].y), loads_TG.max(), rtol=1e-6)
    eta = load_figures.layer_eta_heatmap(step_T, balancedness(loads_TLG))
    assert eta.data[0].z.shape == (3, 1000) and eta.data[0].z.dtype == np.uint8
    assert len(load_figures.step_vs_window_figure(step_vs_window(loads_TLG)).data) == 3
    assert len(load_figures.eta_over_time(step_T, balancedness(loads_TLG)).data) == 2


def test_nvml_figure_keeps_gaps_and_panels():
    rows = [{"time_s": 100.0 + i, "gpu_utilization_percent": 50 + i, "memory_used_bytes": 2 << 30,
             "memory_total_bytes": 8 << 30, "power_usage_w": None, "power_limit_w": 700.0, "sm_clock_mhz": 1500,
             "temperature_c": 55} for i in range(5)]
    fig = gpu_figures.nvml_figure(rows, np.array([101.0, 104.0]), np.array([10.0, 12.0]), "GPU 0")
    names = [t.name for t in fig.data]
    assert names == ["expert load", "util %", "used", "total", "power", "limit", "SM clock", "temperature"]
    power = fig.data[names.index("power")].y
    assert np.isnan(power).all()  # never invented
    assert fig.data[names.index("total")].y[0] == 8.0 and fig.data[0].x[-1] == 0.0
    only_load = gpu_figures.nvml_figure([], np.array([1.0, 2.0]), np.array([3.0, 4.0]), "GPU 1")
    assert [t.name for t in only_load.data] == ["expert load"]


def test_durations_in_words():
    from moe_monitor.dashboard.figures.units import format_duration

    assert [format_duration(s) for s in (0, 40, 150, 7200, 86400, 454028)] == [
        "0 s", "40 s", "2.5 min", "2 h", "1 day", "5.3 days"]
    assert format_duration(float("nan")) == format_duration(-1.0) == "unknown"


def test_layer_and_gpu_axes_tick_whole_numbers_and_layers_are_not_joined():
    from moe_monitor.dashboard.analytics.balance import step_vs_window
    from moe_monitor.dashboard.figures import load

    loads_TLG = np.random.default_rng(0).random((5, 3, 4))
    svw = load.step_vs_window_figure(step_vs_window(loads_TLG))
    assert svw.layout.xaxis.dtick == 1 and svw.layout.xaxis.tickformat == "d"
    assert all(trace.mode == "markers" for trace in svw.data)
    heat = load.layer_eta_heatmap(np.arange(5), np.full((5, 3), 0.8))
    assert heat.layout.yaxis.dtick == 1 and heat.layout.yaxis.title.text == "layer"
    wide = load.gpu_time_heatmap(np.arange(5), np.ones((5, 256)), "tokens")
    assert wide.layout.yaxis.dtick is None and wide.layout.yaxis.tickformat == "d"
