"""Plotly figure for the GPU panel's "Measured vs estimated": per step, busiest GPU / mean under the even-split
estimate and under the loads the engine measured, and their difference (what its balancer won).

Shape legend: T steps.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from moe_monitor.dashboard.analytics.measured import MeasuredVsEstimated
from moe_monitor.dashboard.figures.common import change_markers, f32, figure


def measured_figure(result: MeasuredVsEstimated, marks: Sequence[tuple[float, str]] = ()) -> go.Figure:
    """Two lines over step id (estimated and measured imbalance) and the won difference as bars on a second
    y axis; marks: (step, label) of each layout change, a dashed vertical line."""
    x = result.step_T.astype(np.float64)
    traces = [
        dict(type="scatter", mode="lines", x=x, y=f32(result.estimated_T), name="even-split estimate",
             line=dict(dash="dash")),
        dict(type="scatter", mode="lines", x=x, y=f32(result.measured_T), name="measured (engine's balancer)"),
        dict(type="bar", x=x, y=f32(result.won_T), name="won (estimate - measured)", yaxis="y2", opacity=0.35),
    ]
    return figure(traces, "Busiest GPU / mean: estimated vs measured", "step", "busiest GPU / mean",
                  yaxis2=dict(title=dict(text="won"), overlaying="y", side="right", showgrid=False, rangemode="tozero"),
                  **change_markers(list(marks)))
