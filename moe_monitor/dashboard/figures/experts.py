"""Plotly figure builders for the Experts page (heatmaps as small unsigned ints, time downsampled).

Shape legend: T steps, L layers, E logical experts.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moe_monitor.dashboard.analytics.series import downsample_sum, small_ints
from moe_monitor.dashboard.figures.common import MAX_COLUMNS, axis_at, change_markers, f32, figure


def layer_expert_heatmap(counts_LE: np.ndarray):
    """Layer x expert heatmap of tokens summed over the window."""
    num_layers, num_experts = counts_LE.shape
    trace = dict(type="heatmap", z=small_ints(counts_LE), x=np.arange(num_experts, dtype=np.int32),
                 y=np.arange(num_layers, dtype=np.int32), colorscale="Viridis", colorbar=dict(title=dict(text="tokens")))
    return figure([trace], "Tokens per expert over the window (layer x expert)", "expert", "layer",
                  height=max(260, min(700, 12 * num_layers + 120)))


def expert_time_heatmap(step_T: np.ndarray, counts_TE: np.ndarray, layer: int,
                        marks: Sequence[tuple[float | str, str]] = (), x_title: str = "step"):
    """Expert x time heatmap of one layer: tokens per expert summed into <= MAX_COLUMNS time bins; marks:
    (step, label) of each layout change in view, a dashed vertical line each. step_T may be rollup bucket
    starts (datetime64), x_title naming the axis."""
    traces = []
    if counts_TE.shape[0]:
        binned, first = downsample_sum(counts_TE.astype(np.int64), MAX_COLUMNS)
        traces = [dict(type="heatmap", z=small_ints(binned.T), x=axis_at(step_T, first),
                       y=np.arange(counts_TE.shape[1], dtype=np.int32), colorscale="Viridis",
                       colorbar=dict(title=dict(text="tokens")))]
    return figure(traces, f"Layer {layer}: tokens per expert over time", x_title, "expert", height=420,
                  **change_markers(marks))


def drift_bars(js_L: np.ndarray):
    """Per layer: Jensen-Shannon divergence (base 2) between the older and the newer half of the window."""
    trace = dict(type="bar", x=np.arange(js_L.size, dtype=np.int32), y=f32(js_L), name="JS divergence")
    return figure([trace], "Popularity drift per layer (JS divergence, older vs newer half)", "layer", "JS (bits)")
