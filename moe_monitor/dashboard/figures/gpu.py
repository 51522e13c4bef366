"""Plotly figure for the GPU panel: one device's NVML readings beside the expert load of its EP GPU.

GPU utilisation from NVML is time-based (share of time a kernel was running), not SM occupancy.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from moe_monitor.dashboard.figures.common import change_markers, f32
from moe_monitor.dashboard.figures.units import GIB

PANELS = (  # (title, [(field, scale, trace name, dashed)])
    ("expert load (tokens/step)", []),
    ("GPU utilisation % (time-based: a kernel was running)", [("gpu_utilization_percent", 1.0, "util %", False)]),
    ("memory GiB (used / total)", [("memory_used_bytes", GIB, "used", False), ("memory_total_bytes", GIB, "total", True)]),
    ("power W (usage / limit)", [("power_usage_w", 1.0, "power", False), ("power_limit_w", 1.0, "limit", True)]),
    ("SM clock MHz", [("sm_clock_mhz", 1.0, "SM clock", False)]),
    ("temperature C", [("temperature_c", 1.0, "temperature", False)]),
)


def _series(rows: list[dict], name: str, scale: float = 1.0) -> np.ndarray:
    return f32([np.nan if r.get(name) is None else r[name] / scale for r in rows])


def nvml_figure(rows: list[dict], load_time_s_T: np.ndarray, load_T: np.ndarray, title: str,
                marks: Sequence[tuple[float, str]] = ()) -> go.Figure:
    """Stacked panels over wall time (seconds before the latest reading): the EP GPU's expert load, then,
    when NVML readings exist, utilisation (time-based), memory used/total, power vs limit, SM clock and
    temperature. Values NVML could not read are gaps. marks: (unix time, label) of each layout change in
    view, a dashed vertical line across every panel."""
    panels = PANELS if rows else PANELS[:1]
    t = np.asarray([r["time_s"] for r in rows], dtype=np.float64)
    load_time_s_T = np.asarray(load_time_s_T, dtype=np.float64)
    now = max([v.max() for v in (t, load_time_s_T) if v.size], default=0.0)
    n, gap = len(panels), 0.04
    height = (1.0 - gap * (n - 1)) / n
    layout: dict = dict(template={}, title=dict(text=title), height=160 * n + 80, showlegend=False,
                        margin=dict(l=50, r=20, t=60, b=40), annotations=[])
    traces = [dict(type="scatter", x=f32(load_time_s_T - now), y=f32(load_T), mode="lines", name="expert load")]
    for i, (panel_title, fields) in enumerate(panels):
        top = 1.0 - i * (height + gap)
        suffix = "" if i == 0 else str(i + 1)
        layout[f"yaxis{suffix}"] = dict(domain=[max(0.0, top - height), min(1.0, top)], anchor=f"x{suffix}")
        layout[f"xaxis{suffix}"] = dict(anchor=f"y{suffix}", matches=None if i == 0 else "x",
                                        showticklabels=i == n - 1)
        layout["annotations"].append(dict(text=panel_title, x=0.5, y=top, xref="paper", yref="paper",
                                          xanchor="center", yanchor="bottom", showarrow=False))
        for name, scale, label, dashed in fields:
            traces.append(dict(type="scatter", x=f32(t - now), y=_series(rows, name, scale), mode="lines",
                               name=label, xaxis=f"x{suffix}", yaxis=f"y{suffix}",
                               line=dict(dash="dash") if dashed else {}))
    layout[f"xaxis{'' if n == 1 else n}"]["title"] = dict(text="seconds before the latest reading")
    markers = change_markers([(time_s - now, label) for time_s, label in marks])
    layout["shapes"] = markers["shapes"]
    layout["annotations"] += markers["annotations"]
    return go.Figure(dict(data=traces, layout=layout))
