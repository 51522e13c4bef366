"""Vega-Lite charts of the Overview's details and the Devices page: per-GPU bars, load bands over time, GPU x
time and layer x time heatmaps, balancedness over time, per-step against window-sum imbalance.

The time-axis charts take marks: (step, label) of each layout change in view (Snapshot.axis_marks()), rows of
their "marks" dataset. Their x values are step ids, or rollup bucket starts as datetime64 with x_title naming
the axis (Snapshot.x_T, Snapshot.x_title). Every spec depends on titles and units only (figures.common).

Shape legend: T steps, L layers, G GPUs.
"""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from moe_monitor.dashboard.analytics.balance import GpuWindowStats, StepVsWindow
from moe_monitor.dashboard.analytics.series import downsample_max, downsample_sum
from moe_monitor.dashboard.figures.common import (
    BLUE,
    DARK,
    GREEN,
    GREY,
    MAX_COLUMNS,
    ORANGE,
    RED,
    SEGMENT,
    Chart,
    Marks,
    axis_at,
    bins_data,
    chart,
    f32,
    folded_lines,
    heat_cells,
    heat_columns,
    heat_layer,
    hover_rule,
    is_temporal,
    legend_colour,
    marks_data,
    marks_layers,
    named,
    time_tooltip,
    time_x,
    whole_axis,
)
from moe_monitor.dashboard.figures.gaps import with_gaps

BARS = ("latest step", "latest step, busiest", "window mean", "window p99", "window max")


def gpu_load_bars(latest_G: np.ndarray, stats: GpuWindowStats, straggler_gpu: int | None, unit: str,
                  gpus_per_node: int = 1) -> Chart:
    """Per-GPU load: the latest step as bars (straggler_gpu in red), the window's mean / p99 / max per GPU as
    ticks and points. Dataset "main": gpu, node, latest, mean, p99, max, marked."""
    gpus = np.arange(np.asarray(latest_G).size)
    data = pd.DataFrame({"gpu": gpus.astype(np.uint16), "node": (gpus // max(gpus_per_node, 1)).astype(np.uint16),
                         "latest": f32(latest_G), "mean": f32(stats.mean_G), "p99": f32(stats.p99_G),
                         "max": f32(stats.max_G), "marked": gpus == (-1 if straggler_gpu is None else straggler_gpu)})
    x = whole_axis("gpu", "GPU", gpus.size)
    y_title = f"load ({unit})"
    colour = legend_colour(BARS, (BLUE, RED, GREEN, ORANGE, DARK))
    tip = [{"field": "gpu", "title": "GPU"}, {"field": "node", "title": "node"},
           *({"field": f, "title": f"{t} ({unit})", "format": ",.1f", "type": "quantitative"}
             for f, t in (("latest", "latest step"), ("mean", "window mean"), ("p99", "window p99"),
                          ("max", "window max")))]
    main = named("main")
    layers = [
        {"data": main, "transform": [{"calculate": f"datum.marked ? '{BARS[1]}' : '{BARS[0]}'", "as": "series"}],
         "mark": {"type": "bar"},
         "encoding": {"x": x, "y": {"field": "latest", "type": "quantitative", "title": y_title},
                      "color": {"field": "series", "type": "nominal", **colour}, "tooltip": tip}},
        {"data": main, "mark": {"type": "tick", "thickness": 3},
         "encoding": {"x": x, "y": {"field": "mean", "type": "quantitative"}, "color": {"datum": BARS[2]},
                      "tooltip": tip}},
        {"data": main, "mark": {"type": "point", "shape": "triangle-up", "filled": True, "size": 60},
         "encoding": {"x": x, "y": {"field": "p99", "type": "quantitative"}, "color": {"datum": BARS[3]},
                      "tooltip": tip}},
        {"data": main, "mark": {"type": "point", "shape": "cross", "filled": True, "size": 50},
         "encoding": {"x": x, "y": {"field": "max", "type": "quantitative"}, "color": {"datum": BARS[4]},
                      "tooltip": tip}},
    ]
    return chart(layers, "Per-GPU load: latest step and window", main=data)


def line_chart(x_T, first: np.ndarray, series: dict[str, np.ndarray], colours: dict[str, str], title: str,
               x_title: str, y: dict, marks: Marks, dashed: tuple[str, ...] = (), band: tuple[str, str] | None = None,
               unit: str = "", fmt: str = ",.3~f") -> Chart:
    """Lines over time of a few series (name -> values at the binned columns), folded from dataset "main"
    (x, one column per series, segment and dot: figures.gaps); band: (low, high) series filled between; a hover
    rule lists every series."""
    temporal = is_temporal(x_T)
    x = time_x(x_title, temporal)
    names = list(series)
    data = with_gaps(pd.DataFrame({"x": axis_at(x_T, first), **{n: f32(values) for n, values in series.items()}}),
                     names)
    layers: list[dict] = []
    if band is not None:
        layers.append({"data": named("main"), "mark": {"type": "area", "opacity": 0.15, "color": colours[band[1]]},
                       "encoding": {"x": x, "y": {"field": band[0], "type": "quantitative"},
                                    "y2": {"field": band[1]}, "detail": SEGMENT}})
    layers.append(folded_lines(names, [colours[n] for n in names], x, y, dashed))
    suffix = f" ({unit})" if unit else ""
    layers.append(hover_rule(x, [time_tooltip(x_title, temporal),
                                 *({"field": n, "title": n + suffix, "type": "quantitative", "format": fmt}
                                   for n in names)]))
    layers += marks_layers(x)
    return chart(layers, title, main=data, marks=marks_data(marks, temporal))


def load_bands(step_T: np.ndarray, loads_TG: np.ndarray, unit: str, marks: Marks = (), x_title: str = "step") -> Chart:
    """Across GPUs, per step: max, p99 and mean GPU load (band from mean to max), binned to <= MAX_COLUMNS
    columns keeping each bin's highest value."""
    per_step = np.zeros((0, 3))
    if loads_TG.shape[0]:
        per_step = np.stack([loads_TG.max(axis=1), np.percentile(loads_TG, 99.0, axis=1), loads_TG.mean(axis=1)], 1)
    binned, first = downsample_max(per_step, MAX_COLUMNS)
    series = {"max (busiest GPU)": binned[:, 0], "p99": binned[:, 1], "mean": binned[:, 2]}
    return line_chart(step_T, first, series, {"max (busiest GPU)": RED, "p99": ORANGE, "mean": GREEN},
                      "GPU load over time (across GPUs, bin max)", x_title, {"title": f"load ({unit})"}, marks,
                      dashed=("p99",), band=("mean", "max (busiest GPU)"), unit=unit, fmt=",.1f")


def gpu_time_heatmap(step_T: np.ndarray, loads_TG: np.ndarray, unit: str, marks: Marks = (),
                     x_title: str = "step", gpus_per_node: int = 1) -> Chart:
    """GPU x time heatmap of per-GPU load: each cell the mean per step of a time bin (<= HEAT_COLUMNS bins,
    <= HEAT_CELLS cells). Datasets: "bins" (figures.common.bins_data), "cells" (bin, gpu, load), "marks"."""
    num_steps, gpus = loads_TG.shape
    binned, first = downsample_sum(np.asarray(loads_TG, dtype=np.float64), heat_columns(gpus))
    width = np.diff(np.append(first, num_steps))[:, None]
    temporal = is_temporal(step_T)
    layers = [{**heat_layer(x_title, temporal, whole_axis("gpu", "GPU", gpus),
                            {"field": "load", "type": "quantitative", "scale": {"scheme": "viridis"},
                             "legend": {"title": unit}},
                            [{"field": "gpu", "title": "GPU"}, {"field": "node", "title": "node"},
                             {"field": "load", "title": f"load ({unit}, bin mean)", "type": "quantitative",
                              "format": ",.1f"}])},
              *marks_layers(time_x(x_title, temporal))]
    layers[0]["transform"].append({"calculate": f"floor(datum.gpu / {max(gpus_per_node, 1)})", "as": "node"})
    return chart(layers, f"Per-GPU load over time ({unit}, bin mean)", bins=bins_data(step_T, first, num_steps),
                 cells=heat_cells(binned / np.maximum(width, 1), "gpu", "load"), marks=marks_data(marks, temporal))


def layer_eta_heatmap(step_T: np.ndarray, eta_TL: np.ndarray, marks: Marks = (), x_title: str = "step") -> Chart:
    """Layer x time heatmap of per-step balancedness eta in percent, the worst step of each time bin (idle
    layers read 100). Datasets: "bins", "cells" (bin, layer, eta), "marks"."""
    num_steps, layers_n = eta_TL.shape
    worst, first = downsample_max(np.nan_to_num(1.0 - np.asarray(eta_TL, dtype=np.float64), nan=0.0),
                                  heat_columns(layers_n))
    temporal = is_temporal(step_T)
    layers = [heat_layer(x_title, temporal, whole_axis("layer", "layer", layers_n),
                         {"field": "eta", "type": "quantitative",
                          "scale": {"scheme": "redyellowgreen", "domain": [0, 100]}, "legend": {"title": "eta %"}},
                         [{"field": "layer", "title": "layer"},
                          {"field": "eta", "title": "eta % (worst step in the bin)", "type": "quantitative",
                           "format": ".0f"}]),
              *marks_layers(time_x(x_title, temporal))]
    return chart(layers, "Per-layer balancedness over time (eta %, bin min)", bins=bins_data(step_T, first, num_steps),
                 cells=heat_cells(100.0 * (1.0 - worst), "layer", "eta"), marks=marks_data(marks, temporal))


def step_vs_window_figure(svw: StepVsWindow) -> Chart:
    """Per layer: window-sum imbalance beside the mean and p99 of per-step imbalance (max/mean), as points
    (layers are not a continuum). Dataset "main": layer and one column per series."""
    names = ("window sum", "per step, mean", "per step, p99")
    data = pd.DataFrame({"layer": np.arange(svw.window_sum_L.size, dtype=np.uint16),
                         **{n: f32(v) for n, v in zip(names, (svw.window_sum_L, svw.per_step_mean_L,
                                                              svw.per_step_p99_L))}})
    layers = [{"data": named("main"), "transform": [{"fold": list(names), "as": ["series", "imbalance"]}],
               "mark": {"type": "point", "filled": True, "size": 60},
               "encoding": {"x": whole_axis("layer", "layer", data.shape[0]),
                            "y": {"field": "imbalance", "type": "quantitative", "title": "imbalance (max/mean)",
                                  "scale": {"zero": False}},
                            "color": {"field": "series", "type": "nominal", **legend_colour(names, (GREY, BLUE, RED))},
                            "tooltip": [{"field": "layer", "title": "layer"}, {"field": "series", "title": "what"},
                                        {"field": "imbalance", "title": "max/mean", "type": "quantitative",
                                         "format": ".3f"}]}}]
    return chart(layers, "Imbalance (max/mean): per step vs window sum", main=data)


def eta_over_time(step_T: np.ndarray, eta_TL: np.ndarray, marks: Marks = (), x_title: str = "step") -> Chart:
    """Per step: p50 and min of eta across layers, binned to <= MAX_COLUMNS columns keeping each bin's worst."""
    lows = np.zeros((0, 2))
    if eta_TL.shape[0]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # steps where every layer is idle stay NaN
            lows = np.stack([np.nanmin(eta_TL, axis=1), np.nanmedian(eta_TL, axis=1)], 1)
    worst, first = downsample_max(np.nan_to_num(1.0 - lows, nan=0.0), MAX_COLUMNS)
    series = {"p50 across layers": 1.0 - worst[:, 1], "min across layers": 1.0 - worst[:, 0]}
    return line_chart(step_T, first, series, {"p50 across layers": BLUE, "min across layers": RED},
                      "Balancedness over time (across layers, bin min)", x_title,
                      {"title": "eta = mean/max", "scale": {"domain": [0, 1]}}, marks)
