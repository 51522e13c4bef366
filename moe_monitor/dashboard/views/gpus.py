"""GPU panel: every GPU's NVML readings at a glance (a GPU x time heatmap per reading, the GPU the Overview
names outlined; each GPU's latest reading against its expert load), then one GPU in detail beside its expert
load (the named GPU unless another is chosen or linked), or the collector's "no NVIDIA GPU / NVML not
available" report when that is what it sent.

Matching: by the rank that sent the readings (EP GPU g = rank g when there is one GPU per rank, i.e.
world_size == gpus and each rank reports one device). Otherwise NVML devices are shown by host and index,
and the page says that no pairing is claimed.

Measured vs estimated (views/measured.py), when the run has physical records: what the engine's balancer won
over the even-split estimate, per step.
"""
from __future__ import annotations

import streamlit as st

from moe_monitor.dashboard.figures import gpu as gpu_figures
from moe_monitor.dashboard.figures.units import GIB
from moe_monitor.dashboard.live.gpu_history import GpuHistory, gpu_grid, grid_rows
from moe_monitor.dashboard.views import measured, timeline
from moe_monitor.dashboard.views.common import (
    PageData,
    ago,
    asked_gpu,
    named_or_busiest,
    opening_tick,
    overview_named,
    poll_and_caption,
)
from moe_monitor.dashboard.views.draw import draw
from moe_monitor.dashboard.views.session import REFRESH_S

HEATMAP_COLUMNS = 2  # the per-reading heatmaps side by side


def page() -> None:
    st.title("GPU panel")
    asked_gpu("gpu_panel_gpu")
    live()


@st.fragment(run_every=REFRESH_S)
def live() -> None:
    current = poll_and_caption(require_steps=False)
    if current is not None:
        render(current, whole=not opening_tick("gpus"))
    timeline.keep_playing()


def render(current: PageData, whole: bool = True) -> None:
    """Every GPU, then the one chosen in the number input (-1: the one the Overview names, else the busiest);
    whole=False: down to the first chart (dashboard.views.common.opening_tick)."""
    history, snap = current.watched.gpus, current.snapshot
    unavailable_line(history.unavailable)
    if not history.series and not history.unavailable:
        st.info("The collector has not sent any NVML sample for this run yet.")
    gpus = snap.layout.gpus if snap is not None else max(1, len(history.devices()))
    named = overview_named(snap) if snap is not None else None  # marked as named only when the Overview names it
    pairs, note = history.pairing(gpus, current.watched.world_size)
    if history.series:
        every_gpu(current, history, gpus, pairs, note, named, whole)
        if not whole:
            return
        st.subheader("One GPU")
    st.number_input("EP GPU (-1: the GPU the Overview names)", min_value=-1, value=-1, step=1, key="gpu_panel_gpu")
    gpu = int(st.session_state.get("gpu_panel_gpu", -1))
    if gpu < 0:
        gpu = named_or_busiest(snap) if snap is not None else 0
    one_gpu(current, min(max(gpu, 0), gpus - 1), pairs, note, whole)


def every_gpu(current: PageData, history: GpuHistory, gpus: int, pairs: dict, note: str, named: int | None,
              whole: bool = True) -> None:
    """The all-GPU view: the latest readings against expert load (a chart and a table), then per reading a
    GPU x time heatmap; the GPU the Overview names is outlined in red where it is a row. whole=False: the
    first chart only."""
    snap = current.snapshot
    rows = grid_rows(pairs, history.devices(), gpus)
    grid = gpu_grid(history.readings(), rows, gpu_figures.grid_bins(len(rows)))
    marked = next((r for r, (gpu, _) in enumerate(rows) if named is not None and gpu == named), None)
    st.subheader("Every GPU")
    paired = "EP GPUs, each beside the NVML device its rank reported" if pairs else \
        f"NVML devices by host and index ({note or 'no pairing claimed'})"
    outlined = f"; red outline: GPU {named}, {gpu_figures.NAMED}" if marked is not None else (
        f"; GPU {named}, {gpu_figures.NAMED}, has no row here: no NVML device is paired with an EP GPU"
        if named is not None else "; none outlined: the Overview names no persistent straggler")
    bins = max(grid.edges_s.size - 1, 0)
    span = f"the last {grid.edges_s[-1] - grid.edges_s[0]:,.0f} s in {bins} equal time bins" if bins else "no time"
    st.caption(f"Rows: {paired}{outlined}. Columns: {span}, each the mean of the readings in it (no colour: no "
               "reading). NVML utilisation is the share of time a kernel ran, not SM occupancy.")
    if snap is not None and pairs:
        load_G, unit = snap.stats.mean_G, f"{snap.unit}, window mean"
        left, right = st.columns([2, 3])
        with left:
            draw(gpu_figures.latest_against_load(grid, load_G, named, unit), "gpu_panel_latest")
        if not whole:
            return
        latest_table(right, gpu_figures.latest_table(grid, load_G, named), unit)
    elif whole:
        latest_table(st, gpu_figures.latest_table(grid, None, None), "")
    columns = st.columns(HEATMAP_COLUMNS)
    for i, heat in enumerate(gpu_figures.nvml_heatmaps(grid, marked)[:None if whole else 1]):
        draw(heat, f"gpu_panel_heat_{i}", columns[i % HEATMAP_COLUMNS])


SHORT = {"NVML device": "device", "SM clock MHz": "SM MHz", "power W": "power W", "temperature C": "temp C",
         "utilisation %": "util %", "memory used GiB": "mem GiB"}  # the table's headers, narrow enough to fit


def latest_table(container, table, unit: str) -> None:
    """The latest readings, a row per GPU (the named one first), numbers at the precision NVML gives."""
    number = st.column_config.NumberColumn
    container.dataframe(table, hide_index=True, height=340, key="gpu_panel_table", column_config={
        "named": st.column_config.CheckboxColumn("named", help=gpu_figures.NAMED, width="small"),
        "NVML device": st.column_config.TextColumn(SHORT["NVML device"], help="NVML device: host #index"),
        gpu_figures.LOAD: number("load", format="%.1f", help=f"expert load, {unit}"),
        **{column: number(SHORT[column], format="%.1f" if column.endswith("GiB") else "%.0f", help=column)
           for _, column, _ in gpu_figures.READINGS},
        "reading age s": number("age s", format="%.1f", help="seconds before the newest reading of any device")})


def one_gpu(current: PageData, gpu: int, pairs: dict, note: str, whole: bool = True) -> None:
    """One EP GPU: its NVML device's latest readings and their history beside its expert load; whole=False:
    down to its first chart."""
    history, snap = current.watched.gpus, current.snapshot
    device = pairs.get(gpu)
    if device is None and history.series:
        st.caption(note or f"EP GPU {gpu}: no rank sent NVML readings for it; devices listed by host and index.")
        device = st.selectbox("NVML device (host, index)", history.devices(), key="gpu_panel_device",
                              format_func=lambda d: f"{d[0]} #{d[1]}")
        paired = False
    else:
        paired = device is not None
    rows = history.rows(device) if device else []
    if rows:
        last = rows[-1]
        cols = st.columns(5)
        cols[0].metric("utilisation (time-based)", reading(last, "gpu_utilization_percent", "{:.0f} %"))
        cols[1].metric("memory used / total", f"{reading(last, 'memory_used_bytes', '{:.1f}', GIB)} / "
                                              f"{reading(last, 'memory_total_bytes', '{:.1f} GiB', GIB)}")
        cols[2].metric("power / limit", f"{reading(last, 'power_usage_w', '{:.0f}')} / {reading(last, 'power_limit_w', '{:.0f} W')}")
        cols[3].metric("SM clock", reading(last, "sm_clock_mhz", "{:.0f} MHz"))
        cols[4].metric("temperature", reading(last, "temperature_c", "{:.0f} C"))
        beside = f"beside EP GPU {gpu} (rank {last.get('rank')})" if paired else "(not paired with an EP GPU)"
        st.caption(f"NVML device {device[1]} on `{device[0]}` ({last.get('name') or 'unknown model'}) {beside}. "
                   "NVML utilisation is the share of time a kernel ran, not SM occupancy.")
    if snap is None:
        return
    load_T = snap.loads_TG[:, gpu]
    st.metric(f"{snap.gpu_name(gpu)} expert load, latest {snap.row_name}", f"{float(load_T[snap.latest]):,.0f} tokens",
              help="sum over the GPU's slots of count / replicas (even split), for the layer choice in the sidebar")
    # the GPU and device are said above (metric, caption): a title naming them would change with the named GPU
    title = "The GPU's expert load" + (" and its NVML device's readings" if rows and paired else "")
    for i, panel in enumerate(gpu_figures.nvml_charts(rows if paired else [], snap.view.time_s_T, load_T, title,
                                                      snap.time_marks(), load_step_T=snap.view.step_T)):
        draw(panel, f"gpu_panel_fig_{i}")
        if not whole:
            return
    if rows and not paired:
        st.caption("The NVML device's readings (not paired with an EP GPU):")
        for i, panel in enumerate(gpu_figures.nvml_charts(rows, [], [], "NVML device (not paired)")[1:]):
            draw(panel, f"gpu_panel_nvml_{i}")
    measured.section(current)  # only when the run has physical records (an engine's measured slot loads)


def unavailable_line(unavailable: dict) -> None:
    """One warning for every collector that reported no NVIDIA GPU / no NVML (host, rank -> report), however
    many ranks: which hosts and ranks, the newest reason and when."""
    if not unavailable:
        return
    hosts = sorted({host for host, _ in unavailable})
    ranks = sorted(rank for _, rank in unavailable)
    newest = max(unavailable.values(), key=lambda report: report.time_s)
    shown = ", ".join(f"`{h}`" for h in hosts[:4]) + (f" and {len(hosts) - 4} more" if len(hosts) > 4 else "")
    span = str(ranks[0]) if len(ranks) == 1 else f"{len(ranks)} ranks, {ranks[0]}-{ranks[-1]}"
    st.warning(f"**No NVIDIA GPU / NVML not available** on {shown} (rank {span}): "
               f"{newest.reason or 'no reason given'} — reported {ago(newest.time_s)}. Expert load is still shown; "
               "GPU readings appear when a collector runs on a host with NVIDIA GPUs.")


def reading(row: dict, name: str, spec: str, scale: float = 1.0) -> str:
    """One NVML reading of a sample row, divided by scale and formatted; "n/a" where NVML had no value."""
    value = row.get(name)
    return "n/a" if value is None else spec.format(value / scale)


