"""Plotly figure builders for the Time page: where each MoE layer's time goes (dispatch, expert compute,
combine, the whole layer) per rank and over steps, the all-to-all share and achieved overlap per layer, each
rank's straggler wait, and the step's MoE time against its max GPU load with a least-squares line.

Times are shown in milliseconds. The figures over steps take marks: (step, label) of each layout change in view.

Shape legend: T steps, R ranks, L MoE layers.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from moe_monitor.dashboard.analytics.series import downsample_max
from moe_monitor.dashboard.analytics.timing import AllToAllShare, LineFit
from moe_monitor.dashboard.figures.common import MAX_COLUMNS, change_markers, f32, figure

Marks = Sequence[tuple[float, str]]
PHASE_COLOURS = {"dispatch": "#1f77b4", "compute": "#2ca02c", "combine": "#ff7f0e", "layer": "#444444"}
MS = 1e3


def rank_breakdown(dispatch_R: np.ndarray, compute_R: np.ndarray, combine_R: np.ndarray, layer_R: np.ndarray,
                   what: str) -> go.Figure:
    """Per rank: dispatch, compute and combine stacked (mean seconds per step, float [R]) and the layer's wall
    time as a marker; what: "layer 3" or "mean over layers"."""
    ranks = np.arange(np.asarray(layer_R).size, dtype=np.int32)
    traces: list[dict] = [dict(type="bar", x=ranks, y=f32(np.asarray(values) * MS), name=name,
                               marker=dict(color=PHASE_COLOURS[name]))
                          for name, values in (("dispatch", dispatch_R), ("compute", compute_R), ("combine", combine_R))]
    traces.append(dict(type="scatter", x=ranks, y=f32(np.asarray(layer_R) * MS), name="layer (wall)",
                       mode="markers", marker=dict(symbol="line-ew-open", size=22, color=PHASE_COLOURS["layer"],
                                                   line=dict(width=3))))
    return figure(traces, f"Where the layer's time goes, per rank ({what}; mean per step)", "rank", "ms",
                  barmode="stack", xaxis=dict(dtick=1 if ranks.size <= 32 else None))


def phases_over_steps(step_T: np.ndarray, dispatch_T: np.ndarray, compute_T: np.ndarray, combine_T: np.ndarray,
                      layer_T: np.ndarray, what: str, marks: Marks = ()) -> go.Figure:
    """Per step (float [T] seconds each): dispatch, compute and combine (mean over ranks) stacked as areas and
    the layer's wall time (slowest rank) as a line; downsampled by max to MAX_COLUMNS columns."""
    stacked = np.stack([dispatch_T, compute_T, combine_T, layer_T], axis=1).astype(np.float64) * MS
    binned, first = downsample_max(stacked, MAX_COLUMNS)
    x = np.asarray(step_T)[first].astype(np.int64)
    traces: list[dict] = [dict(type="scatter", x=x, y=f32(binned[:, i]), name=name, mode="lines", stackgroup="phases",
                               line=dict(color=PHASE_COLOURS[name], width=0.5))
                          for i, name in enumerate(("dispatch", "compute", "combine"))]
    traces.append(dict(type="scatter", x=x, y=f32(binned[:, 3]), name="layer (wall, slowest rank)", mode="lines",
                       line=dict(color=PHASE_COLOURS["layer"], width=2)))
    return figure(traces, f"Layer time over steps ({what})", "step", "ms", **change_markers(marks))


def share_by_layer(share: AllToAllShare, overlap_L: np.ndarray) -> go.Figure:
    """Per layer: dispatch and combine share of layer time (stacked bars) and the achieved overlap (markers)."""
    layers = np.arange(share.total_L.size, dtype=np.int32)
    traces = [
        dict(type="bar", x=layers, y=f32(share.dispatch_L), name="dispatch / layer",
             marker=dict(color=PHASE_COLOURS["dispatch"])),
        dict(type="bar", x=layers, y=f32(share.combine_L), name="combine / layer",
             marker=dict(color=PHASE_COLOURS["combine"])),
        dict(type="scatter", x=layers, y=f32(overlap_L), name="achieved overlap", mode="markers",
             marker=dict(symbol="diamond", size=9, color="#9467bd")),
    ]
    return figure(traces, "All-to-all share of layer time and achieved overlap, per layer", "layer", "ratio",
                  barmode="stack", yaxis=dict(range=[0, 1.05]))


def wait_bars(wait_R: np.ndarray) -> go.Figure:
    """Per rank: straggler wait (float [R] seconds per step, summed over layers)."""
    ranks = np.arange(np.asarray(wait_R).size, dtype=np.int32)
    traces = [dict(type="bar", x=ranks, y=f32(np.asarray(wait_R) * MS), name="wait",
                   marker=dict(color="#d62728"))]
    return figure(traces, "Straggler wait per rank: layer time minus own compute (summed over layers, per step)",
                  "rank", "ms per step", xaxis=dict(dtick=1 if ranks.size <= 32 else None))


def time_vs_load(load_T: np.ndarray, moe_s_T: np.ndarray, fit: LineFit, step_T: np.ndarray) -> go.Figure:
    """Scatter of the step's MoE time (float [T] seconds) against its max GPU load (float [T] tokens), with the
    least-squares line and its R^2."""
    ok = np.isfinite(load_T) & np.isfinite(moe_s_T)
    x, y = np.asarray(load_T)[ok], np.asarray(moe_s_T)[ok] * MS
    traces: list[dict] = [dict(type="scatter", x=f32(x), y=f32(y), mode="markers", name="steps",
                               text=[f"step {int(s)}" for s in np.asarray(step_T)[ok]],
                               marker=dict(size=6, color="#1f77b4", opacity=0.7))]
    title = "MoE time per step against max GPU load"
    if np.isfinite(fit.slope):
        line_x = np.array([x.min(), x.max()], dtype=np.float64)
        traces.append(dict(type="scatter", x=f32(line_x), y=f32((fit.slope * line_x + fit.intercept) * MS),
                           mode="lines", name="least squares", line=dict(color="#d62728")))
        title += f" (R² = {fit.r2:.3f})" if np.isfinite(fit.r2) else ""
    return figure(traces, title, "max GPU load (tokens, sum over layers of the busiest GPU)",
                  "MoE time (ms, slowest rank, sum over layers)")
