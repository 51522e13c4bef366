"""The staleness figure of the Experts and What-if pages (thin: dashboard.whatif.staleness computes it), cached
so a page tick pays for it at most once per window change: for a recording range or a paused run the window
is the same until it moves; a live run's window changes every tick, so it is recomputed at most every
LIVE_REFRESH_S seconds."""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import streamlit as st

from moe_monitor.dashboard.figures import staleness as staleness_figures
from moe_monitor.dashboard.views.common import PageData
from moe_monitor.dashboard.views.draw import draw
from moe_monitor.dashboard.whatif.cache import cached
from moe_monitor.dashboard.whatif.staleness import MAX_STEPS, staleness_in_view

LIVE_REFRESH_S = 30.0
_CACHE = "staleness_cache"


def window_key(current: PageData) -> tuple:
    """What identifies the window in view: its source, layout and phase, and its first and newest steps for a
    window that only changes when it is moved (a recording range, a paused run), else the LIVE_REFRESH_S
    period of a live run."""
    cfg, layout = current.settings, current.layout
    assert layout is not None
    span = moving_span(current) or (int(time.monotonic() // LIVE_REFRESH_S),)
    return (cfg.monitor_key(), current.phase, layout.gpus, hash(layout.layout_LP.tobytes()), *span)


def moving_span(current: PageData) -> tuple:
    """() for a live run being watched (its window changes every tick); else (first step, newest step, steps) of
    the window in view: a recording range or a paused run, which change only when moved."""
    held = st.session_state.get("watched_run")
    snap = current.snapshot
    if snap is None or held is not None and held[1] is current.watched:
        return ()
    return int(snap.view.step_T[0]), int(snap.view.step_T[-1]), snap.view.num_steps


def staleness_section(current: PageData) -> None:
    """The staleness curve of the window in view."""
    layout, snap, window = current.layout, current.snapshot, current.watched.window
    if layout is None or snap is None or window is None:
        return
    view = snap.view
    if view.num_steps < 2:
        st.caption("Placement staleness needs at least 2 steps in the window.")
        return
    start = layout.since_step if layout.since_step is not None else int(view.step_T[0])
    fitted_at = int(np.searchsorted(view.step_T, start, side="left"))
    store: dict[tuple, Any] = st.session_state.setdefault(_CACHE, {})
    try:
        curves = cached(store, window_key(current), lambda: staleness_in_view(
            window.counts_CLE[view.slots_T[-MAX_STEPS:]], view.phase_T[-MAX_STEPS:], layout.layout_LP, layout.gpus,
            fitted_at - max(0, view.num_steps - MAX_STEPS)), max_entries=4)
    except ValueError as exc:
        st.caption(f"No staleness curve for this window: {exc}")
        return
    draw(staleness_figures.staleness_curves(curves), "staleness_fig")
    st.caption(f"Placement staleness on the newest {min(view.num_steps, MAX_STEPS)} steps of the window, per phase: "
               "the layout in force from the step it took force (else the window's first step), and layouts "
               "planned (EPLB, same R) on the window's older steps, scored on every later step of their phase. "
               "A rising curve means the placement goes stale; computed once per window"
               f" (every {LIVE_REFRESH_S:.0f} s while live).")
