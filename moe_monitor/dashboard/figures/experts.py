"""Vega-Lite charts of the Experts page: layer x expert and expert x time heatmaps, drift per layer.

Shape legend: T steps, L layers, E logical experts.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from moe_monitor.dashboard.analytics.series import downsample_sum
from moe_monitor.dashboard.figures.common import (
    HEAT_CELLS,
    HEIGHT_PX,
    Chart,
    Marks,
    bins_data,
    chart,
    f32,
    heat_cells,
    heat_columns,
    heat_layer,
    is_temporal,
    marks_data,
    marks_layers,
    named,
    time_x,
    whole_axis,
)

TOKENS = {"field": "tokens", "type": "quantitative", "scale": {"scheme": "viridis"}, "legend": {"title": "tokens"}}


def layer_expert_heatmap(counts_LE: np.ndarray) -> Chart:
    """Layer x expert heatmap of tokens summed over the window; past HEAT_CELLS cells, experts summed in groups
    of consecutive ids (the title says how many). Dataset "cells": layer, expert (first of its group), tokens."""
    num_layers, num_experts = counts_LE.shape
    group = max(1, math.ceil(num_layers * num_experts / HEAT_CELLS))
    starts = np.arange(0, num_experts, group)
    summed = np.add.reduceat(np.asarray(counts_LE, dtype=np.int64), starts, axis=1) if num_experts else counts_LE
    data = heat_cells(summed, "expert", "tokens", np.uint32).rename(columns={"bin": "layer"})
    data["expert"] = starts.astype(data["expert"].dtype if num_experts <= 256 else np.uint16)[data["expert"]]
    what = "expert" if group == 1 else f"expert (first of {group})"
    layers = [{"data": named("cells"), "mark": {"type": "rect"},
               "encoding": {"x": whole_axis("expert", what, starts.size), "y": whole_axis("layer", "layer", num_layers),
                            "color": TOKENS,
                            "tooltip": [{"field": "layer", "title": "layer"}, {"field": "expert", "title": what},
                                        {"field": "tokens", "title": "tokens over the window", "format": ","}]}}]
    title = "Tokens per expert over the window (layer x expert" + ("" if group == 1 else f", {group} experts a column") + ")"
    return chart(layers, title, max(260, min(700, 12 * num_layers + 120)), cells=data)


def expert_time_heatmap(step_T: np.ndarray, counts_TE: np.ndarray, layer: int, marks: Marks = (),
                        x_title: str = "step") -> Chart:
    """Expert x time heatmap of one layer: tokens per expert summed into <= HEAT_COLUMNS time bins (<= HEAT_CELLS
    cells); the layer is data (its "bins" rows), so the spec stays when the worst layer changes. step_T may be
    rollup bucket starts (datetime64), x_title naming the axis. Datasets: "bins" (+ layer), "cells", "marks"."""
    num_steps, num_experts = counts_TE.shape
    binned, first = downsample_sum(np.asarray(counts_TE, dtype=np.int64), heat_columns(num_experts))
    bins = bins_data(step_T, first, num_steps).assign(layer=np.uint16(layer))
    temporal = is_temporal(step_T)
    heat = heat_layer(x_title, temporal, whole_axis("expert", "expert", num_experts), TOKENS,
                      [{"field": "layer", "title": "layer"}, {"field": "expert", "title": "expert"},
                       {"field": "tokens", "title": "tokens (bin sum)", "format": ","}])
    heat["transform"][0]["from"]["fields"].append("layer")
    return chart([heat, *marks_layers(time_x(x_title, temporal))], "Tokens per expert over time, one layer (bin sum)",
                 420, bins=bins, cells=heat_cells(binned, "expert", "tokens", np.uint32), marks=marks_data(marks, temporal))


def drift_bars(js_L: np.ndarray) -> Chart:
    """Per layer: Jensen-Shannon divergence (base 2) between the older and the newer half of the window."""
    data = pd.DataFrame({"layer": np.arange(np.asarray(js_L).size, dtype=np.uint16), "js": f32(js_L)})
    layers = [{"data": named("main"), "mark": {"type": "bar"},
               "encoding": {"x": whole_axis("layer", "layer", data.shape[0]),
                            "y": {"field": "js", "type": "quantitative", "title": "JS (bits)"},
                            "tooltip": [{"field": "layer", "title": "layer"},
                                        {"field": "js", "title": "JS divergence (bits)", "format": ".4f"}]}}]
    return chart(layers, "Popularity drift per layer (JS divergence, older vs newer half)", HEIGHT_PX, main=data)
