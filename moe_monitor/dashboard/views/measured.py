"""The GPU panel's "Measured vs estimated" section, shown when the run has physical records (an engine that
reports the tokens its balancer sent to each physical slot: SGLang's per_pass dumps through the bridge, the vLLM
plugin with EPLB, ExpertLoadMonitor.record_physical).

Per step in view: busiest GPU / mean under the even-split estimate from the step's logical counts and the layout
in force (the loads every other page shows) beside the same ratio of the measured loads (the ranks' physical
records summed per GPU), and their difference: what the engine's balancer won. Only steps whose every rank sent
its physical record are compared. The layer choice is the sidebar's (one layer, all layers summed, or by default
each layer's own ratio averaged over the layers that served tokens). Pure numbers: dashboard.analytics.measured.
"""
from __future__ import annotations

import numpy as np
import streamlit as st

from moe_monitor.dashboard.analytics.measured import MeasuredVsEstimated, compare
from moe_monitor.dashboard.figures.measured import measured_figure
from moe_monitor.dashboard.live.physical import MeasuredFeed
from moe_monitor.dashboard.sources.base import is_seekable
from moe_monitor.dashboard.views.common import PageData
from moe_monitor.dashboard.views.draw import draw

COVERAGE_NOTE = 0.99  # below this share of a step's tokens in its physical records, the page says so


def reader_for(current: PageData) -> MeasuredFeed | None:
    """The session's MeasuredFeed for the run on screen (a new one when the run or window changed); None
    for a trace, a recording's range, or a source without a Redis client."""
    source = current.watched.source
    client = getattr(source, "client", None)
    run = getattr(source, "run", None)
    if current.settings.source != "redis" or client is None or not run or is_seekable(source):
        return None
    key = (current.settings.monitor_key(), id(client))
    held = st.session_state.get("physical_reader")
    if held is not None and held[0] == key:
        return held[1]
    reader = MeasuredFeed(client, run, current.settings.window_steps)
    st.session_state["physical_reader"] = (key, reader)
    return reader


def section(current: PageData) -> None:
    """Poll the run's physical records and, when it has some, draw the section."""
    reader = reader_for(current)
    snap = current.snapshot
    if reader is None or snap is None:
        return
    reader.poll(current.watched.world_size)
    if not reader.any():
        return
    st.subheader("Measured vs estimated")
    if reader.error:
        st.caption(f"Physical records could not be read this tick ({reader.error}); showing what was read.")
    if snap.resolution_s:
        st.info("Measured loads are per step: switch the sidebar to full resolution to compare them.")
        return
    view = snap.view
    measured = reader.ring.aligned(view.step_T)
    complete = (measured.ranks_T > 0) & (measured.ranks_T >= view.ranks_T)
    if (reader.ring.num_layers, reader.ring.num_gpus) != view.loads_TLG.shape[1:]:
        st.warning(f"The physical records are of {reader.ring.num_layers} layers on {reader.ring.num_gpus} GPUs, "
                   f"the layout in force {view.loads_TLG.shape[1]} x {view.loads_TLG.shape[2]}: not compared.")
        return
    result = compare(view.loads_TLG[complete], view.step_T[complete], measured.loads_TLG[complete],
                     measured.step_T[complete], layer=snap.layer, summed=snap.summed)
    if result.num_steps == 0:
        st.caption(f"{len(reader.ring)} steps have physical records, none of them in view with every rank's yet.")
        return
    _metrics(result)
    draw(measured_figure(result, snap.step_marks()), "gpu_panel_measured")
    which = (f"layer {snap.layer}" if snap.layer is not None else "all layers summed" if snap.summed
             else "each layer's ratio, averaged over the layers that served tokens")
    notes = [f"{result.num_steps} of {view.num_steps} steps in view have every rank's physical record; {which}. "
             "Estimate: each expert's tokens split evenly over its replicas (the loads the other pages show); "
             "measured: the tokens the engine sent to each physical slot, ranks summed per GPU."]
    short = result.coverage_T < COVERAGE_NOTE
    if short.any():
        notes.append(f"{int(short.sum())} steps' physical records hold under {COVERAGE_NOTE:.0%} of their logical "
                     f"tokens (lowest {np.nanmin(result.coverage_T):.0%}): the measured loads miss part of them.")
    if reader.bad_records:
        notes.append(f"{reader.bad_records} physical entries skipped (latest: {reader.last_error}).")
    st.caption(" ".join(notes))


def _metrics(result: MeasuredVsEstimated) -> None:
    cols = st.columns(3)
    latest = int(result.step_T[-1])
    cols[0].metric(f"estimated, step {latest}", _ratio(result.estimated_T[-1]),
                   help=f"window mean {_ratio(result.mean(result.estimated_T))}: busiest GPU / mean under the "
                        "even split of each expert's tokens over its replicas")
    cols[1].metric(f"measured, step {latest}", _ratio(result.measured_T[-1]),
                   help=f"window mean {_ratio(result.mean(result.measured_T))}: busiest GPU / mean of the loads "
                        "the engine's balancer produced")
    cols[2].metric("what the balancer won", _signed(result.won_T[-1]),
                   delta=f"window mean {_signed(result.mean(result.won_T))}", delta_color="off",
                   help="estimated - measured: > 0 the engine's dispatch beat the even split, < 0 it did worse")


def _ratio(value: float) -> str:
    return "n/a" if not np.isfinite(value) else f"{value:.3f}"


def _signed(value: float) -> str:
    return "n/a" if not np.isfinite(value) else f"{value:+.3f}"
