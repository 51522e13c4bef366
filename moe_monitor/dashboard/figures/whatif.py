"""Plotly builders for the What-if page: before/after per-GPU bars (clickable: customdata = GPU), the
selected GPU's experts (clickable: customdata = expert), the replica-budget curve with its knee and the
move-budget curve (imbalance vs moves from the current layout, counted by planner.repair.experts_copied).

Bars are clickable in st.plotly_chart(on_select=...); every clickable bar carries its id in customdata so
the click parsing (dashboard.whatif.edits.clicked_gpu / clicked_expert) never depends on axis labels.
Shape legend (README, Conventions): G GPUs.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from moe_monitor.dashboard.figures.common import HEIGHT_PX, f32, figure
from moe_monitor.dashboard.figures.units import byte_unit

BEFORE, AFTER, PICKED = "#9aa5b1", "#1f77b4", "#d62728"


def before_after_bars(before_G, after_G, selected_gpu: int | None, title: str, unit: str) -> go.Figure:
    """Grouped bars per GPU: load under the current layout (grey) and the what-if layout (blue; the
    selected GPU red); dashed lines at each layout's mean. Click a bar to select its GPU."""
    before_G, after_G = f32(before_G), f32(after_G)
    gpus = np.arange(after_G.size, dtype=np.int32)
    colours = [PICKED if g == selected_gpu else AFTER for g in range(after_G.size)]
    hover = "GPU %{x}<br>%{y:,.1f} " + unit + "<extra>%{fullData.name}</extra>"
    ids = [[int(g)] for g in gpus]  # plain lists: a click returns them as they are
    traces = [dict(type="bar", x=gpus, y=before_G, name="current layout", customdata=ids,
                   marker=dict(color=BEFORE), hovertemplate=hover),
              dict(type="bar", x=gpus, y=after_G, name="what-if layout", customdata=ids,
                   marker=dict(color=colours), hovertemplate=hover)]
    shapes = [dict(type="line", xref="paper", x0=0, x1=1, y0=float(v.mean()), y1=float(v.mean()),
                   line=dict(color=c, dash="dash", width=1)) for v, c in ((before_G, BEFORE), (after_G, AFTER))]
    return figure(traces, title, "GPU (click a bar to list its experts)", f"load ({unit})", barmode="group",
                  shapes=shapes,
                  xaxis=dict(range=[-0.5, after_G.size - 0.5], dtick=1 if after_G.size <= 32 else None))


def gpu_expert_bars(rows: list[dict], gpu: int, selected_expert: int | None, unit: str) -> go.Figure:
    """One bar per slot of the GPU (rows from dashboard.whatif.edits.gpu_experts): its share of the expert's load;
    click one to select the expert for an edit."""
    experts = np.asarray([r["expert"] for r in rows], dtype=np.int32)
    labels = [f"e{r['expert']}" + (f" (x{r['replicas']})" if r["replicas"] > 1 else "") for r in rows]
    colours = [PICKED if e == selected_expert else AFTER for e in experts]
    trace = dict(type="bar", x=labels, y=f32([r["load"] for r in rows]), customdata=[[int(e)] for e in experts],
                 marker=dict(color=colours), name=f"GPU {gpu}",
                 hovertemplate="expert %{customdata[0]}<br>%{y:,.1f} " + unit + "<extra></extra>")
    return figure([trace], f"GPU {gpu}: its experts (click one to edit it)", "expert (xN = N replicas)",
                  f"load on this GPU ({unit})", height=HEIGHT_PX - 40,
                  showlegend=False)


def budget_curve(rows: list[dict], knee: int, chosen_r: int | None) -> go.Figure:
    """Imbalance (max/mean, mean over layers) vs redundant slots R with the lower bound (left axis, drawn
    on top), extra memory per GPU as bars (right axis, unit scaled to the largest value), the knee marked."""
    r = np.asarray([row["redundant"] for row in rows], dtype=np.int32)
    extra = np.asarray([row["extra_bytes_per_gpu"] for row in rows], dtype=np.float64)
    scale, unit = byte_unit(extra.max(initial=0))
    line = dict(type="scatter", yaxis="y2", mode="lines+markers")
    traces: list[dict] = [dict(type="bar", x=r, y=f32(extra / scale), name=f"extra memory per GPU ({unit})", opacity=0.5,
                   marker=dict(color="#9ecae1"), hovertemplate="R=%{x}: +%{y:.2f} " + unit + "/GPU<extra></extra>"),
              {**line, "x": r, "y": f32([row["mean_imbalance"] for row in rows]),
               "name": "imbalance (mean over layers)", "line": dict(color=AFTER)},
              {**line, "x": r, "y": f32([row["worst_imbalance"] for row in rows]), "name": "worst layer",
               "line": dict(color="#ff7f0e", dash="dot")},
              {**line, "x": r, "y": f32([row["mean_lower_bound"] for row in rows]), "mode": "lines",
               "name": "lower bound", "line": dict(color="#2ca02c", dash="dash")},
              {**line, "x": [int(r[knee])], "y": [float(rows[knee]["mean_imbalance"])], "mode": "markers+text",
               "name": "knee", "text": ["knee"], "textposition": "top center",
               "marker": dict(symbol="star", size=16, color=PICKED)}]
    shapes = [] if chosen_r is None else [dict(type="line", x0=chosen_r, x1=chosen_r, yref="paper", y0=0, y1=1,
                                               line=dict(color="#444", dash="dot", width=1))]
    return figure(traces, "Replica budget: imbalance vs redundant slots R", "redundant slots R",
                  f"extra memory per GPU ({unit})", shapes=shapes, yaxis=dict(side="right", showgrid=False),
                  yaxis2=dict(title=dict(text="imbalance (max/mean GPU load)"), overlaying="y", side="left"),
                  xaxis=dict(tickvals=r))


def moves_curve(rows: Sequence[dict], chosen: dict) -> go.Figure:
    """Mean and worst-layer imbalance (max/mean GPU load) vs moves (expert copies onto GPUs) spent repairing
    the current layout (Repaired.curve rows from dashboard.whatif.repair), the chosen budget's point starred."""
    moves = np.asarray([r["moves"] for r in rows], dtype=np.int32)
    line = dict(type="scatter", mode="lines+markers", x=moves)
    traces = [{**line, "y": f32([r["mean_imbalance"] for r in rows]), "name": "imbalance (mean over layers)",
               "line": dict(color=AFTER, shape="hv"), "hovertemplate": "%{x} moves: %{y:.3f}<extra></extra>"},
              {**line, "y": f32([r["worst_imbalance"] for r in rows]), "name": "worst layer",
               "line": dict(color="#ff7f0e", dash="dot", shape="hv")},
              dict(type="scatter", mode="markers+text", x=[int(chosen["moves"])],
                   y=[float(chosen["mean_imbalance"])], name="chosen budget", text=["chosen"],
                   textposition="top center", marker=dict(symbol="star", size=16, color=PICKED))]
    return figure(traces, "Move budget: imbalance vs moves from the current layout", "moves (expert copies onto GPUs)",
                  "imbalance (max/mean GPU load)")
