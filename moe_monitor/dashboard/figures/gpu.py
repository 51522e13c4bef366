"""Vega-Lite chart of the GPU panel: one device's NVML readings beside the expert load of its EP GPU, as
panels stacked over one time axis (seconds before the latest reading).

GPU utilisation from NVML is time-based (share of time a kernel was running), not SM occupancy.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from moe_monitor.dashboard.figures.common import (
    BLUE,
    GREY,
    HEAT_COLUMNS,
    RED,
    SEGMENT,
    Chart,
    chart,
    dots_layer,
    f32,
    legend_colour,
    marks_data,
    marks_layers,
    named,
)
from moe_monitor.dashboard.figures.gaps import with_gaps
from moe_monitor.dashboard.figures.units import GIB
from moe_monitor.dashboard.live.gpu_history import GpuGrid

PANELS = (  # (title, [(field, scale, series name, dashed)])
    ("expert load (tokens/step)", []),
    ("GPU utilisation % (time-based: a kernel was running)", [("gpu_utilization_percent", 1.0, "util %", False)]),
    ("memory GiB (used / total)", [("memory_used_bytes", GIB, "used", False), ("memory_total_bytes", GIB, "total", True)]),
    ("power W (usage / limit)", [("power_usage_w", 1.0, "power", False), ("power_limit_w", 1.0, "limit", True)]),
    ("SM clock MHz", [("sm_clock_mhz", 1.0, "SM clock", False)]),
    ("temperature C", [("temperature_c", 1.0, "temperature", False)]),
)
PANEL_PX = 170
X_TITLE = "seconds before the latest reading"


def _series(rows: list[dict], name: str, scale: float = 1.0) -> np.ndarray:
    return f32([np.nan if r.get(name) is None else r[name] / scale for r in rows])


def nvml_charts(rows: list[dict], load_time_s_T: np.ndarray, load_T: np.ndarray, title: str,
                marks: Sequence[tuple[float, str]] = (), load_step_T: np.ndarray | None = None) -> list[Chart]:
    """Panels over wall time (seconds before the latest reading), one chart each, on one time span: the EP GPU's
    expert load (titled `title`), then, when NVML readings exist, utilisation (time-based), memory used/total,
    power vs limit, SM clock and temperature (dashed: the limit or total). Values NVML could not read are gaps
    (NaN), and so are holes (figures.gaps: in the readings' times; in the load's step ids load_step_T when
    given, since steps of uneven length leave no hole). marks: (unix time, label) of each layout change in view, a dashed rule on every panel. Datasets of
    each: "load" (t, load) or "nvml" (t and one column per series), "span" (the first and last time of both,
    drawn unseen so the panels share their time axis), "marks" (x: seconds before the latest reading)."""
    panels = PANELS if rows else PANELS[:1]
    t = np.asarray([r["time_s"] for r in rows], dtype=np.float64)
    load_time_s_T = np.asarray(load_time_s_T, dtype=np.float64)
    times = np.concatenate([t, load_time_s_T])
    now = float(times.max()) if times.size else 0.0
    load = pd.DataFrame({"t": f32(load_time_s_T - now), "load": f32(load_T)})
    if load_step_T is not None:
        load = with_gaps(load.assign(step=np.asarray(load_step_T)), ["load"], x="step").drop(columns="step")
    else:
        load = with_gaps(load, ["load"], x="t")
    nvml_series = {label: _series(rows, field, scale) for _, fields in PANELS[1:] for field, scale, label, _ in fields}
    nvml = with_gaps(pd.DataFrame({"t": f32(t - now), **nvml_series}), list(nvml_series), x="t")
    span = pd.DataFrame({"t": f32([times.min() - now, 0.0] if times.size else [])})
    marked = marks_data([(time_s - now, label) for time_s, label in marks])
    charts = []
    for i, (panel_title, fields) in enumerate(panels):
        x = {"field": "t", "type": "quantitative", "title": X_TITLE if i == len(panels) - 1 else None,
             "scale": {"nice": False}}
        source, names = ("load", ["load"]) if not fields else ("nvml", [label for _, _, label, _ in fields])
        dashed = [label for _, _, label, dash in fields if dash]
        unit = panel_title if i else "tokens/step"
        lines = {"data": named(source), "transform": [{"fold": names, "as": ["series", "value"]}],
                 "encoding": {"x": x, "y": {"field": "value", "type": "quantitative", "title": None},
                              "color": {"field": "series", "type": "nominal", "legend": None,
                                        "scale": {"domain": names, "range": [GREY if n in dashed else BLUE
                                                                             for n in names]}},
                              "tooltip": [{"field": "t", "title": "s before the latest", "format": ".1f"},
                                          {"field": "series", "title": "what"},
                                          {"field": "value", "title": unit, "format": ",.1f"}]},
                 "layer": [{"mark": {"type": "line", "strokeWidth": 1.5},
                            "encoding": {"detail": SEGMENT,
                                         "strokeDash": {"field": "series", "type": "nominal", "legend": None,
                                                        "scale": {"domain": names,
                                                                  "range": [[4, 3] if n in dashed else [1, 0]
                                                                            for n in names]}}}},
                           dots_layer()]}
        unseen = {"data": named("span"), "mark": {"type": "rule", "opacity": 0}, "encoding": {"x": x}}
        charts.append(chart([lines, unseen, *marks_layers(x)], title if i == 0 else panel_title,
                            PANEL_PX + 90 if i == 0 else PANEL_PX, **{source: load if i == 0 else nvml},
                            span=span, marks=marked))
    return charts


# The all-GPU view: per NVML field a GPU x time heatmap, and the latest readings against each GPU's expert load.
HEAT_PANELS = (  # (field, title, unit, scale, tooltip format)
    ("sm_clock_mhz", "SM clock", "MHz", 1.0, ",.0f"),
    ("power_usage_w", "power", "W", 1.0, ",.0f"),
    ("temperature_c", "temperature", "C", 1.0, ".0f"),
    ("gpu_utilization_percent", "utilisation (time-based)", "%", 1.0, ".0f"),
    ("memory_used_bytes", "memory used", "GiB", GIB, ",.1f"),
)
NVML_HEAT_CELLS = 15_000  # rects of one NVML heatmap at most (five are drawn): 256 GPUs get 58 time bins
ROW_PX, MIN_ROWS_PX, MAX_ROWS_PX = 20, 72, 520  # a heatmap row's height while its rows fit in MAX_ROWS_PX
CHROME_PX = 120  # title, time axis and its title: Streamlit fits the whole chart, not its plot, into the height
NAMED = "the GPU the Overview names"


def grid_bins(rows: int) -> int:
    """Time bins of the all-GPU heatmaps for `rows` rows: at most HEAT_COLUMNS, rows x bins <= NVML_HEAT_CELLS."""
    return max(1, min(HEAT_COLUMNS, NVML_HEAT_CELLS // max(rows, 1)))


def _where(grid: GpuGrid) -> list[str]:
    return ["no NVML device paired" if d is None else f"{d[0]} #{d[1]}" for d in grid.device_R]


def nvml_heatmaps(grid: GpuGrid, marked_row: int | None) -> list[Chart]:
    """One GPU x time heatmap per HEAT_PANELS field (rows: grid.names_R; columns: the grid's time bins, seconds
    before the newest reading; colour: the bin mean, no rect where no reading). marked_row: the row outlined
    in red (the GPU the Overview names; None: none). The spec depends on the rows' names only: they ride in it
    as params "rowNames" and "rowDevices", indexed by row in the browser, so a cell is four numbers. Datasets:
    "cells" (x, x2, row, value; bins without a reading left out), "marked" (row)."""
    rows = len(grid.names_R)
    newest = grid.newest_s if grid.edges_s.size else 0.0
    edges = f32(grid.edges_s - newest)
    bins = max(edges.size - 1, 0)
    marked = pd.DataFrame({"row": np.asarray([] if marked_row is None else [marked_row], dtype=np.uint16)})
    x = {"field": "x", "type": "quantitative", "title": X_TITLE, "scale": {"nice": False}}
    y = {"field": "row", "type": "ordinal", "title": None, "scale": {"domain": list(range(rows))},
         "axis": {"labelExpr": "rowNames[datum.value]", "labelOverlap": True,
                  **({"labelFontSize": 9} if rows > 64 else {})}}
    params = [{"name": "rowNames", "value": list(grid.names_R)}, {"name": "rowDevices", "value": _where(grid)}]
    plot_px = max(MIN_ROWS_PX, min(rows * ROW_PX, MAX_ROWS_PX))
    row_C = np.repeat(np.arange(rows, dtype=np.uint16), bins)
    bin_C = np.tile(np.arange(bins), rows)
    charts = []
    for field, title, unit, scale, fmt in HEAT_PANELS:
        value_C = (grid.mean_MRB[grid.field(field)] / scale).ravel()
        read = np.isfinite(value_C)
        cells = pd.DataFrame({"x": edges[:-1][bin_C[read]] if bins else f32([]),
                              "x2": edges[1:][bin_C[read]] if bins else f32([]),
                              "row": row_C[read], "value": f32(value_C[read])})
        rect = {"data": named("cells"),
                "transform": [{"calculate": "rowNames[datum.row]", "as": "name"},
                              {"calculate": "rowDevices[datum.row]", "as": "where"}],
                "mark": {"type": "rect"},
                "encoding": {"x": x, "x2": {"field": "x2"}, "y": y,
                             "color": {"field": "value", "type": "quantitative", "scale": {"scheme": "viridis"},
                                       "legend": {"title": unit, "gradientLength": plot_px - 20}},
                             "tooltip": [{"field": "name", "title": "row"}, {"field": "where", "title": "NVML device"},
                                         {"field": "x", "title": "from (s before the newest reading)",
                                          "format": ".1f"},
                                         {"field": "x2", "title": "to", "format": ".1f"},
                                         {"field": "value", "title": f"{title} ({unit}, bin mean)",
                                          "type": "quantitative", "format": fmt}]}}
        outline = {"data": named("marked"), "transform": [{"calculate": "rowNames[datum.row]", "as": "name"}],
                   "mark": {"type": "rect", "filled": False, "stroke": RED, "strokeWidth": 2},
                   "encoding": {"y": y, "x": {"value": 0}, "x2": {"value": "width"},
                                "tooltip": [{"field": "name", "title": NAMED}]}}
        spec = chart([rect, outline], f"{title} ({unit}, bin mean)", plot_px + CHROME_PX, cells=cells, marked=marked)
        charts.append(Chart({**spec.spec, "params": params}, spec.data))
    return charts


def latest_against_load(grid: GpuGrid, load_G: np.ndarray, marked_gpu: int | None, unit: str) -> Chart:
    """Each EP GPU's latest SM clock against its expert load (load_G [G], e.g. the window mean), marked_gpu in
    red and labelled: a GPU with low clocks and high load sits bottom right. Rows without a reading are left
    out. Dataset "main": name, where, load, sm_clock, power, temperature, util, memory, series."""
    table = latest_table(grid, load_G, marked_gpu)
    data = pd.DataFrame({"name": table["GPU"].astype(object), "where": table["NVML device"].astype(object),
                         "load": f32(table[LOAD]), "sm_clock": f32(table["SM clock MHz"]),
                         "power": f32(table["power W"]), "temperature": f32(table["temperature C"]),
                         "util": f32(table["utilisation %"]), "memory": f32(table["memory used GiB"]),
                         "series": np.where(table["named"], NAMED, "other GPUs").astype(object)})
    data = data[np.isfinite(data["sm_clock"].to_numpy()) & np.isfinite(data["load"].to_numpy())]
    x = {"field": "load", "type": "quantitative", "title": f"expert load ({unit})", "scale": {"zero": False}}
    y = {"field": "sm_clock", "type": "quantitative", "title": "latest SM clock (MHz)", "scale": {"zero": False}}
    tip = [{"field": "name", "title": "EP GPU"}, {"field": "where", "title": "NVML device"},
           {"field": "load", "title": f"expert load ({unit})", "format": ",.1f"},
           *({"field": f, "title": t, "format": fmt} for f, t, fmt in (
               ("sm_clock", "SM clock MHz", ",.0f"), ("power", "power W", ",.0f"), ("temperature", "temperature C",
                                                                                   ".0f"),
               ("util", "utilisation % (time-based)", ".0f"), ("memory", "memory used GiB", ",.1f")))]
    points = {"data": named("main"), "mark": {"type": "point", "filled": True, "size": 70, "opacity": 0.8},
              "encoding": {"x": x, "y": y, "color": {"field": "series", "type": "nominal",
                                                     **legend_colour(["other GPUs", NAMED], [BLUE, RED],
                                                                   legend={"orient": "bottom", "title": None, "labelLimit": 400})},
                           "tooltip": tip}}
    label = {"data": named("main"), "transform": [{"filter": f"datum.series == '{NAMED}'"}],
             "mark": {"type": "text", "align": "left", "dx": 7, "color": RED, "fontWeight": "bold"},
             "encoding": {"x": x, "y": y, "text": {"field": "name"}}}
    return chart([points, label], "Latest SM clock against expert load, per EP GPU", 300, main=data)


LOAD = "expert load"
READINGS = (  # (field, table column, scale)
    ("sm_clock_mhz", "SM clock MHz", 1.0), ("power_usage_w", "power W", 1.0), ("temperature_c", "temperature C", 1.0),
    ("gpu_utilization_percent", "utilisation %", 1.0), ("memory_used_bytes", "memory used GiB", GIB))


def latest_table(grid: GpuGrid, load_G: np.ndarray | None, marked_gpu: int | None) -> pd.DataFrame:
    """One row per row of the grid: "named" (the GPU the Overview names), "GPU", "NVML device", LOAD (its EP
    GPU's expert load from load_G [G]; NaN for a device paired with none; no such column when load_G is None),
    its newest NVML reading (READINGS) and "reading age s" (before the newest reading of any device). The
    named GPU first, then by expert load, highest first."""
    gpu_R = grid.gpu_R
    table = pd.DataFrame({"named": gpu_R == (-2 if marked_gpu is None else marked_gpu), "GPU": grid.names_R,
                          "NVML device": _where(grid)})
    load_R = np.full(gpu_R.size, np.nan)
    if load_G is not None:
        load_G = np.asarray(load_G, dtype=np.float64)
        on = (gpu_R >= 0) & (gpu_R < load_G.size)
        load_R[on] = load_G[gpu_R[on]]
        table[LOAD] = load_R
    for field, column, scale in READINGS:
        table[column] = grid.latest_MR[grid.field(field)] / scale
    table["reading age s"] = grid.newest_s - grid.latest_s_R if grid.edges_s.size else np.nan
    order = np.lexsort((-np.nan_to_num(load_R, nan=-np.inf), ~table["named"].to_numpy()))
    return table.iloc[order].reset_index(drop=True)
