"""Vega-Lite chart of the staleness curve (Experts and What-if pages): how a placement fitted at step t
degrades at t + delta, for the layout in force and for layouts planned on the window, one pair per phase.

Shape legend: D deltas (steps after the fit).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from moe_monitor.dashboard.figures.common import SEGMENT, Chart, chart, legend_colour, named
from moe_monitor.dashboard.figures.gaps import with_gaps
from moe_monitor.dashboard.whatif.staleness import PhaseStaleness

COLOURS = {"prefill": "#1f77b4", "decode": "#d62728", "mixed": "#2ca02c", "unknown": "#7f7f7f"}
KINDS = ("layout in force", "planned on the window")


def staleness_curves(curves: Sequence[PhaseStaleness]) -> Chart:
    """Per phase: mean imbalance (max/mean GPU load, mean over layers) at delta steps after the fit, the layout
    in force (solid) and layouts planned on the window (dotted, mean over the fits that reach delta). Dataset
    "main": phase, kind, delta, imbalance (finite points only), segment and dot (figures.gaps: a curve breaks
    where deltas have no value)."""
    parts = []
    for item in curves:
        for curve, kind in ((item.in_force, KINDS[0]), (item.planned, KINDS[1])):
            if curve is None:
                continue
            ok = np.isfinite(curve.mean_D)
            parts.append(pd.DataFrame({"phase": item.phase, "kind": kind,
                                       "delta": curve.deltas_D[ok].astype(np.int32),
                                       "imbalance": np.asarray(curve.mean_D[ok], dtype=np.float32)}))
    data = with_gaps(pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        {"phase": pd.Series(dtype=object), "kind": pd.Series(dtype=object), "delta": pd.Series(dtype=np.int32),
         "imbalance": pd.Series(dtype=np.float32)}), ["imbalance"], x="delta", by=["phase", "kind"])
    layers = [{"data": named("main"), "mark": {"type": "line", "strokeWidth": 1.5, "point": {"size": 16}},
               "encoding": {"x": {"field": "delta", "type": "quantitative", "title": "delta (steps after the fit)",
                                  "axis": {"format": "d"}},
                            "y": {"field": "imbalance", "type": "quantitative", "scale": {"zero": False},
                                  "title": "imbalance (max/mean, mean over layers)"},
                            "color": {"field": "phase", "type": "nominal",
                                      **legend_colour(list(COLOURS), list(COLOURS.values()), "phase")},
                            "strokeDash": {"field": "kind", "type": "nominal",
                                           **legend_colour(KINDS, [[1, 0], [2, 3]], None)},
                            "detail": [{"field": "kind"}, SEGMENT],
                            "tooltip": [{"field": "phase"}, {"field": "kind", "title": "layout"},
                                        {"field": "delta", "title": "steps after the fit"},
                                        {"field": "imbalance", "title": "max/mean", "format": ".3f"}]}}]
    return chart(layers, "Placement staleness: imbalance at t + delta of a layout fitted at t", main=data)
