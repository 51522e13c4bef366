"""Plotly figure for the GPU panel: one device's NVML readings beside the expert load of its EP GPU.

GPU utilisation from NVML is time-based (share of time a kernel was running), not SM occupancy.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.figures import f32

GIB = float(1 << 30)


def _series(rows: list[dict], name: str, scale: float = 1.0) -> np.ndarray:
    return f32([np.nan if r.get(name) is None else r[name] / scale for r in rows])


def nvml_figure(rows: list[dict], load_time_s_T: np.ndarray, load_T: np.ndarray, title: str):
    """Six stacked panels over wall time: expert load of the EP GPU, utilisation (time-based), memory
    used/total, power vs limit, SM clock, temperature. Values NVML could not read are gaps."""
    fig = make_subplots(rows=6, cols=1, shared_xaxes=True, vertical_spacing=0.03, subplot_titles=(
        "expert load (tokens/step, all layers)", "GPU utilisation % (time-based: a kernel was running)",
        "memory GiB (used / total)", "power W (usage / limit)", "SM clock MHz", "temperature C"))
    fig.update_layout(template=go.layout.Template(), height=900, margin=dict(l=50, r=20, t=60, b=30),
                      title=title, showlegend=False)
    t = np.asarray([r["time_s"] for r in rows], dtype=np.float64)
    load_time_s_T = np.asarray(load_time_s_T, dtype=np.float64)
    now = max([v.max() for v in (t, load_time_s_T) if v.size], default=0.0)
    fig.add_scatter(x=f32(load_time_s_T - now), y=f32(load_T), mode="lines", name="expert load", row=1, col=1)
    if rows:
        x = f32(t - now)
        fig.add_scatter(x=x, y=_series(rows, "gpu_utilization_percent"), name="util %", row=2, col=1)
        fig.add_scatter(x=x, y=_series(rows, "memory_used_bytes", GIB), name="used", row=3, col=1)
        fig.add_scatter(x=x, y=_series(rows, "memory_total_bytes", GIB), name="total", row=3, col=1,
                        line=dict(dash="dash"))
        fig.add_scatter(x=x, y=_series(rows, "power_usage_w"), name="power", row=4, col=1)
        fig.add_scatter(x=x, y=_series(rows, "power_limit_w"), name="limit", row=4, col=1, line=dict(dash="dash"))
        fig.add_scatter(x=x, y=_series(rows, "sm_clock_mhz"), name="SM clock", row=5, col=1)
        fig.add_scatter(x=x, y=_series(rows, "temperature_c"), name="temperature", row=6, col=1)
    fig.update_xaxes(title_text="seconds before the latest reading", row=6, col=1)
    return fig
