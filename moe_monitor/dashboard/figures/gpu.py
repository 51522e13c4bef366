"""Vega-Lite chart of the GPU panel: one device's NVML readings beside the expert load of its EP GPU, as
panels stacked over one time axis (seconds before the latest reading).

GPU utilisation from NVML is time-based (share of time a kernel was running), not SM occupancy.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from moe_monitor.dashboard.figures.common import BLUE, GREY, Chart, chart, f32, marks_data, marks_layers, named
from moe_monitor.dashboard.figures.units import GIB

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
                marks: Sequence[tuple[float, str]] = ()) -> list[Chart]:
    """Panels over wall time (seconds before the latest reading), one chart each, on one time span: the EP GPU's
    expert load (titled `title`), then, when NVML readings exist, utilisation (time-based), memory used/total,
    power vs limit, SM clock and temperature (dashed: the limit or total). Values NVML could not read are gaps
    (NaN). marks: (unix time, label) of each layout change in view, a dashed rule on every panel. Datasets of
    each: "load" (t, load) or "nvml" (t and one column per series), "span" (the first and last time of both,
    drawn unseen so the panels share their time axis), "marks" (x: seconds before the latest reading)."""
    panels = PANELS if rows else PANELS[:1]
    t = np.asarray([r["time_s"] for r in rows], dtype=np.float64)
    load_time_s_T = np.asarray(load_time_s_T, dtype=np.float64)
    times = np.concatenate([t, load_time_s_T])
    now = float(times.max()) if times.size else 0.0
    load = pd.DataFrame({"t": f32(load_time_s_T - now), "load": f32(load_T)})
    nvml = pd.DataFrame({"t": f32(t - now), **{label: _series(rows, field, scale) for _, fields in PANELS[1:]
                                               for field, scale, label, _ in fields}})
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
                 "mark": {"type": "line", "strokeWidth": 1.5},
                 "encoding": {"x": x, "y": {"field": "value", "type": "quantitative", "title": None},
                              "color": {"field": "series", "type": "nominal", "legend": None,
                                        "scale": {"domain": names, "range": [GREY if n in dashed else BLUE
                                                                             for n in names]}},
                              "strokeDash": {"field": "series", "type": "nominal", "legend": None,
                                             "scale": {"domain": names, "range": [[4, 3] if n in dashed else [1, 0]
                                                                                  for n in names]}},
                              "tooltip": [{"field": "t", "title": "s before the latest", "format": ".1f"},
                                          {"field": "series", "title": "what"},
                                          {"field": "value", "title": unit, "format": ",.1f"}]}}
        unseen = {"data": named("span"), "mark": {"type": "rule", "opacity": 0}, "encoding": {"x": x}}
        charts.append(chart([lines, unseen, *marks_layers(x)], title if i == 0 else panel_title,
                            PANEL_PX + 90 if i == 0 else PANEL_PX, **{source: load if i == 0 else nvml},
                            span=span, marks=marked))
    return charts
