"""Chart builders of the live pages: valid Vega-Lite specs that do not change when only the data does (the chart is
updated in place, never re-created), datasets holding the right values, heatmaps binned under the cell budget,
gaps for values NVML could not read, tooltips that say what a cell is."""
import json
from pathlib import Path
from typing import Any

import altair
import jsonschema
import numpy as np
import pytest

from moe_monitor.dashboard.analytics.balance import balancedness, step_vs_window, window_stats
from moe_monitor.dashboard.analytics.measured import MeasuredVsEstimated
from moe_monitor.dashboard.analytics.rollups import PerStepStats
from moe_monitor.dashboard.analytics.timing import AllToAllShare, LineFit
from moe_monitor.dashboard.figures import experts as expert_figures
from moe_monitor.dashboard.figures import gpu as gpu_figures
from moe_monitor.dashboard.figures import load as load_figures
from moe_monitor.dashboard.figures import measured as measured_figures
from moe_monitor.dashboard.figures import rollups as rollup_figures
from moe_monitor.dashboard.figures import staleness as staleness_figures
from moe_monitor.dashboard.figures import time as time_figures
from moe_monitor.dashboard.figures.common import HEAT_CELLS, HEAT_COLUMNS, MAX_COLUMNS
from moe_monitor.dashboard.whatif.staleness import PhaseStaleness
from moe_monitor.planner.staleness import StalenessCurve

SCHEMA = jsonschema.Draft7Validator(json.loads(
    (Path(altair.__file__).parent / "vegalite" / "v6" / "schema" / "vega-lite-schema.json").read_text()))


def nvml_rows(times, power=None):
    return [{"time_s": t, "gpu_utilization_percent": 50 + i, "memory_used_bytes": 2 << 30,
             "memory_total_bytes": 8 << 30, "power_usage_w": power, "power_limit_w": 700.0, "sm_clock_mhz": 1500,
             "temperature_c": 55} for i, t in enumerate(times)]


def per_step_stats(T, seed):
    rng = np.random.default_rng(seed)
    return PerStepStats(eta_p50_T=rng.random(T), eta_tail_T=rng.random(T), busiest_mean_T=rng.random(T) * 100,
                        mean_load_T=rng.random(T) * 50, busiest_peak_T=rng.random(T) * 200, imbalance_T=rng.random(T),
                        eta_p50=0.8, eta_tail=0.6, busiest_mean=50.0, busiest_peak=200.0, steps=T, tail_q=0.05,
                        missing_rank_steps=0, late_rank_steps=0)


def every_chart(T: int, seed: int, first_step: int = 0, marks=(), hole_after: int | None = None):
    """Every builder of the live pages on T steps of random data: (name, Chart); hole_after: steps after that
    many are 1000 later (a hole)."""
    rng = np.random.default_rng(seed)
    loads_TLG = rng.random((T, 3, 4)) * 100
    loads_TG, eta_TL, step_T = loads_TLG.sum(axis=1), balancedness(loads_TLG), np.arange(T) + first_step
    if hole_after is not None:
        step_T[hole_after:] += 1000
    share = AllToAllShare(rng.random(3), rng.random(3), rng.random(3), 0.1, 0.1, 0.2)
    curve = StalenessCurve(np.zeros(1), np.arange(1, 6), rng.random((1, 5)), rng.random(5) + 1, np.ones(5))
    measured = MeasuredVsEstimated(step_T, rng.random(T) + 1, rng.random(T) + 1, rng.random(T), np.ones(T))
    charts = [
        ("bars", load_figures.gpu_load_bars(loads_TG[-1], window_stats(loads_TG), int(seed % 4), "tokens/step", 2)),
        ("bands", load_figures.load_bands(step_T, loads_TG, "tokens/step", marks)),
        ("gpu heat", load_figures.gpu_time_heatmap(step_T, loads_TG, "tokens/step", marks, "step", 2)),
        ("eta heat", load_figures.layer_eta_heatmap(step_T, eta_TL, marks)),
        ("eta time", load_figures.eta_over_time(step_T, eta_TL, marks)),
        ("svw", load_figures.step_vs_window_figure(step_vs_window(loads_TLG))),
        ("layer x expert", expert_figures.layer_expert_heatmap(rng.integers(0, 99, (3, 8)))),
        ("expert time", expert_figures.expert_time_heatmap(step_T, rng.integers(0, 99, (T, 8)), seed % 3, marks)),
        ("drift", expert_figures.drift_bars(rng.random(3))),
        ("ranks", time_figures.rank_breakdown(*rng.random((4, 2)), "mean over layers")),
        ("phases", time_figures.phases_over_steps(step_T, *rng.random((4, T)), "mean over layers", marks)),
        ("share", time_figures.share_by_layer(share, rng.random(3))),
        ("wait", time_figures.wait_bars(rng.random(2))),
        ("vs load", time_figures.time_vs_load(rng.random(T), rng.random(T), LineFit(2.0, 1.0, rng.random(), T), step_T)),
        ("measured", measured_figures.measured_figure(measured, marks)),
        ("staleness", staleness_figures.staleness_curves([PhaseStaleness("decode", curve, curve, T)])),
        *((f"nvml {i}", c) for i, c in enumerate(gpu_figures.nvml_charts(
            nvml_rows(100.0 + np.arange(T)), 100.0 + np.arange(T), rng.random(T), "the GPU", marks))),
        *((f"per step {i}", c) for i, c in enumerate(rollup_figures.per_step_charts(
            (step_T * 60).astype("datetime64[s]"), per_step_stats(T, seed), rng.random(T), "tokens",
            [(str(np.datetime64(int(m) * 60, "s")), label) for m, label in marks]))),
    ]
    return charts


def test_every_spec_is_valid_vega_lite_and_stays_the_same_when_only_the_data_changes():
    before = every_chart(40, seed=0)
    after = every_chart(1300, seed=1, first_step=500, marks=[(600.0, "engine rebalanced"), (900.0, "layout applied")])
    assert [n for n, _ in before] == [n for n, _ in after]
    for (name, one), (_, two) in zip(before, after):
        assert not list(SCHEMA.iter_errors(one.spec)), name
        assert json.dumps(one.spec, sort_keys=True) == json.dumps(two.spec, sort_keys=True), name  # updated in place
        assert set(one.data) == set(two.data), name  # the same datasets, none appearing or vanishing
        assert one.spec["usermeta"]["embedOptions"]["renderer"] == "canvas", name  # never switched by row count
        assert not any(frame.empty for frame in two.data.values() if frame is not two.data.get("marks")), name
    assert SCHEMA.iter_errors({"layer": [{"mark": "nope"}]}).__next__()  # the schema check can fail


def test_layout_changes_are_rows_of_the_marks_dataset_on_every_time_chart():
    marks = [(12.0, "engine rebalanced"), (20.0, "layout applied")]
    for name, chart in every_chart(30, seed=2, first_step=10, marks=marks):
        if "marks" not in chart.data:
            continue
        rows = chart.data["marks"]
        assert list(rows["label"]) == ["engine rebalanced", "layout applied"], name
        if name.startswith("per step"):  # rollup buckets: dates on a UTC time axis
            assert rows["x"].dtype.kind == "M" and str(rows["x"].iloc[0]) == "1970-01-01 00:12:00", name
        elif not name.startswith("nvml"):
            assert list(rows["x"]) == [12.0, 20.0], name
        layers = json.dumps(chart.spec)
        assert '"strokeDash": [5, 4]' in layers and '{"name": "marks"}' in layers, name
    bare = load_figures.load_bands(np.arange(5), np.ones((5, 2)), "tokens")
    assert bare.data["marks"].empty


def test_expert_time_heatmap_is_binned_under_the_cell_budget_and_keeps_totals():
    rng = np.random.default_rng(0)
    counts_TE = rng.integers(0, 200, size=(2500, 64)).astype(np.int32)
    chart = expert_figures.expert_time_heatmap(np.arange(2500) + 7, counts_TE, layer=3)
    bins, cells = chart.data["bins"], chart.data["cells"]
    assert len(bins) == HEAT_COLUMNS and len(cells) == 64 * HEAT_COLUMNS <= HEAT_CELLS
    assert cells["tokens"].dtype == np.uint16 and cells["bin"].dtype == np.uint16  # bin sums under 65,536
    assert int(cells["tokens"].sum()) == int(counts_TE.sum())
    assert bins["x"].iloc[0] == 7 and int(bins["steps"].sum()) == 2500 and (bins["layer"] == 3).all()
    assert (bins["x2"].to_numpy()[:-1] == bins["x"].to_numpy()[1:]).all() and bins["x2"].iloc[-1] == 2507
    first = cells[(cells["bin"] == 0) & (cells["expert"] == 5)]["tokens"].item()
    assert first == counts_TE[: bins["steps"].iloc[0], 5].sum()
    heat = chart.spec["layer"][0]
    assert heat["mark"]["type"] == "rect" and heat["transform"][0]["lookup"] == "bin"
    assert "bin sum" in chart.spec["title"]["text"]
    assert [t["title"] for t in heat["encoding"]["tooltip"][:3]] == ["layer", "expert", "tokens (bin sum)"]


def test_layer_expert_heatmap_for_deepseek_and_a_larger_model():
    counts_LE = np.full((58, 256), 40_000, dtype=np.int64)
    chart = expert_figures.layer_expert_heatmap(counts_LE)
    cells = chart.data["cells"]
    assert len(cells) == 58 * 256 <= HEAT_CELLS and cells["tokens"].dtype == np.uint16
    assert chart.payload_bytes() < 58 * 256 * 5 + 8000  # 5 bytes a cell: uint16 layer, uint8 expert, uint16 tokens
    big = expert_figures.layer_expert_heatmap(np.ones((94, 512), dtype=np.int64))
    assert len(big.data["cells"]) == 94 * 256 and (big.data["cells"]["tokens"] == 2).all()  # pairs of experts summed
    assert "2 experts a column" in big.spec["title"]["text"]


def test_load_charts_hold_the_binned_values():
    rng = np.random.default_rng(1)
    loads_TLG = rng.random((1500, 3, 4)).astype(np.float32)
    loads_TG = loads_TLG.sum(axis=1)
    step_T = np.arange(1500) + 10
    bars = load_figures.gpu_load_bars(loads_TG[-1], window_stats(loads_TG), straggler_gpu=2, unit="tokens/step",
                                      gpus_per_node=2)
    main = bars.data["main"]
    assert list(main["marked"]) == [False, False, True, False] and list(main["node"]) == [0, 0, 1, 1]
    np.testing.assert_allclose(main["latest"], loads_TG[-1], rtol=1e-6)
    np.testing.assert_allclose(main["max"], loads_TG.max(axis=0), rtol=1e-6)
    bands = load_figures.load_bands(step_T, loads_TG, "tokens/step").data["main"]
    assert len(bands) == MAX_COLUMNS and bands["x"].iloc[0] == 10 and bands["mean"].dtype == np.float32
    np.testing.assert_allclose(bands["max (busiest GPU)"].max(), loads_TG.max(), rtol=1e-6)
    heat = load_figures.gpu_time_heatmap(step_T, loads_TG, "tokens/step")
    cells, bins = heat.data["cells"], heat.data["bins"]
    width = int(bins["steps"].iloc[0])
    np.testing.assert_allclose(cells[(cells["bin"] == 0) & (cells["gpu"] == 1)]["load"].item(),
                               loads_TG[:width, 1].mean(), rtol=1e-5)  # bin mean
    eta_TL = balancedness(loads_TLG)
    eta = load_figures.layer_eta_heatmap(step_T, eta_TL).data["cells"]
    np.testing.assert_allclose(eta[(eta["bin"] == 0) & (eta["layer"] == 2)]["eta"].item(),
                               100 * eta_TL[:width, 2].min(), rtol=1e-5)  # bin min
    svw = load_figures.step_vs_window_figure(step_vs_window(loads_TLG)).data["main"]
    assert list(svw.columns) == ["layer", "window sum", "per step, mean", "per step, p99"] and len(svw) == 3
    over = load_figures.eta_over_time(step_T, eta_TL).data["main"]
    assert over["min across layers"].min() == pytest.approx(float(np.nanmin(eta_TL)), rel=1e-6)


def test_wide_heatmaps_stay_under_the_cell_budget_and_say_gpu_and_node():
    heat = load_figures.gpu_time_heatmap(np.arange(600), np.ones((600, 256)), "tokens", gpus_per_node=8)
    cells = heat.data["cells"]
    assert len(cells) <= HEAT_CELLS and cells["gpu"].max() == 255 and len(heat.data["bins"]) == HEAT_CELLS // 256
    layer = heat.spec["layer"][0]
    assert {"calculate": "floor(datum.gpu / 8)", "as": "node"} in layer["transform"]
    assert [t["title"] for t in layer["encoding"]["tooltip"][:3]] == ["GPU", "node", "load (tokens, bin mean)"]
    assert layer["encoding"]["y"]["type"] == "ordinal"  # whole GPU numbers, never 0.5


def test_rollup_buckets_are_dates_on_a_utc_axis():
    x_T = (np.arange(3000) * 60).astype("datetime64[s]")
    top, bottom = rollup_figures.per_step_charts(x_T, per_step_stats(3000, 0), np.full(3000, 0.9), "tokens")
    main = top.data["main"]
    assert main["x"].dtype == "datetime64[ms]" and len(main) == MAX_COLUMNS and main is bottom.data["main"]
    x = top.spec["layer"][0]["encoding"]["x"]
    assert x["type"] == "temporal" and x["scale"] == {"type": "utc"}
    assert "per step: worst 5%" in main.columns
    heat = load_figures.gpu_time_heatmap(x_T, np.ones((3000, 4)), "tokens", x_title="time (bucket start, UTC)")
    bins = heat.data["bins"]
    assert bins["x"].dtype == "datetime64[ms]" and bins["x2"].iloc[-1] == np.datetime64(2999 * 60 + 60, "s")


def test_nvml_charts_keep_gaps_and_share_one_time_span():
    rows = nvml_rows(100.0 + np.arange(5))
    charts = gpu_figures.nvml_charts(rows, np.array([101.0, 104.0]), np.array([10.0, 12.0]), "the GPU",
                                     [(102.0, "engine rebalanced")])
    assert [c.spec["title"]["text"] for c in charts] == ["the GPU", *(t for t, _ in gpu_figures.PANELS[1:])]
    nvml = charts[1].data["nvml"]
    assert list(nvml.columns) == ["t", "util %", "used", "total", "power", "limit", "SM clock", "temperature",
                                  "segment", "dot"]
    assert nvml["power"].isna().all()  # never invented
    assert nvml["total"].iloc[0] == 8.0 and charts[0].data["load"]["t"].iloc[-1] == 0.0
    assert all(list(c.data["span"]["t"]) == [-4.0, 0.0] for c in charts)
    assert all(list(c.data["marks"]["x"]) == [-2.0] for c in charts)
    only_load = gpu_figures.nvml_charts([], np.array([1.0, 2.0]), np.array([3.0, 4.0]), "the GPU")
    assert len(only_load) == 1 and list(only_load[0].data["load"]["load"]) == [3.0, 4.0]
    holed = gpu_figures.nvml_charts(nvml_rows(np.r_[100.0 + np.arange(60), 200.0 + np.arange(60)]), np.array([]),
                                    np.array([]), "the GPU")[1].data["nvml"]  # the collector was away 40 s
    assert list(holed["segment"].iloc[[0, 59, 60, 119]]) == [0, 0, 1, 1] and not holed["dot"].any()
    # the load line over time breaks by step ids: prefill steps (every 10th, 200 ms) among 30 ms decode steps
    # leave no hole; steps 300-399 missing do
    step_T = np.r_[np.arange(300), np.arange(400, 700)]
    time_T = np.cumsum(np.where(step_T % 10 == 0, 0.2, 0.03))
    load = gpu_figures.nvml_charts([], time_T, np.ones(600), "the GPU", load_step_T=step_T)[0].data["load"]
    assert sorted(set(load["segment"])) == [0, 1] and list(load["segment"].iloc[[299, 300]]) == [0, 1]
    assert "step" not in load.columns


def test_time_charts_in_milliseconds_and_the_fit_as_data():
    ranks = time_figures.rank_breakdown(np.array([1e-3, 2e-3]), np.array([4e-3, 4e-3]), np.array([1e-3, 1e-3]),
                                        np.array([7e-3, 8e-3]), "layer 1").data["main"]
    np.testing.assert_allclose(ranks[["dispatch", "compute", "combine", "layer"]].to_numpy(),
                               [[1, 4, 1, 7], [2, 4, 1, 8]], rtol=1e-6)
    load_T, moe_T = np.array([10.0, 20.0, np.nan, 30.0]), np.array([1e-3, 2e-3, 5e-3, 3e-3])
    chart = time_figures.time_vs_load(load_T, moe_T, LineFit(1e-4, 0.0, 1.0, 3), np.arange(4))
    assert list(chart.data["steps"]["step"]) == [0, 1, 3]
    np.testing.assert_allclose(chart.data["fit"][["load", "ms"]].to_numpy(), [[10, 1], [30, 3]], rtol=1e-6)
    assert "R²" not in chart.spec["title"]["text"]  # said by the page: a title changing every tick re-creates the chart
    no_fit = time_figures.time_vs_load(load_T, moe_T, LineFit(float("nan"), float("nan"), float("nan"), 1),
                                       np.arange(4))
    assert no_fit.data["fit"].empty and list(no_fit.data["fit"].columns) == ["load", "ms"]
    wait = time_figures.wait_bars(np.array([2e-3, 5e-4])).data["main"]
    np.testing.assert_allclose(wait["wait"], [2.0, 0.5], rtol=1e-6)


def test_durations_in_words():
    from moe_monitor.dashboard.figures.units import format_duration

    assert [format_duration(s) for s in (0, 40, 150, 7200, 86400, 454028)] == [
        "0 s", "40 s", "2.5 min", "2 h", "1 day", "5.3 days"]
    assert format_duration(float("nan")) == format_duration(-1.0) == "unknown"


def test_layer_and_gpu_axes_are_whole_numbers_and_layers_are_not_joined():
    loads_TLG = np.random.default_rng(0).random((5, 3, 4))
    svw = load_figures.step_vs_window_figure(step_vs_window(loads_TLG)).spec["layer"][0]
    assert svw["mark"]["type"] == "point" and svw["encoding"]["x"]["type"] == "ordinal"
    heat = load_figures.layer_eta_heatmap(np.arange(5), np.full((5, 3), 0.8)).spec["layer"][0]["encoding"]["y"]
    assert heat == {"field": "layer", "type": "ordinal", "title": "layer", "axis": {"labelAngle": 0,
                                                                                    "labelOverlap": True}}
    step_axis = load_figures.load_bands(np.arange(5), np.ones((5, 2)), "t").spec["layer"][1]["encoding"]["x"]
    assert step_axis["axis"] == {"format": "d"}


STEP_LINES = ("bands", "eta time", "phases", "measured", "per step 0", "per step 1")  # lines over steps or time


def _line_layers(spec: dict, inherited: dict[str, Any] | None = None):
    """Each line-mark layer of a spec (nested layers included), with the encoding it inherits merged in."""
    encoding = {**(inherited or {}), **spec.get("encoding", {})}
    mark = spec.get("mark")
    if (mark.get("type") if isinstance(mark, dict) else mark) == "line":
        yield spec, encoding
    for child in spec.get("layer", []):
        yield from _line_layers(child, encoding)


def _detail_fields(encoding: dict) -> list[str]:
    detail = encoding.get("detail", [])
    return [d["field"] for d in (detail if isinstance(detail, list) else [detail])]


def test_lines_over_steps_break_at_a_hole_and_only_there():
    regular = dict(every_chart(300, seed=3))
    holed = dict(every_chart(300, seed=3, hole_after=120))
    for name in STEP_LINES:
        lines = list(_line_layers(regular[name].spec))
        assert lines and all("segment" in _detail_fields(enc) for _, enc in lines), name  # each line by segment
        assert json.dumps(regular[name].spec) == json.dumps(holed[name].spec), name  # the break is data
        main, broken = regular[name].data["main"], holed[name].data["main"]
        assert int(main["segment"].max()) == 0 and not main["dot"].any(), name
        assert list(np.flatnonzero(np.diff(broken["segment"].to_numpy()))) == [119], name
        layers = json.dumps(regular[name].spec)
        assert '"filter": "datum.dot"' in layers, name  # lone or sparse steps drawn as points


def test_a_staleness_curve_breaks_where_its_deltas_have_no_value():
    mean_D = np.linspace(1.1, 1.5, 80)
    mean_D[30:50] = np.nan  # no fit reaches these deltas in this phase
    curve = StalenessCurve(np.zeros(1), np.arange(1, 81), mean_D[None, :], mean_D, np.ones(80))
    chart = staleness_figures.staleness_curves([PhaseStaleness("decode", curve, None, 80)])
    main = chart.data["main"]
    assert len(main) == 60 and list(main["segment"].unique()) == [0, 1] and not main["dot"].any()
    assert _detail_fields(next(_line_layers(chart.spec))[1]) == ["kind", "segment"]


def test_no_field_name_that_vega_reads_as_a_path():
    for name, chart in every_chart(40, seed=4):
        for frame in chart.data.values():
            bad = [c for c in frame.columns if set(str(c)) & set("'\".[]\\")]
            assert not bad, (name, bad)  # Vega reads "a.b" and "a'b" as access paths: the chart would not draw
