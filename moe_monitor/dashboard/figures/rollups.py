"""Vega-Lite chart of what rollup buckets' sums hide: per-step balancedness and the busiest GPU's per-step load,
over the buckets' time axis (dashboard.analytics.rollups.PerStepStats), one chart each.

Shape legend: T buckets.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from moe_monitor.dashboard.analytics.rollups import PerStepStats
from moe_monitor.dashboard.analytics.series import downsample_max
from moe_monitor.dashboard.figures.common import (
    BLUE,
    GREEN,
    GREY,
    MAX_COLUMNS,
    PURPLE,
    RED,
    Chart,
    axis_at,
    chart,
    f32,
    folded_lines,
    hover_rule,
    is_temporal,
    marks_data,
    marks_layers,
    named,
    time_tooltip,
    time_x,
)
from moe_monitor.dashboard.figures.gaps import with_gaps

ETA = ("per step: median", "per step: worst {pct}%", "bucket sum (p50 over layers)")
LOAD = ("busiest GPU, mean per step", "busiest GPU, peak", "mean GPU, per step")


def per_step_charts(x_T: np.ndarray, stats: PerStepStats, sum_eta_T: np.ndarray, unit: str,
                    marks: Sequence[tuple[float | str, str]] = (), x_title: str = "time (bucket start, UTC)") -> list[Chart]:
    """Two charts over the time axis x_T [T] (bucket starts). Top: per-step balancedness of each bucket, the
    median and the tail quantile of its per-(step, layer) histogram, beside the balancedness of the bucket's sum
    (sum_eta_T [T], p50 across layers) that hides them. Bottom: the busiest GPU's load per step (the bucket's
    mean, and its peak as points) and the mean GPU's, in `unit`. More than MAX_COLUMNS buckets are binned,
    keeping the worst value of each bin (lowest balancedness, highest load). Dataset "main": x, a column per
    series (named as in the legend), segment and dot (figures.gaps: lines break where buckets are missing)."""
    series_TX = np.stack([1.0 - stats.eta_p50_T, 1.0 - stats.eta_tail_T, 1.0 - np.asarray(sum_eta_T, dtype=np.float64),
                          stats.busiest_mean_T, stats.busiest_peak_T, stats.mean_load_T], axis=1) \
        if stats.eta_p50_T.size else np.zeros((0, 6))
    worst, first = downsample_max(np.nan_to_num(series_TX, nan=-np.inf), MAX_COLUMNS)
    worst = np.where(np.isfinite(worst), worst, np.nan)
    eta_names = [ETA[0], ETA[1].format(pct=int(round(stats.tail_q * 100))), ETA[2]]
    values = [1.0 - worst[:, 0], 1.0 - worst[:, 1], 1.0 - worst[:, 2], worst[:, 3], worst[:, 4], worst[:, 5]]
    names = [*eta_names, *LOAD]
    data = with_gaps(pd.DataFrame({"x": axis_at(x_T, first), **{n: f32(v) for n, v in zip(names, values)}}), names)
    temporal = is_temporal(x_T)
    x = time_x(x_title, temporal)

    top = [folded_lines(eta_names, [BLUE, PURPLE, GREY], x, {"title": "eta = mean/max", "scale": {"domain": [0, 1]}},
                        (eta_names[1],)),
           hover_rule(x, [time_tooltip(x_title, temporal), *({"field": n, "title": n, "type": "quantitative",
                                                                  "format": ".3f"} for n in eta_names)], param="top"),
           *marks_layers(x)]
    bottom = [folded_lines([LOAD[0], LOAD[2]], [RED, GREEN], x, {"title": f"load ({unit})"}),
              {"data": named("main"), "mark": {"type": "point", "shape": "cross", "color": RED, "size": 30},
               "encoding": {"x": x, "y": {"field": LOAD[1], "type": "quantitative"}}},
              hover_rule(x, [time_tooltip(x_title, temporal), *({"field": n, "title": f"{n} ({unit})",
                                                                 "type": "quantitative", "format": ",.0f"}
                                                                for n in LOAD)], param="bottom"),
              *marks_layers(x, labels=False)]
    marked = marks_data(marks, temporal)
    return [chart(top, "What the bucket sums hide: per-step balancedness", main=data, marks=marked),
            chart(bottom, "What the bucket sums hide: the busiest GPU's load per step", main=data, marks=marked)]
