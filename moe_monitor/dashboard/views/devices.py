"""Devices: per-GPU load over time, per-layer balancedness over time, per-step vs window-sum imbalance; active
experts per GPU and each layer's regime (memory- vs compute-bound) under the cost model."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from moe_monitor.dashboard.analytics import levels
from moe_monitor.dashboard.analytics.balance import step_vs_window
from moe_monitor.dashboard.analytics.timecost import layer_regimes, regime_line, regime_rows
from moe_monitor.dashboard.figures import load as load_figures
from moe_monitor.dashboard.figures.units import format_number
from moe_monitor.dashboard.live.snapshot import Snapshot
from moe_monitor.dashboard.views import steptails, timeline
from moe_monitor.dashboard.views.badges import coloured
from moe_monitor.dashboard.views.common import PageData, opening_tick, poll_and_caption
from moe_monitor.dashboard.views.draw import draw
from moe_monitor.dashboard.views.session import REFRESH_S


def page() -> None:
    st.title("Devices")
    live()


@st.fragment(run_every=REFRESH_S)
def live() -> None:
    current = poll_and_caption()
    if current is not None:
        render(current, whole=not opening_tick("devices"))
    timeline.keep_playing()


def render(current: PageData, whole: bool = True) -> None:
    """whole=False: the first chart only (dashboard.views.common.opening_tick)."""
    snap = current.snapshot
    unit, marks, x_T, x_title = snap.unit, snap.axis_marks(), snap.x_T, snap.x_title
    draw(load_figures.load_bands(x_T, snap.loads_TG, unit, marks, x_title), "devices_bands")
    if not whole:
        return
    draw(load_figures.gpu_time_heatmap(x_T, snap.loads_TG, unit, marks, x_title, snap.layout.gpus_per_node),
         "devices_gpu_time")
    draw(load_figures.eta_over_time(x_T, snap.eta_TL, marks, x_title), "devices_eta_time")
    draw(load_figures.layer_eta_heatmap(x_T, snap.eta_TL, marks, x_title), "devices_layer_eta")
    svw = step_vs_window(snap.view.loads_TLG)
    finite = svw.per_step_TL[np.isfinite(svw.per_step_TL)]
    worst = float(finite.max()) if finite.size else float("nan")
    row = snap.row_name
    window_sum, p99 = float(_nanmedian(svw.window_sum_L)), float(_nanmedian(svw.per_step_p99_L))
    st.markdown(f"**Per-{row} vs window-sum imbalance.** Window sum (median layer): {_judged(window_sum)} · per "
                f"{row}, p99 (median layer): {_judged(p99)} · worst single {row} and layer: {_judged(worst)}. "
                "A window sum averages the tail away: the layer waits on each step's busiest GPU. Colours: "
                f"imbalance (max/mean) {levels.IMBALANCE.says()}."
                + ("" if not snap.resolution_s else " A bucket is a sum itself: the per-step tail is on the "
                   "Overview (from the buckets' per-step histograms)."))
    draw(load_figures.step_vs_window_figure(svw), "devices_step_vs_window")
    steptails.devices_section(current)
    regimes_section(snap)


def regimes_section(snap: Snapshot) -> None:
    """Active experts per GPU and each layer's regime, predicted for the run's GPU profile (or why not)."""
    st.markdown("**Active experts per GPU and each layer's regime** (memory- vs compute-bound)")
    if snap.time is None:
        st.caption(f"Not shown: {snap.time_note or 'no time model'} (the cost model needs both).")
        return
    reg = layer_regimes(snap.time.rows, snap.time.model.ridge_tokens)
    st.markdown(regime_line(reg))
    st.dataframe(pd.DataFrame(regime_rows(reg)), hide_index=True)
    st.caption(f"predicted for {snap.time.model.label()}; per layer, means over the window's {snap.row_name}s.")


def _judged(imbalance: float) -> str:
    """An imbalance (max/mean) as markdown coloured by its level."""
    return coloured(format_number(imbalance), levels.IMBALANCE.level(imbalance))


def _nanmedian(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return np.median(finite) if finite.size else float("nan")
