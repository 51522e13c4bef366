"""Plotly figure builders for the Overview and Devices pages: per-GPU bars, load bands over time, GPU x
time and layer x time heatmaps, per-step against window-sum imbalance.

The time-axis figures take marks: (step, label) of each layout change in view, drawn as a dashed vertical
line (Snapshot.axis_marks()). Their x values are step ids, or rollup bucket starts as datetime64 with
x_title naming the axis (Snapshot.x_T, Snapshot.x_title).

Shape legend: T steps, L layers, G GPUs.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from moe_monitor.dashboard.analytics.balance import GpuWindowStats, StepVsWindow
from moe_monitor.dashboard.analytics.series import downsample_max, downsample_sum, small_ints
from moe_monitor.dashboard.figures.common import MAX_COLUMNS, axis_at, change_markers, f32, figure

Marks = Sequence[tuple[float | str, str]]  # (step, or a date string on a time axis; label) of each change in view


def gpu_load_bars(latest_G: np.ndarray, stats: GpuWindowStats, straggler_gpu: int | None,
                  unit: str) -> go.Figure:
    """Per-GPU load: the latest step as bars (the straggler in red), the window's mean / p99 / max per GPU
    as markers."""
    gpus = np.arange(latest_G.size, dtype=np.int32)
    colours = np.where(gpus == (-1 if straggler_gpu is None else straggler_gpu), "#d62728", "#1f77b4")
    traces = [
        dict(type="bar", x=gpus, y=f32(latest_G), name="latest step", marker=dict(color=list(colours))),
        dict(type="scatter", x=gpus, y=f32(stats.mean_G), name="window mean", mode="markers",
             marker=dict(symbol="line-ew-open", size=18, color="#2ca02c", line=dict(width=3))),
        dict(type="scatter", x=gpus, y=f32(stats.p99_G), name="window p99", mode="markers",
             marker=dict(symbol="triangle-up", size=9, color="#ff7f0e")),
        dict(type="scatter", x=gpus, y=f32(stats.max_G), name="window max", mode="markers",
             marker=dict(symbol="x", size=8, color="#444")),
    ]
    return figure(traces, "Per-GPU load: latest step and window", "GPU", f"load ({unit})",
                  xaxis=dict(range=[-0.5, latest_G.size - 0.5], dtick=1 if latest_G.size <= 32 else None))


def integer_axis(count: int) -> dict:
    """An axis of layers or GPUs: whole-number ticks only (every one up to 32 of them)."""
    return dict(tickformat="d", dtick=1) if count <= 32 else dict(tickformat="d")


def load_bands(step_T: np.ndarray, loads_TG: np.ndarray, unit: str, marks: Marks = (), x_title: str = "step") -> go.Figure:
    """Across GPUs, per step: max, p99 and mean GPU load (band from mean to max), downsampled by max."""
    traces = []
    if loads_TG.shape[0]:
        per_step = np.stack([loads_TG.max(axis=1), np.percentile(loads_TG, 99.0, axis=1), loads_TG.mean(axis=1)], 1)
        binned, first = downsample_max(per_step, MAX_COLUMNS)
        x = axis_at(step_T, first)
        traces = [
            dict(type="scatter", x=x, y=f32(binned[:, 2]), name="mean", mode="lines", line=dict(color="#2ca02c")),
            dict(type="scatter", x=x, y=f32(binned[:, 0]), name="max (busiest GPU)", mode="lines", fill="tonexty",
                 line=dict(color="#d62728"), fillcolor="rgba(214,39,40,0.15)"),
            dict(type="scatter", x=x, y=f32(binned[:, 1]), name="p99", mode="lines",
                 line=dict(color="#ff7f0e", dash="dot")),
        ]
    return figure(traces, "GPU load over time (across GPUs)", x_title, f"load ({unit})", **change_markers(marks))


def gpu_time_heatmap(step_T: np.ndarray, loads_TG: np.ndarray, unit: str, marks: Marks = (),
                     x_title: str = "step") -> go.Figure:
    """GPU x time heatmap of per-GPU load (<= MAX_COLUMNS time bins, mean per step in each bin, ints)."""
    traces = []
    if loads_TG.shape[0]:
        binned, first = downsample_sum(loads_TG.astype(np.float64), MAX_COLUMNS)
        width = np.diff(np.append(first, loads_TG.shape[0]))[:, None]
        traces = [dict(type="heatmap", z=small_ints((binned / width).T), x=axis_at(step_T, first),
                       y=np.arange(loads_TG.shape[1], dtype=np.int32), colorscale="Viridis",
                       colorbar=dict(title=dict(text=unit)))]
    return figure(traces, f"Per-GPU load over time ({unit}, bin mean)", x_title, "GPU",
                  yaxis=integer_axis(loads_TG.shape[1]), **change_markers(marks))


def layer_eta_heatmap(step_T: np.ndarray, eta_TL: np.ndarray, marks: Marks = (), x_title: str = "step") -> go.Figure:
    """Layer x time heatmap of per-step balancedness eta in percent (the worst step within each time bin)."""
    traces = []
    if eta_TL.shape[0]:
        worst, first = downsample_max(np.nan_to_num(1.0 - eta_TL, nan=0.0), MAX_COLUMNS)
        traces = [dict(type="heatmap", z=small_ints(100.0 * (1.0 - worst).T),
                       x=axis_at(step_T, first), y=np.arange(eta_TL.shape[1], dtype=np.int32),
                       zmin=0, zmax=100, colorscale="RdYlGn", colorbar=dict(title=dict(text="eta %")))]
    return figure(traces, "Per-layer balancedness over time (eta %, bin min)", x_title, "layer",
                  yaxis=integer_axis(eta_TL.shape[1]), **change_markers(marks))


def step_vs_window_figure(svw: StepVsWindow) -> go.Figure:
    """Per layer: window-sum imbalance beside the mean and p99 of per-step imbalance (max/mean)."""
    layers = np.arange(svw.window_sum_L.size, dtype=np.int32)
    traces = [dict(type="scatter", x=layers, y=f32(values), name=name, mode="markers", marker=dict(size=8))
              for name, values in (("window sum", svw.window_sum_L), ("per step, mean", svw.per_step_mean_L),
                                   ("per step, p99", svw.per_step_p99_L))]  # layers are not a continuum: no lines
    return figure(traces, "Imbalance (max/mean): per step vs window sum", "layer", "imbalance",
                  xaxis=integer_axis(layers.size))


def eta_over_time(step_T: np.ndarray, eta_TL: np.ndarray, marks: Marks = (), x_title: str = "step") -> go.Figure:
    """Per step: p50 and min of eta across layers (downsampled by the worst value in each bin)."""
    traces = []
    if eta_TL.shape[0]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # steps where every layer is idle stay NaN
            lows = np.stack([np.nanmin(eta_TL, axis=1), np.nanmedian(eta_TL, axis=1)], 1)
        worst, first = downsample_max(np.nan_to_num(1.0 - lows, nan=0.0), MAX_COLUMNS)
        x = axis_at(step_T, first)
        traces = [dict(type="scatter", x=x, y=f32(1.0 - worst[:, 1]), name="p50 across layers", mode="lines"),
                  dict(type="scatter", x=x, y=f32(1.0 - worst[:, 0]), name="min across layers", mode="lines")]
    return figure(traces, "Balancedness over time (across layers)", x_title, "eta = mean/max",
                  yaxis=dict(range=[0, 1.02]), **change_markers(marks))
