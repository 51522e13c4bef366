"""Vega-Lite builders for the What-if page (figures.common.Chart): per-GPU bars of the current and the what-if
layout (clickable: a point selection GPU_PARAM on field "gpu"), the picked GPU's experts (clickable: EXPERT_PARAM on
field "expert"), the replica-budget curve with its knee and the move-budget curve (imbalance vs moves from the
current layout, counted by planner.repair.experts_copied).

A click comes back as the selection's field values (dashboard.whatif.edits.clicked_gpu / clicked_expert read it),
never as an axis label. Datasets: "bars" (gpu, layout, load, picked), "experts" (expert, label, replicas, load,
picked), "budget" (R and its figures), "knee", "moves", "chosen". Shape legend (README, Conventions): G GPUs.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from moe_monitor.dashboard.figures.common import (
    BLUE,
    DARK,
    GREEN,
    HEIGHT_PX,
    ORANGE,
    RED,
    Chart,
    chart,
    f32,
    legend_colour,
    named,
    whole_axis,
)
from moe_monitor.dashboard.figures.units import byte_unit
from moe_monitor.dashboard.whatif.edits import EXPERT_PARAM, GPU_PARAM

BEFORE, AFTER, PICKED = "#9aa5b1", BLUE, RED
CURRENT, WHATIF = "current layout", "what-if layout"


def _click(name: str, field: str) -> list[dict]:
    """A point selection of one field, set by a click (shift-click adds, as Vega-Lite does by default)."""
    return [{"name": name, "select": {"type": "point", "fields": [field], "on": "click"}}]


def bars_data(before_G, after_G, selected_gpu: int | None) -> pd.DataFrame:
    """The "bars" dataset: one row per GPU and layout (current first; the what-if's when after_G is given)."""
    loads = [(CURRENT, f32(before_G))] + ([] if after_G is None else [(WHATIF, f32(after_G))])
    gpus = np.arange(loads[0][1].size, dtype=np.uint16)
    frames = [pd.DataFrame({"gpu": gpus, "layout": name, "load": values,
                            "picked": (gpus == selected_gpu) & (name == WHATIF or after_G is None)})
              for name, values in loads]
    return pd.concat(frames, ignore_index=True)


def before_after_bars(before_G, after_G, selected_gpu: int | None, title: str, unit: str) -> Chart:
    """Grouped bars per GPU: load under the current layout (grey) and, once planned (after_G not None), the what-if
    layout (blue); the selected GPU red; a dashed rule at each layout's mean. Click a bar to select its GPU."""
    shown = [CURRENT] if after_G is None else [CURRENT, WHATIF]
    colours = [BEFORE, AFTER][:len(shown)]
    data = bars_data(before_G, after_G, selected_gpu)
    x = whole_axis("gpu", "GPU (click a bar to list its experts)", len(f32(before_G)))
    y = {"field": "load", "type": "quantitative", "title": f"load ({unit})"}
    colour = {"field": "layout", "type": "nominal", **legend_colour(shown, colours)}
    bars = named("bars")
    layers = [
        {"data": bars, "mark": {"type": "bar", "cursor": "pointer"}, "params": _click(GPU_PARAM, "gpu"),
         "encoding": {"x": x, "xOffset": {"field": "layout", "sort": shown}, "y": y,
                      "color": {**colour, "condition": {"test": "datum.picked", "value": PICKED}},
                      "tooltip": [{"field": "gpu", "title": "GPU"}, {"field": "layout", "title": "layout"},
                                  {"field": "load", "type": "quantitative", "title": unit, "format": ",.1f"}]}},
        {"data": bars, "transform": [{"aggregate": [{"op": "mean", "field": "load", "as": "mean"}],
                                      "groupby": ["layout"]}],
         "mark": {"type": "rule", "strokeDash": [5, 4], "strokeWidth": 1},
         "encoding": {"y": {"field": "mean", "type": "quantitative"}, "color": colour,
                      "tooltip": [{"field": "layout", "title": "mean of"},
                                  {"field": "mean", "type": "quantitative", "title": unit, "format": ",.1f"}]}},
    ]
    return chart(layers, title, bars=data)


def experts_data(rows: list[dict], selected_expert: int | None) -> pd.DataFrame:
    """The "experts" dataset from dashboard.whatif.edits.gpu_experts rows (heaviest first)."""
    experts = np.asarray([r["expert"] for r in rows], dtype=np.int32)
    return pd.DataFrame({
        "expert": experts, "replicas": np.asarray([r["replicas"] for r in rows], dtype=np.int32),
        "label": [f"e{r['expert']}" + (f" (x{r['replicas']})" if r["replicas"] > 1 else "") for r in rows],
        "load": f32([r["load"] for r in rows]), "picked": experts == selected_expert})


def gpu_expert_bars(rows: list[dict], gpu: int, selected_expert: int | None, unit: str) -> Chart:
    """One bar per slot of the GPU (rows from dashboard.whatif.edits.gpu_experts): its share of the expert's load;
    click one to select the expert for an edit."""
    layer = {"data": named("experts"), "mark": {"type": "bar", "cursor": "pointer"},
             "params": _click(EXPERT_PARAM, "expert"),
             "encoding": {"x": {"field": "label", "type": "nominal", "sort": None, "title": "expert (xN = N replicas)",
                                "axis": {"labelAngle": 0, "labelOverlap": True}},
                          "y": {"field": "load", "type": "quantitative", "title": f"load on this GPU ({unit})"},
                          "color": {"condition": {"test": "datum.picked", "value": PICKED}, "value": AFTER},
                          "tooltip": [{"field": "expert", "title": "expert"},
                                      {"field": "replicas", "title": "replicas"},
                                      {"field": "load", "type": "quantitative", "title": unit, "format": ",.1f"}]}}
    return chart([layer], f"GPU {gpu}: its experts (click one to edit it)", height=HEIGHT_PX - 40,
                 experts=experts_data(rows, selected_expert))


BUDGET_LINES = ("imbalance (mean over layers)", "worst layer", "lower bound")


def budget_curve(rows: list[dict], knee: int, chosen_r: int | None) -> Chart:
    """Imbalance (max/mean, mean over layers) vs redundant slots R with the lower bound (left axis, drawn on top),
    extra memory per GPU as bars (right axis, unit scaled to the largest value), the knee starred, the chosen R a
    dotted rule."""
    extra = np.asarray([row["extra_bytes_per_gpu"] for row in rows], dtype=np.float64)
    scale, unit = byte_unit(extra.max(initial=0))
    data = pd.DataFrame({"R": np.asarray([row["redundant"] for row in rows], dtype=np.int32),
                         "extra": f32(extra / scale),
                         BUDGET_LINES[0]: f32([row["mean_imbalance"] for row in rows]),
                         BUDGET_LINES[1]: f32([row["worst_imbalance"] for row in rows]),
                         BUDGET_LINES[2]: f32([row["mean_lower_bound"] for row in rows])})
    x = {"field": "R", "type": "ordinal", "title": "redundant slots R", "axis": {"labelAngle": 0}}
    y_left = {"type": "quantitative", "title": "imbalance (max/mean GPU load)", "scale": {"zero": False},
              "axis": {"orient": "left"}}
    budget = named("budget")
    memory = {"data": budget, "mark": {"type": "bar", "opacity": 0.5, "color": "#9ecae1"},
              "encoding": {"x": x, "y": {"field": "extra", "type": "quantitative", "axis": {"orient": "right"},
                                         "title": f"extra memory per GPU ({unit})"},
                           "tooltip": [{"field": "R"}, {"field": "extra", "type": "quantitative", "format": ".2f",
                                                        "title": f"+{unit} per GPU"}]}}
    lines = {"data": budget, "transform": [{"fold": list(BUDGET_LINES), "as": ["series", "value"]}],
             "mark": {"type": "line", "point": True},
             "encoding": {"x": x, "y": {"field": "value", **y_left},
                          "color": {"field": "series", "type": "nominal",
                                    **legend_colour(BUDGET_LINES, (AFTER, ORANGE, GREEN))},
                          "strokeDash": {"field": "series", "type": "nominal", "legend": None,
                                         "scale": {"domain": list(BUDGET_LINES), "range": [[1, 0], [2, 2], [5, 4]]}},
                          "tooltip": [{"field": "R"}, {"field": "series"},
                                      {"field": "value", "type": "quantitative", "format": ".3f"}]}}
    knee_data = pd.DataFrame({"R": np.asarray([rows[knee]["redundant"]], dtype=np.int32),
                              "value": f32([rows[knee]["mean_imbalance"]]), "label": ["knee"]})
    star = {"data": named("knee"), "mark": {"type": "point", "shape": "diamond", "filled": True, "size": 180,
                                             "color": PICKED},
            "encoding": {"x": x, "y": {"field": "value", **y_left}}}
    label = {"data": named("knee"), "mark": {"type": "text", "dy": -14, "color": PICKED},
             "encoding": {"x": x, "y": {"field": "value", **y_left}, "text": {"field": "label"}}}
    layers: list[dict] = [memory, {"layer": [lines, star, label]}]
    if chosen_r is not None and chosen_r in set(data["R"].tolist()):
        layers.append({"data": {"values": [{"R": int(chosen_r)}]}, "mark": {"type": "rule", "strokeDash": [2, 2],
                                                                            "color": DARK},
                       "encoding": {"x": x}})
    spec = chart(layers, "Replica budget: imbalance vs redundant slots R", budget=data, knee=knee_data)
    return Chart({**spec.spec, "resolve": {"scale": {"y": "independent"}}}, spec.data)


MOVES_LINES = ("imbalance (mean over layers)", "worst layer")


def moves_curve(rows: Sequence[dict], chosen: dict) -> Chart:
    """Mean and worst-layer imbalance (max/mean GPU load) vs moves (expert copies onto GPUs) spent repairing the
    current layout (Repaired.curve rows from dashboard.whatif.repair), the chosen budget's point starred."""
    data = pd.DataFrame({"moves": np.asarray([r["moves"] for r in rows], dtype=np.int32),
                         MOVES_LINES[0]: f32([r["mean_imbalance"] for r in rows]),
                         MOVES_LINES[1]: f32([r["worst_imbalance"] for r in rows])})
    x = {"field": "moves", "type": "quantitative", "title": "moves (expert copies onto GPUs)", "axis": {"format": "d"}}
    y = {"type": "quantitative", "title": "imbalance (max/mean GPU load)", "scale": {"zero": False}}
    lines = {"data": named("moves"), "transform": [{"fold": list(MOVES_LINES), "as": ["series", "value"]}],
             "mark": {"type": "line", "interpolate": "step-after", "point": True},
             "encoding": {"x": x, "y": {"field": "value", **y},
                          "color": {"field": "series", "type": "nominal",
                                    **legend_colour(MOVES_LINES, (AFTER, ORANGE))},
                          "strokeDash": {"field": "series", "type": "nominal", "legend": None,
                                         "scale": {"domain": list(MOVES_LINES), "range": [[1, 0], [2, 2]]}},
                          "tooltip": [{"field": "moves", "title": "moves"}, {"field": "series"},
                                      {"field": "value", "type": "quantitative", "format": ".3f"}]}}
    chosen_data = pd.DataFrame({"moves": np.asarray([chosen["moves"]], dtype=np.int32),
                                "value": f32([chosen["mean_imbalance"]]), "label": ["chosen"]})
    star = {"data": named("chosen"), "mark": {"type": "point", "shape": "diamond", "filled": True, "size": 180,
                                               "color": PICKED},
            "encoding": {"x": x, "y": {"field": "value", **y}}}
    label = {"data": named("chosen"), "mark": {"type": "text", "dy": -14, "color": PICKED},
             "encoding": {"x": x, "y": {"field": "value", **y}, "text": {"field": "label"}}}
    return chart([lines, star, label], "Move budget: imbalance vs moves from the current layout", moves=data,
                 chosen=chosen_data)
