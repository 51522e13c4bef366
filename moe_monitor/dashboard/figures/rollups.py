"""Plotly figure of what rollup buckets' sums hide: per-step balancedness and the busiest GPU's per-step load, over
the buckets' time axis (dashboard.analytics.rollups.PerStepStats).

Shape legend: T buckets.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from moe_monitor.dashboard.analytics.rollups import PerStepStats
from moe_monitor.dashboard.analytics.series import downsample_max
from moe_monitor.dashboard.figures.common import HEIGHT_PX, MAX_COLUMNS, axis_at, change_markers, f32


def per_step_figure(x_T: np.ndarray, stats: PerStepStats, sum_eta_T: np.ndarray, unit: str,
                    marks: Sequence[tuple[float | str, str]] = (), x_title: str = "time (bucket start, UTC)") -> go.Figure:
    """Two panels sharing the time axis x_T [T] (bucket starts). Top: per-step balancedness of each bucket, the
    median and the tail quantile of its per-(step, layer) histogram, beside the balancedness of the bucket's sum
    (sum_eta_T [T], p50 across layers) that hides them. Bottom: the busiest GPU's load per step (the bucket's
    mean and its peak) and the mean GPU's, in `unit`. More than MAX_COLUMNS buckets are binned, keeping the
    worst value of each bin (lowest balancedness, highest load)."""
    series_TX = np.stack([1.0 - stats.eta_p50_T, 1.0 - stats.eta_tail_T, 1.0 - np.asarray(sum_eta_T, dtype=np.float64),
                          stats.busiest_mean_T, stats.busiest_peak_T, stats.mean_load_T], axis=1) \
        if stats.eta_p50_T.size else np.zeros((0, 6))
    worst, first = downsample_max(np.nan_to_num(series_TX, nan=-np.inf), MAX_COLUMNS)
    worst = np.where(np.isfinite(worst), worst, np.nan)
    x = axis_at(x_T, first)
    pct = int(round(stats.tail_q * 100))
    traces = [
        dict(type="scatter", x=x, y=f32(1.0 - worst[:, 0]), name="per step: median", mode="lines"),
        dict(type="scatter", x=x, y=f32(1.0 - worst[:, 1]), name=f"per step: worst {pct}%", mode="lines",
             line=dict(dash="dot")),
        dict(type="scatter", x=x, y=f32(1.0 - worst[:, 2]), name="bucket sum (p50 over layers)", mode="lines",
             line=dict(color="#7f7f7f")),
        dict(type="scatter", x=x, y=f32(worst[:, 3]), name="busiest GPU, mean per step", mode="lines",
             xaxis="x2", yaxis="y2", line=dict(color="#d62728")),
        dict(type="scatter", x=x, y=f32(worst[:, 4]), name="busiest GPU, peak", mode="markers", xaxis="x2",
             yaxis="y2", marker=dict(color="#d62728", symbol="x", size=5)),
        dict(type="scatter", x=x, y=f32(worst[:, 5]), name="mean GPU, per step", mode="lines", xaxis="x2",
             yaxis="y2", line=dict(color="#2ca02c")),
    ]
    markers = change_markers(marks)
    layout = dict(
        template={}, height=2 * HEIGHT_PX, margin=dict(l=50, r=20, t=40, b=40), legend=dict(orientation="h", y=-0.12),
        title=dict(text="What the bucket sums hide: per-step balancedness and busiest-GPU load"),
        xaxis=dict(anchor="y", showticklabels=False), yaxis=dict(domain=[0.55, 1.0], range=[0, 1.02],
                                                                  title=dict(text="eta = mean/max")),
        xaxis2=dict(anchor="y2", matches="x", title=dict(text=x_title)),
        yaxis2=dict(domain=[0.0, 0.45], title=dict(text=f"load ({unit})")),
        shapes=markers["shapes"], annotations=markers["annotations"],
    )
    return go.Figure(dict(data=traces, layout=layout))
