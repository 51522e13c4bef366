"""Vega-Lite charts of the Time page: where each MoE layer's time goes (dispatch, expert compute, combine, the
whole layer) per rank and over steps, the all-to-all share and achieved overlap per layer, each rank's straggler
wait, and the step's MoE time against its max GPU load with a least-squares line.

Times are shown in milliseconds. The charts over steps take marks: (step, label) of each layout change in view.

Shape legend: T steps, R ranks, L MoE layers.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from moe_monitor.dashboard.analytics.series import downsample_max
from moe_monitor.dashboard.analytics.timing import AllToAllShare, LineFit
from moe_monitor.dashboard.figures.common import (
    DARK,
    DOT_PX,
    MAX_COLUMNS,
    PURPLE,
    RED,
    SEGMENT,
    Chart,
    Marks,
    axis_at,
    chart,
    dots_layer,
    f32,
    hover_rule,
    legend_colour,
    marks_data,
    marks_layers,
    named,
    time_tooltip,
    time_x,
    whole_axis,
)
from moe_monitor.dashboard.figures.gaps import with_gaps

PHASE_COLOURS = {"dispatch": "#1f77b4", "compute": "#2ca02c", "combine": "#ff7f0e", "layer": DARK}
PHASES = ("dispatch", "compute", "combine")
MS = 1e3


def _ms_tip(names, suffix: str = " (ms)") -> list[dict]:
    return [{"field": n, "title": n + suffix, "type": "quantitative", "format": ".3f"} for n in names]


def rank_breakdown(dispatch_R: np.ndarray, compute_R: np.ndarray, combine_R: np.ndarray, layer_R: np.ndarray,
                   what: str) -> Chart:
    """Per rank: dispatch, compute and combine stacked (mean seconds per step, float [R]) and the layer's wall
    time as a tick; what: "layer 3" or "mean over layers". Dataset "main": rank and one column each, in ms."""
    ranks = np.arange(np.asarray(layer_R).size, dtype=np.uint16)
    data = pd.DataFrame({"rank": ranks, **{n: f32(np.asarray(v) * MS) for n, v in
                                           zip((*PHASES, "layer"), (dispatch_R, compute_R, combine_R, layer_R))}})
    x, tip = whole_axis("rank", "rank", ranks.size), [{"field": "rank", "title": "rank"}, *_ms_tip((*PHASES, "layer"))]
    legend = legend_colour([*PHASES, "layer (wall)"], [*(PHASE_COLOURS[p] for p in PHASES), DARK])
    layers = [{"data": named("main"), "transform": [{"fold": list(PHASES), "as": ["phase", "ms"]}],
               "mark": {"type": "bar"},
               "encoding": {"x": x, "y": {"field": "ms", "type": "quantitative", "stack": True, "title": "ms"},
                            "color": {"field": "phase", "type": "nominal", **legend},
                            "order": {"field": "phase", "sort": "descending"}, "tooltip": tip}},
              {"data": named("main"), "mark": {"type": "tick", "thickness": 3},
               "encoding": {"x": x, "y": {"field": "layer", "type": "quantitative"},
                            "color": {"datum": "layer (wall)"}, "tooltip": tip}}]
    return chart(layers, f"Where the layer's time goes, per rank ({what}; mean per step)", main=data)


def phases_over_steps(step_T: np.ndarray, dispatch_T: np.ndarray, compute_T: np.ndarray, combine_T: np.ndarray,
                      layer_T: np.ndarray, what: str, marks: Marks = ()) -> Chart:
    """Per step (float [T] seconds each): dispatch, compute and combine (mean over ranks) stacked as areas and
    the layer's wall time (slowest rank) as a line; binned by max to MAX_COLUMNS columns. Dataset "main": x, one
    column each in ms, segment and dot (figures.gaps: areas and line break at holes, lone steps are points)."""
    stacked = np.stack([dispatch_T, compute_T, combine_T, layer_T], axis=1).astype(np.float64) * MS
    binned, first = downsample_max(stacked, MAX_COLUMNS)
    names = [*PHASES, "layer"]
    data = with_gaps(pd.DataFrame({"x": axis_at(step_T, first), **{n: f32(binned[:, i]) for i, n in enumerate(names)}}),
                     names)
    x = time_x("step", False)
    legend = legend_colour([*PHASES, "layer (wall, slowest rank)"], [*(PHASE_COLOURS[p] for p in PHASES), DARK])
    # stacked by hand: Vega-Lite's own stack fills every x of every segment with zeros, joining the holes again
    stacked_phases = [{"fold": list(PHASES), "as": ["phase", "ms"]},
                      {"stack": "ms", "groupby": ["x"], "sort": [{"field": "phase", "order": "descending"}],
                       "as": ["ms_from", "ms_to"]}]
    colour = {"field": "phase", "type": "nominal", **legend}
    y = {"field": "ms_to", "type": "quantitative", "title": "ms"}
    layers = [{"data": named("main"), "transform": stacked_phases, "mark": {"type": "area", "opacity": 0.8},
               "encoding": {"x": x, "y": y, "y2": {"field": "ms_from"}, "color": colour, "detail": SEGMENT}},
              {"data": named("main"), "transform": [{"filter": "datum.dot"}, *stacked_phases],
               "mark": {"type": "point", "filled": True, "size": DOT_PX, "opacity": 1},  # lone steps: a point each
               "encoding": {"x": x, "y": y, "color": colour}},
              {"data": named("main"), "encoding": {"x": x, "y": {"field": "layer", "type": "quantitative"},
                                                   "color": {"datum": "layer (wall, slowest rank)"}},
               "layer": [{"mark": {"type": "line", "strokeWidth": 2}, "encoding": {"detail": SEGMENT}},
                         dots_layer()]},
              hover_rule(x, [time_tooltip("step", False), *_ms_tip((*PHASES, "layer"))]),
              *marks_layers(x)]
    return chart(layers, f"Layer time over steps ({what}, bin max)", main=data, marks=marks_data(marks))


def share_by_layer(share: AllToAllShare, overlap_L: np.ndarray) -> Chart:
    """Per layer: dispatch and combine share of layer time (stacked bars) and the achieved overlap (points)."""
    data = pd.DataFrame({"layer": np.arange(share.total_L.size, dtype=np.uint16),
                         "dispatch / layer": f32(share.dispatch_L), "combine / layer": f32(share.combine_L),
                         "achieved overlap": f32(overlap_L)})
    x = whole_axis("layer", "layer", data.shape[0])
    tip = [{"field": "layer", "title": "layer"},
           *({"field": n, "title": n, "type": "quantitative", "format": ".1%"} for n in data.columns[1:])]
    names = ["dispatch / layer", "combine / layer", "achieved overlap"]
    legend = legend_colour(names, [PHASE_COLOURS["dispatch"], PHASE_COLOURS["combine"], PURPLE])
    layers = [{"data": named("main"), "transform": [{"fold": names[:2], "as": ["what", "ratio"]}],
               "mark": {"type": "bar"},
               "encoding": {"x": x, "y": {"field": "ratio", "type": "quantitative", "stack": True, "title": "ratio",
                                          "scale": {"domain": [0, 1]}},
                            "color": {"field": "what", "type": "nominal", **legend}, "tooltip": tip}},
              {"data": named("main"), "mark": {"type": "point", "shape": "diamond", "filled": True, "size": 80},
               "encoding": {"x": x, "y": {"field": "achieved overlap", "type": "quantitative"},
                            "color": {"datum": "achieved overlap"}, "tooltip": tip}}]
    return chart(layers, "All-to-all share of layer time and achieved overlap, per layer", main=data)


def wait_bars(wait_R: np.ndarray) -> Chart:
    """Per rank: straggler wait (float [R] seconds per step, summed over layers), in ms."""
    data = pd.DataFrame({"rank": np.arange(np.asarray(wait_R).size, dtype=np.uint16),
                         "wait": f32(np.asarray(wait_R) * MS)})
    layers = [{"data": named("main"), "mark": {"type": "bar", "color": RED},
               "encoding": {"x": whole_axis("rank", "rank", data.shape[0]),
                            "y": {"field": "wait", "type": "quantitative", "title": "ms per step"},
                            "tooltip": [{"field": "rank", "title": "rank"},
                                        {"field": "wait", "title": "wait (ms per step)", "format": ".3f"}]}}]
    return chart(layers, "Straggler wait per rank: layer time minus own compute (summed over layers, per step)",
                 main=data)


def time_vs_load(load_T: np.ndarray, moe_s_T: np.ndarray, fit: LineFit, step_T: np.ndarray) -> Chart:
    """Points of the step's MoE time (float [T] seconds) against its max GPU load (float [T] tokens), and the
    least-squares line. Datasets: "steps" (step, load, ms), "fit" (load, ms: the line's two ends, or none); the
    fit's R² is the page's to say (it changes every tick)."""
    ok = np.isfinite(load_T) & np.isfinite(moe_s_T)
    x, y = np.asarray(load_T, dtype=np.float64)[ok], np.asarray(moe_s_T, dtype=np.float64)[ok] * MS
    steps = pd.DataFrame({"step": np.asarray(step_T, dtype=np.int64)[ok], "load": f32(x), "ms": f32(y)})
    line_x = np.array([x.min(), x.max()]) if np.isfinite(fit.slope) and x.size else np.zeros(0)
    line = pd.DataFrame({"load": f32(line_x), "ms": f32((fit.slope * line_x + fit.intercept) * MS)})
    x_enc = {"field": "load", "type": "quantitative", "scale": {"zero": False},
             "title": "max GPU load (tokens, sum over layers of the busiest GPU)"}
    y_enc = {"field": "ms", "type": "quantitative", "scale": {"zero": False},
             "title": "MoE time (ms, slowest rank, sum over layers)"}
    legend = legend_colour(["steps", "least squares"], ["#1f77b4", RED])
    layers = [{"data": named("steps"), "transform": [{"calculate": "'steps'", "as": "series"}],
               "mark": {"type": "circle", "size": 36, "opacity": 0.7},
               "encoding": {"x": x_enc, "y": y_enc, "color": {"field": "series", "type": "nominal", **legend},
                            "tooltip": [{"field": "step", "title": "step", "format": "d"},
                                        {"field": "load", "title": "max GPU load (tokens)", "format": ",.0f"},
                                        {"field": "ms", "title": "MoE time (ms)", "format": ".3f"}]}},
              {"data": named("fit"), "transform": [{"calculate": "'least squares'", "as": "series"}],
               "mark": {"type": "line", "strokeWidth": 2},
               "encoding": {"x": x_enc, "y": y_enc, "color": {"field": "series", "type": "nominal"}}}]
    return chart(layers, "MoE time per step against max GPU load", steps=steps, fit=line)
