"""What every figure builder shares: the dashboard's Vega-Lite house conventions.

A live page redraws every second. A Vega-Lite chart keeps its view and swaps the rows of its named datasets in
place while its spec stays the same. So a builder returns a Chart: a spec that depends on the page's state only (titles,
units, the choices made; never the data) and its datasets (pandas, float32 where it helps). Layout changes are
rows of the "marks" dataset (a dashed rule and its label), not spec. The renderer is fixed (canvas, aria off):
Streamlit's frontend otherwise picks one by row count and re-creates the view when a dataset crosses 2,000 rows.
Heatmaps stay under HEAT_CELLS rects: time binned into <= HEAT_COLUMNS columns (the title says how).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from moe_monitor.dashboard.analytics.series import small_ints

MAX_COLUMNS = 1000  # time columns of a line chart
HEAT_COLUMNS = 120  # time columns of a heatmap
HEAT_CELLS = 30_000  # rects of a heatmap at most
HEIGHT_PX = 320
MARK_COLOUR = "#7f7f7f"
RED, BLUE, GREEN, ORANGE, GREY, PURPLE, DARK = ("#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#7f7f7f", "#9467bd",
                                               "#444444")
Marks = Sequence[tuple[float | str, str]]  # (x: a step, seconds, or a date string on a time axis; label)


@dataclass(frozen=True)
class Chart:
    """A Vega-Lite chart: spec (its layers read named datasets) and data (name -> DataFrame, every name the
    spec reads, empty frames included, so the set of datasets never changes between ticks)."""

    spec: dict
    data: dict[str, pd.DataFrame] = field(default_factory=dict)

    def spec_with_data(self) -> dict:
        """The spec with its datasets, as st.vega_lite_chart takes it."""
        return {**self.spec, "datasets": dict(self.data)}

    def payload_bytes(self) -> int:
        """Bytes sent to the browser per tick: the spec's JSON and each dataset as Arrow IPC (as Streamlit does)."""
        import json

        total = len(json.dumps(self.spec))
        for frame in self.data.values():
            table = pa.Table.from_pandas(frame, preserve_index=False)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            total += sink.getvalue().size
        return total


def chart(layers: list[dict], title: str, height: int = HEIGHT_PX, **data: pd.DataFrame) -> Chart:
    """A Chart of layers with the house title, height and renderer; data: its datasets."""
    spec = {"title": {"text": title, "anchor": "start"}, "layer": layers, "height": height,
            "usermeta": {"embedOptions": {"renderer": "canvas"}},
            "config": {"mark": {"aria": False}, "axisY": {"titleLimit": height - 90}}}
    return Chart(spec, data)


def named(name: str) -> dict:
    return {"name": name}


def time_x(x_title: str, temporal: bool, field: str = "x") -> dict:
    """The time axis: step ids (whole numbers), or rollup bucket starts in UTC."""
    if temporal:
        return {"field": field, "type": "temporal", "title": x_title, "scale": {"type": "utc"}}
    return {"field": field, "type": "quantitative", "title": x_title, "axis": {"format": "d"},
            "scale": {"zero": False, "nice": False}}


def time_tooltip(x_title: str, temporal: bool, field: str = "x", title: str = "") -> dict:
    return ({"field": field, "type": "temporal", "title": title or x_title, "format": "%Y-%m-%d %H:%M:%S",
             "formatType": "utc"} if temporal else {"field": field, "type": "quantitative", "title": title or x_title,
                                                     "format": "d"})


def is_temporal(x_T) -> bool:
    return np.asarray(x_T).dtype.kind == "M"


def axis_at(x_T, index) -> np.ndarray:
    """The time axis at the given indices: step ids as int64, or datetime64[ms] (rollup bucket starts)."""
    x = np.asarray(x_T)[index]
    return x.astype("datetime64[ms]") if x.dtype.kind == "M" else x.astype(np.int64)


def marks_data(marks: Marks, temporal: bool = False) -> pd.DataFrame:
    """The "marks" dataset: x (a step or seconds as float64; a datetime on a time axis) and label."""
    xs = [x for x, _ in marks]
    x = pd.to_datetime(pd.Series(xs, dtype="object")).astype("datetime64[ms]") if temporal \
        else pd.Series(xs, dtype=np.float64)
    return pd.DataFrame({"x": x, "label": pd.Series([label for _, label in marks], dtype="object")})


def marks_layers(x: dict, labels: bool = True) -> list[dict]:
    """A dashed vertical rule at each row of the "marks" dataset and (labels) its label at the top; x: the
    chart's time encoding (its field is the dataset's "x")."""
    x = {**x, "field": "x"}
    rule = {"data": named("marks"), "mark": {"type": "rule", "color": MARK_COLOUR, "strokeDash": [5, 4],
                                             "strokeWidth": 1.5},
            "encoding": {"x": x, "tooltip": [{"field": "label", "title": "layout change"}]}}
    text = {"data": named("marks"), "mark": {"type": "text", "color": MARK_COLOUR, "align": "left", "baseline": "top",
                                             "dx": 3, "dy": 2, "fontSize": 10},
            "encoding": {"x": x, "y": {"value": 0}, "text": {"field": "label"}}}
    return [rule, text] if labels else [rule]


def legend_colour(domain: Sequence[str], colours: Sequence[str], title: str | None = None, **extra) -> dict:
    """A colour scale fixed in the spec (the legend does not depend on which series have data)."""
    return {"scale": {"domain": list(domain), "range": list(colours)}, "legend": {"orient": "right", "title": title},
            **extra}


SEGMENT = {"field": "segment", "type": "nominal"}  # a line's parts between gaps (figures.gaps), drawn apart
DOT_PX = 20  # area of the point drawn at a lone or sparse row


def folded_lines(names: Sequence[str], colours: Sequence[str], x: dict, y: dict, dashed: Sequence[str] = (),
                 data: str = "main") -> dict:
    """One line per column `names` of dataset `data` (folded to series, value), colours and dashes fixed; a line
    is broken between the dataset's segments and its "dot" rows are drawn as points (figures.gaps.with_gaps)."""
    colour = legend_colour(names, colours)
    colour["legend"]["symbolType"] = "stroke"  # a line's legend, whatever the points beside it
    return {"data": named(data), "transform": [{"fold": list(names), "as": ["series", "value"]}],
            "encoding": {"x": x, "y": {"field": "value", "type": "quantitative", **y},
                         "color": {"field": "series", "type": "nominal", **colour}},
            "layer": [{"mark": {"type": "line", "strokeWidth": 1.5},
                       "encoding": {"detail": SEGMENT,
                                    "strokeDash": {"field": "series", "type": "nominal", "legend": None,
                                                   "scale": {"domain": list(names),
                                                             "range": [[4, 3] if n in dashed else [1, 0]
                                                                       for n in names]}}}},
                      dots_layer()]}


def dots_layer(**mark) -> dict:
    """The points of a line layer's "dot" rows (its data and encoding inherited from the enclosing layer)."""
    return {"transform": [{"filter": "datum.dot"}],
            "mark": {"type": "point", "filled": True, "size": DOT_PX, "opacity": 1, **mark}}


def hover_rule(x: dict, tooltip: list[dict], data: str = "main", param: str = "hover") -> dict:
    """A vertical rule at the time column nearest the pointer, its tooltip every series at that column."""
    return {"data": named(data), "mark": {"type": "rule", "color": GREY},
            "params": [{"name": param, "select": {"type": "point", "fields": [x["field"]], "nearest": True,
                                                  "on": "pointerover", "clear": "pointerout"}}],
            "encoding": {"x": x, "opacity": {"condition": {"param": param, "empty": False, "value": 0.5}, "value": 0},
                         "tooltip": tooltip}}


def heat_columns(rows: int) -> int:
    """Time columns of a heatmap of `rows` rows: at most HEAT_COLUMNS, and rows x columns <= HEAT_CELLS."""
    return max(1, min(HEAT_COLUMNS, HEAT_CELLS // max(rows, 1)))


def bins_data(x_T, first: np.ndarray, num_steps: int) -> pd.DataFrame:
    """The "bins" dataset of a heatmap: bin (its index), x and x2 (where its rect starts and ends: the next
    bin's first step, after the last bin its last step + 1, or + one bucket on a time axis), last (its last
    step or bucket) and steps (how many it holds)."""
    x_T = np.asarray(x_T)
    ends = np.append(first[1:], num_steps).astype(np.int64)
    start, last = axis_at(x_T, first), axis_at(x_T, ends - 1)
    if last.size:
        step = (np.diff(axis_at(x_T, np.arange(x_T.size))).min() if x_T.size > 1 else
                (np.timedelta64(1, "s") if last.dtype.kind == "M" else 1))
        x2 = np.append(start[1:], last[-1] + step)
    else:
        x2 = start.copy()
    return pd.DataFrame({"bin": np.arange(first.size, dtype=np.uint16), "x": start, "x2": x2, "last": last,
                         "steps": (ends - first).astype(np.uint32)})


def heat_cells(values_BR: np.ndarray, row: str, value: str, dtype=np.float32) -> pd.DataFrame:
    """The "cells" dataset of a heatmap from values [B bins, R rows]: bin, row index (named `row`), value as
    dtype (an unsigned dtype: the smallest that holds the values, as analytics.series.small_ints)."""
    bins, rows = values_BR.shape
    values = np.asarray(values_BR, dtype=dtype) if np.dtype(dtype).kind != "u" else small_ints(values_BR)
    return pd.DataFrame({"bin": np.repeat(np.arange(bins, dtype=np.uint16), rows),
                         row: np.tile(np.arange(rows, dtype=np.uint8 if rows <= 256 else np.uint16), bins),
                         value: values.ravel()})


def heat_layer(x_title: str, temporal: bool, row: dict, colour: dict, tooltip: list[dict]) -> dict:
    """The rect layer of a time heatmap: cells looked up in bins for their x extent."""
    return {"data": named("cells"),
            "transform": [{"lookup": "bin", "from": {"data": named("bins"), "key": "bin",
                                                     "fields": ["x", "x2", "last", "steps"]}}],
            "mark": {"type": "rect"},
            "encoding": {"x": time_x(x_title, temporal), "x2": {"field": "x2"}, "y": row, "color": colour,
                         "tooltip": [*tooltip, time_tooltip(x_title, temporal, "x", f"from {x_title}"),
                                     time_tooltip(x_title, temporal, "last", f"to {x_title}"),
                                     {"field": "steps", "title": "rows in the bin", "type": "quantitative"}]}}


def whole_axis(field: str, title: str, count: int = 0) -> dict:
    """An ordinal axis of layers, GPUs, ranks or experts: whole numbers, labels thinned when crowded."""
    axis: dict = {"labelAngle": 0, "labelOverlap": True}
    if count > 64:
        axis["labelFontSize"] = 9
    return {"field": field, "type": "ordinal", "title": title, "axis": axis}


def f32(values) -> np.ndarray:
    """values as a float32 array (half the bytes of float64 in the page payload)."""
    return np.asarray(values, dtype=np.float32)
