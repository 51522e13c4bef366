"""The Overview's picture as a Vega-Lite chart: one bar per GPU of the series the answer talks about, the named
GPU in red, the all-GPU mean as a dotted rule, GPU and node in the tooltip.

Vega-Lite, not plotly: Streamlit keeps a keyed Vega-Lite chart mounted and swaps its data in place, where a
plotly chart whose figure changed is mounted afresh and can show a blank frame on every refresh. The spec
depends only on the title and unit, so a live page changes the data alone. Shape legend: G GPUs.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

RED, BLUE, GREEN = "#d62728", "#1f77b4", "#2ca02c"
HEIGHT_PX = 300


def answer_data(series_G: np.ndarray, marked_gpu: int | None, gpus_per_node: int) -> pd.DataFrame:
    """One row per GPU: gpu, node, value, marked (the GPU the answer names)."""
    values = np.asarray(series_G, dtype=np.float64)
    gpus = np.arange(values.size)
    return pd.DataFrame({"gpu": gpus, "node": gpus // max(gpus_per_node, 1), "value": values,
                         "marked": gpus == (-1 if marked_gpu is None else marked_gpu)})


def answer_spec(title: str, unit: str) -> dict:
    """The chart's Vega-Lite spec (data left out: answer_data gives it)."""
    x = {"field": "gpu", "type": "ordinal", "title": "GPU", "axis": {"labelOverlap": True, "labelAngle": 0}}
    y = {"field": "value", "type": "quantitative", "title": unit}
    return {
        "title": title,
        "height": HEIGHT_PX,
        "layer": [
            {"mark": {"type": "bar"},
             "encoding": {"x": x, "y": y,
                          "color": {"condition": {"test": "datum.marked", "value": RED}, "value": BLUE},
                          "tooltip": [{"field": "gpu", "title": "GPU"}, {"field": "node", "title": "node"},
                                      {"field": "value", "title": unit, "format": ".3~g"}]}},
            {"mark": {"type": "rule", "strokeDash": [4, 3], "color": GREEN},
             "encoding": {"y": {"aggregate": "mean", "field": "value", "type": "quantitative"}}},
        ],
    }
