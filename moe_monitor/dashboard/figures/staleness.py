"""Plotly builder for the staleness curve (Experts and What-if pages): how a placement fitted at step t
degrades at t + delta, for the layout in force and for layouts planned on the window, one pair per phase.

Shape legend: D deltas (steps after the fit).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moe_monitor.dashboard.figures.common import f32, figure
from moe_monitor.dashboard.whatif.staleness import PhaseStaleness

_COLOURS = {"prefill": "#1f77b4", "decode": "#d62728", "mixed": "#2ca02c", "unknown": "#7f7f7f"}


def staleness_curves(curves: Sequence[PhaseStaleness]):
    """Per phase: mean imbalance (max/mean GPU load, mean over layers) at delta steps after the fit, the layout
    in force (solid) and layouts planned on the window (dotted, mean over the fits that reach delta)."""
    traces = []
    for item in curves:
        colour = _COLOURS.get(item.phase, "#9467bd")
        for curve, label, dash in ((item.in_force, "layout in force", "solid"),
                                   (item.planned, "planned on the window", "dot")):
            if curve is None:
                continue
            ok = np.isfinite(curve.mean_D)
            if not ok.any():
                continue
            traces.append(dict(type="scatter", mode="lines", x=curve.deltas_D[ok].astype(np.int32),
                               y=f32(curve.mean_D[ok]), name=f"{item.phase}: {label}",
                               line=dict(color=colour, dash=dash, width=1.5)))
    return figure(traces, "Placement staleness: imbalance at t + delta of a layout fitted at t",
                  "delta (steps after the fit)", "imbalance (max/mean, mean over layers)")
