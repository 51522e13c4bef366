"""Vega-Lite chart of the GPU panel's "Measured vs estimated": per step, busiest GPU / mean under the even-split
estimate and under the loads the engine measured, and their difference (what its balancer won).

Shape legend: T steps.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from moe_monitor.dashboard.analytics.measured import MeasuredVsEstimated
from moe_monitor.dashboard.figures.common import (
    BLUE,
    GREEN,
    ORANGE,
    Chart,
    chart,
    f32,
    folded_lines,
    hover_rule,
    marks_data,
    marks_layers,
    named,
    time_tooltip,
    time_x,
)
from moe_monitor.dashboard.figures.gaps import with_gaps

SERIES = ("even-split estimate", "measured (engine balancer)")  # no quote or dot: Vega reads a field as a path


def measured_figure(result: MeasuredVsEstimated, marks: Sequence[tuple[float, str]] = ()) -> Chart:
    """Two lines over step id (estimated and measured imbalance) and the won difference as bars on their own
    right-hand axis; marks: (step, label) of each layout change. Dataset "main": x (step), estimated, measured,
    won, segment and dot (figures.gaps)."""
    data = with_gaps(pd.DataFrame({"x": np.asarray(result.step_T, dtype=np.int64), SERIES[0]: f32(result.estimated_T),
                                   SERIES[1]: f32(result.measured_T), "won": f32(result.won_T)}), SERIES)
    x = time_x("step", False)
    lines = folded_lines(SERIES, [BLUE, ORANGE], x, {"title": "busiest GPU / mean", "scale": {"zero": False}},
                         (SERIES[0],))
    won = {"data": named("main"), "mark": {"type": "bar", "opacity": 0.35},
           "encoding": {"x": x, "y": {"field": "won", "type": "quantitative", "title": "won",
                                      "axis": {"orient": "right"}},
                        "color": {"value": GREEN}}}
    tip = [time_tooltip("step", False), *({"field": n, "title": n, "type": "quantitative", "format": ".3f"}
                                          for n in (*SERIES, "won"))]
    layers = [{"layer": [won, {"layer": [lines, hover_rule(x, tip), *marks_layers(x)]}],
               "resolve": {"scale": {"y": "independent"}}}]
    return chart(layers, "Busiest GPU / mean: estimated vs measured", main=data, marks=marks_data(marks))
