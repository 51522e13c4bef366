"""Experts: layer x expert heatmap, expert x time heatmap of one layer (the worst by default), the experts of
one GPU (the straggler by default), hot experts with the GPUs and nodes that hold them, dead experts, drift."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from moe_monitor.dashboard.analytics.answer import hottest_on
from moe_monitor.dashboard.analytics.balance import worst_layer
from moe_monitor.dashboard.analytics.experts import dead_experts, gpus_holding, hot_experts, js_divergence
from moe_monitor.dashboard.figures import experts as expert_figures
from moe_monitor.dashboard.views import timeline
from moe_monitor.dashboard.views.common import PageData, asked_gpu, named_or_busiest, opening_tick, poll_and_caption
from moe_monitor.dashboard.views.draw import draw
from moe_monitor.dashboard.views.session import REFRESH_S
from moe_monitor.dashboard.views.staleness import staleness_section

# the tables' number formats, drawn by the browser (a pandas Styler costs the server a render of every cell per tick)
PERCENT = st.column_config.NumberColumn(format="percent")
TIMES_MEAN = st.column_config.NumberColumn(format="%.2fx")


def page() -> None:
    st.title("Experts")
    asked_gpu("experts_gpu")
    c1, c2, c3 = st.columns(3)
    c1.number_input("layer for the expert x time heatmap (-1: the worst layer)", min_value=-1, value=-1, step=1,
                    key="experts_layer")
    c2.number_input("top-N hot experts", min_value=1, max_value=200, value=10, step=1, key="experts_top_n")
    c3.number_input("experts of GPU (-1: the GPU the Overview names)", min_value=-1, value=-1, step=1,
                    key="experts_gpu")
    live()


@st.fragment(run_every=REFRESH_S)
def live() -> None:
    current = poll_and_caption()
    if current is not None:
        render(current, int(st.session_state.get("experts_layer", -1)), int(st.session_state.get("experts_top_n", 10)),
               int(st.session_state.get("experts_gpu", -1)), whole=not opening_tick("experts"))
    timeline.keep_playing()


def render(current: PageData, layer: int, top_n: int, gpu: int = -1, whole: bool = True) -> None:
    """layer -1: the layer with the lowest balancedness over the window; gpu -1: the GPU the Overview names;
    whole=False: the first chart only (dashboard.views.common.opening_tick)."""
    snap, window, layout = current.snapshot, current.watched.window, current.layout
    counts_LE = snap.view.counts_sum_LE
    asked = layer
    layer = worst_layer(snap.eta_TL) if layer < 0 else min(layer, window.num_layers - 1)
    gpu = named_or_busiest(snap) if gpu < 0 else min(gpu, layout.gpus - 1)
    draw(expert_figures.layer_expert_heatmap(counts_LE), "experts_layer_expert")
    if not whole:
        return
    counts_TE = window.layer_counts(snap.view.slots_T, layer)
    st.caption(f"Below: layer {layer}" + (" (the lowest balancedness over the window; pick another above)"
                                          if asked < 0 else ""))
    draw(expert_figures.expert_time_heatmap(snap.x_T, counts_TE, layer, snap.axis_marks(), snap.x_title),
         "experts_time")
    st.subheader(f"The experts of GPU {gpu} (node {layout.node_of(gpu)})")
    mine = hottest_on(counts_LE, layout.layout_LP, layout.gpus, gpu, top_n)
    st.dataframe(pd.DataFrame([{"layer": h.layer, "expert": h.expert, "share of the GPU's tokens": h.share}
                               for h in mine], columns=["layer", "expert", "share of the GPU's tokens"]),
                 hide_index=True, column_config={"share of the GPU's tokens": PERCENT})
    left, right = st.columns(2)
    with left:
        st.subheader(f"Top {top_n} hot experts")
        rows = hot_experts(counts_LE, top_n)
        for row in rows:
            held = gpus_holding(layout.layout_LP, layout.gpus, row["layer"], row["expert"])
            row["GPUs"] = ", ".join(map(str, held))
            row["nodes"] = ", ".join(map(str, sorted({layout.node_of(g) for g in held})))
        table = pd.DataFrame(rows, columns=["layer", "expert", "tokens", "share", "x_mean", "GPUs", "nodes"])
        table = table.rename(columns={"share": "share of the layer", "x_mean": "x the layer's mean expert"})
        st.dataframe(table, hide_index=True, column_config={"share of the layer": PERCENT,
                                                            "x the layer's mean expert": TIMES_MEAN})
    with right:
        dead_LE = dead_experts(counts_LE)
        st.subheader(f"Dead experts: {int(dead_LE.sum())}")
        st.caption("Experts with no token over the window, in layers that got tokens.")
        if dead_LE.any():
            dead_rows = [{"layer": int(l), "dead": int(dead_LE[l].sum()),
                          "experts": ", ".join(map(str, np.flatnonzero(dead_LE[l])[:32]))
                          + (" ..." if dead_LE[l].sum() > 32 else "")}
                         for l in np.flatnonzero(dead_LE.any(axis=1))]
            st.dataframe(pd.DataFrame(dead_rows), hide_index=True)
    if snap.view.num_steps >= 4:
        half = snap.view.num_steps // 2
        older = window.sum_counts(snap.view.slots_T[:half])
        newer = counts_LE - older
        draw(expert_figures.drift_bars(js_divergence(older, newer)), "experts_drift")
    # a placement-staleness curve plans layouts (about a second at DeepSeek-V3 size): asked for, not on every tick
    if st.toggle("Placement staleness", key="experts_staleness", value=False,
                 help="How fast the layout in force and layouts planned on this window degrade on later steps "
                      "(computed once per window, every 30 s while live)"):
        staleness_section(current)
