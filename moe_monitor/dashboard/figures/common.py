"""What every figure builder shares: the house layout, float32 payloads and the column budget.

Payloads stay small: numpy arrays (sent base64 by plotly), float32 for floats, the smallest unsigned int
for counts, time downsampled to MAX_COLUMNS, and an empty template (Streamlit's theme styles the chart in
the browser). Figures are built from one dict (validated once by go.Figure), which is several times
cheaper than add_trace/update_layout calls.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

MAX_COLUMNS = 1000
HEIGHT_PX = 320
MARK_COLOUR = "#7f7f7f"


def figure(traces: list[dict], title: str, x_title: str, y_title: str, height: int = HEIGHT_PX,
           **layout) -> go.Figure:
    """A figure from trace dicts (each with "type") and the house layout."""
    base = dict(template={}, title=dict(text=title), height=height, margin=dict(l=50, r=20, t=40, b=40),
                legend=dict(orientation="h", y=-0.2), xaxis=dict(title=dict(text=x_title)),
                yaxis=dict(title=dict(text=y_title)))
    for name, value in layout.items():
        base[name] = {**base[name], **value} if isinstance(base.get(name), dict) and isinstance(value, dict) else value
    return go.Figure(dict(data=traces, layout=base))


def change_markers(marks: Sequence[tuple[float | str, str]]) -> dict[str, list[dict]]:
    """Layout shapes and annotations for layout changes on a time axis: a dashed vertical line at each x
    (a step, or seconds on the GPU panel) across the whole plot, its label ("engine rebalanced", "layout
    applied") at the top; x may be a date string on a time axis (rollup buckets). {"shapes": [...],
    "annotations": [...]}, both empty without marks."""
    shapes = [dict(type="line", xref="x", yref="paper", x0=x, x1=x, y0=0, y1=1,
                   line=dict(color=MARK_COLOUR, width=1.5, dash="dash")) for x, _ in marks]
    notes = [dict(x=x, y=1, xref="x", yref="paper", text=label, showarrow=False, xanchor="left", yanchor="top",
                  font=dict(size=10, color=MARK_COLOUR)) for x, label in marks]
    return {"shapes": shapes, "annotations": notes}


def axis_at(x_T, index) -> np.ndarray:
    """The time axis at the given indices: step ids as int64, or datetime64 (rollup bucket starts) unchanged."""
    x = np.asarray(x_T)[index]
    return x if x.dtype.kind == "M" else x.astype(np.int64)


def f32(values) -> np.ndarray:
    """values as a float32 array (half the bytes of float64 in the page payload)."""
    return np.asarray(values, dtype=np.float32)
