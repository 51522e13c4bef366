"""Experts: layer x expert heatmap, expert x time heatmap of one layer, hot and dead experts, drift."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from moe_monitor.dashboard.analytics.experts import dead_experts, hot_experts, js_divergence
from moe_monitor.dashboard.figures import experts as expert_figures
from moe_monitor.dashboard.views import timeline
from moe_monitor.dashboard.views.common import PageData, poll_and_caption
from moe_monitor.dashboard.views.session import REFRESH_S
from moe_monitor.dashboard.views.staleness import staleness_section


def page() -> None:
    st.title("Experts")
    c1, c2 = st.columns(2)
    c1.number_input("layer for the expert x time heatmap", min_value=0, value=0, step=1, key="experts_layer")
    c2.number_input("top-N hot experts", min_value=1, max_value=200, value=10, step=1, key="experts_top_n")
    live()


@st.fragment(run_every=REFRESH_S)
def live() -> None:
    current = poll_and_caption()
    if current is not None:
        render(current, int(st.session_state.get("experts_layer", 0)), int(st.session_state.get("experts_top_n", 10)))
    timeline.keep_playing()


def render(current: PageData, layer: int, top_n: int) -> None:
    snap, window = current.snapshot, current.watched.window
    counts_LE = snap.view.counts_sum_LE
    layer = min(max(layer, 0), window.num_layers - 1)
    st.plotly_chart(expert_figures.layer_expert_heatmap(counts_LE), key="experts_layer_expert")
    counts_TE = window.layer_counts(snap.view.slots_T, layer)
    st.plotly_chart(expert_figures.expert_time_heatmap(snap.x_T, counts_TE, layer, snap.axis_marks(), snap.x_title),
                    key="experts_time")
    left, right = st.columns(2)
    with left:
        st.subheader(f"Top {top_n} hot experts")
        rows = hot_experts(counts_LE, top_n)
        table = pd.DataFrame(rows, columns=["layer", "expert", "tokens", "share", "x_mean"])
        st.dataframe(table.style.format({"share": "{:.1%}", "x_mean": "{:.2f}x"}), hide_index=True)
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
        st.plotly_chart(expert_figures.drift_bars(js_divergence(older, newer)), key="experts_drift")
    # a placement-staleness curve plans layouts (about a second at DeepSeek-V3 size): asked for, not on every tick
    if st.toggle("Placement staleness", key="experts_staleness", value=False,
                 help="How fast the layout in force and layouts planned on this window degrade on later steps "
                      "(computed once per window, every 30 s while live)"):
        staleness_section(current)
