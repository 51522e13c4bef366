"""Everything the load pages show for one tick, computed from a window view (pure, no Streamlit).

GPU loads use the layout in force at each step (core.loadmodel's even split; ResolvedLayout.schedule). By
default a GPU's load in a step is its load in its busiest layer and the straggler is judged per (step, layer);
"all layers (sum)" and one chosen layer are options (docs/definitions.md, "GPU load"). Rollup buckets
(dashboard.live.buckets.BucketWindow) are analysed the same way, loads per step being the bucket mean, x_T the
buckets' starts, and per_step what the sums hide (dashboard.analytics.rollups.PerStepStats).

Shape legend: T steps (or buckets), L layers, G GPUs.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np

from moe_monitor.core.costmodel import ReducedTimes, TimeModel, verdict_of
from moe_monitor.dashboard.analytics.balance import (
    GpuWindowStats,
    LayerSpread,
    Straggler,
    across_layers,
    balancedness,
    layer_straggler_of,
    straggler,
    window_stats,
)
from moe_monitor.dashboard.analytics.rollups import PerStepStats
from moe_monitor.dashboard.analytics.series import rate_per_s
from moe_monitor.dashboard.analytics.timecost import TimeHeadline, headline
from moe_monitor.dashboard.live.buckets import BucketWindow
from moe_monitor.dashboard.live.layout import ResolvedLayout
from moe_monitor.dashboard.live.layout_changes import LayoutMark, change_marks
from moe_monitor.dashboard.live.window import MissingRanks, StepWindow, WindowView


@dataclass(frozen=True)
class TimeFigures:
    """The view in time (core.costmodel): model the run's TimeModel, rows the reductions of each row's
    predicted GPU times (every layer), headline the Overview's first lines (the chosen layer, or all)."""

    model: TimeModel
    rows: ReducedTimes
    headline: TimeHeadline


@dataclass
class Snapshot:
    """One tick's numbers. latest: index in the view of the newest complete step. eta_TL per-step
    balancedness; loads_TG per-step GPU load: its busiest layer (default), one chosen layer, or all layers
    summed (summed=True). missing: ranks absent from the view's steps. resolution_s: 0 when rows are steps,
    else the rollup buckets' seconds (then loads are per step, the bucket mean, eta_TL is each bucket sum's
    balancedness and per_step holds the per-step statistics the sums hide). time: the view in time (None: no
    cost model, time_note says why)."""

    view: WindowView
    layout: ResolvedLayout
    layer: int | None
    latest: int
    eta_TL: np.ndarray
    loads_TG: np.ndarray
    eta_now: LayerSpread
    eta_window_sum: LayerSpread
    eta_step_mean: LayerSpread
    idle_share: float
    stats: GpuWindowStats
    straggler: Straggler | None
    steps_per_s: float
    tokens_per_s: float
    summed: bool = False
    missing: MissingRanks = MissingRanks()
    resolution_s: int = 0
    per_step: PerStepStats | None = None
    time: TimeFigures | None = None
    time_note: str = ""

    @property
    def row_name(self) -> str:
        """What a row of the view is: 'step', or '1-minute bucket' / '1-second bucket'."""
        return "step" if not self.resolution_s else f"{bucket_name(self.resolution_s)} bucket"

    @property
    def x_T(self) -> np.ndarray:
        """The time axis of the figures: step ids [T], or the buckets' starts as datetime64[s] [T]."""
        if not self.resolution_s:
            return self.view.step_T
        return np.asarray(self.view.step_T, dtype=np.int64).astype("datetime64[s]")

    @property
    def x_title(self) -> str:
        return "step" if not self.resolution_s else "time (bucket start, UTC)"

    def axis_marks(self) -> list[tuple[float | str, str]]:
        """(x, label) of each layout change in view on the figures' axis: its step, or its bucket's start as a
        date string."""
        if not self.resolution_s:
            return list(self.step_marks())
        return [(str(np.datetime64(int(mark.step), "s")), mark.label) for mark in self.layout_marks()]

    @property
    def latest_G(self) -> np.ndarray:
        return self.loads_TG[self.latest]

    @property
    def latest_step(self) -> int:
        return int(self.view.step_T[self.latest])

    @property
    def load_label(self) -> str:
        if self.layer is not None:
            return f"layer {self.layer}"
        return "all layers summed" if self.summed else "its busiest layer in each step (per-layer view)"

    @property
    def unit(self) -> str:
        mean = "" if not self.resolution_s else ", bucket mean"
        if self.layer is not None:
            return f"tokens/step{mean}"
        return f"tokens/step, all layers{mean}" if self.summed else f"tokens/step in its busiest layer{mean}"

    @property
    def time_rows(self) -> ReducedTimes | None:
        """The predicted times of the view's rows for the layer in view (every layer unless one is chosen);
        None without a cost model."""
        if self.time is None:
            return None
        return self.time.rows if self.layer is None else self.time.rows.layer(self.layer)

    def gpu_name(self, gpu: int) -> str:
        return f"GPU {gpu} (node {self.layout.node_of(gpu)})"

    def layout_marks(self) -> list[LayoutMark]:
        """The layout changes inside this view, for the time-axis figures."""
        return change_marks(self.layout.schedule, self.view.step_T, self.view.time_s_T)

    def step_marks(self) -> list[tuple[float, str]]:
        """(step, label) of each layout change in view: the marks of the figures over steps."""
        return [(float(mark.step), mark.label) for mark in self.layout_marks()]

    def time_marks(self) -> list[tuple[float, str]]:
        """(unix time of the step it took force, label) of each layout change in view: the GPU panel's marks."""
        return [(mark.time_s, mark.label) for mark in self.layout_marks()]


def analyse(window: StepWindow, layout: ResolvedLayout, phase: str, layer: int | None = None,
            summed: bool = False, time_model: TimeModel | None = None, time_note: str = "") -> Snapshot | None:
    """The tick's numbers for steps passing the phase filter; None when no step passes it. layer None and
    summed False (the default) is the per-layer view; summed=True sums the layers; layer picks one.
    time_model: the run's cost model (None: figures in tokens only, time_note says why)."""
    if layer is not None and not 0 <= layer < window.num_layers:
        raise ValueError(f"layer {layer} is outside 0..{window.num_layers - 1}")
    view = window.view(phase, layout.layout_LP, layout.gpus, schedule=layout.schedule)
    if view.num_steps == 0:
        return None
    latest = window.latest_complete(view)
    loads_TLG = view.loads_TLG
    rows = window.row_stats(view.slots_T)  # per-row statistics kept with the loads: only new rows cost a tick
    buckets = window if isinstance(window, BucketWindow) else None
    steps_T = np.ones(view.num_steps, dtype=np.int64) if view.steps_T is None else view.steps_T
    per_step_T = 1.0 / np.maximum(steps_T, 1)  # a bucket's loads per step: its summed loads over its steps
    eta_TL = rows.eta_TL  # a ratio: the same per step as for the bucket's sum
    summed = summed and layer is None
    if layer is not None:
        loads_TG = loads_TLG[:, layer, :]
    else:
        loads_TG = loads_TLG.sum(axis=1) if summed else rows.max_TG
    if buckets is not None:
        loads_TG = (loads_TG * per_step_T[:, None]).astype(np.float32)
    if summed or layer is not None:
        stall = straggler(loads_TG)
    else:
        stall = layer_straggler_of(rows.busiest_TL, rows.busy_TL, rows.layer_sum_TG * per_step_T[:, None],
                                   window.num_layers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # layers idle in every step stay NaN
        eta_step_mean_L = np.nanmean(eta_TL, axis=0)
        idle = float(1.0 - np.nanmean(eta_TL)) if np.isfinite(eta_TL).any() else float("nan")
    if buckets is None:
        steps_per_s, tokens_per_s = rate_per_s(view.time_s_T), rate_per_s(view.time_s_T, view.tokens_T)
    else:
        span_s = float(view.time_s_T.max() - view.time_s_T.min()) + buckets.resolution_s
        steps_per_s, tokens_per_s = float(steps_T.sum()) / span_s, float(view.tokens_T.sum()) / span_s
    time, time_note = (None, time_note) if time_model is None else in_time(
        window, view, layout, time_model, layer, steps_per_s, tokens_per_s)
    return Snapshot(
        view=view, layout=layout, layer=layer, latest=latest, eta_TL=eta_TL, loads_TG=loads_TG,
        eta_now=across_layers(eta_TL[latest]), eta_window_sum=across_layers(balancedness(view.loads_TLG.sum(axis=0))),
        eta_step_mean=across_layers(eta_step_mean_L), idle_share=idle, stats=window_stats(loads_TG),
        straggler=stall, steps_per_s=steps_per_s, tokens_per_s=tokens_per_s, summed=summed,
        missing=window.missing_ranks(view.slots_T), resolution_s=window.resolution_s,
        per_step=None if buckets is None else buckets.per_step(view.slots_T), time=time, time_note=time_note,
    )


def in_time(window: StepWindow, view: WindowView, layout: ResolvedLayout, model: TimeModel, layer: int | None,
            steps_per_s: float, tokens_per_s: float) -> tuple[TimeFigures | None, str]:
    """(the view in time, "") from the window's per-row predicted times; (None, why) when the memory budget
    cannot hold them. The verdict covers the chosen layer, else every layer."""
    rows = window.row_times(view.slots_T, model, layout.layout_LP, layout.schedule)
    if rows is None:
        return None, f"no room for predicted times in {window.budget.describe()}"
    scoped = rows if layer is None else rows.layer(layer)
    head = headline(verdict_of(scoped), model, steps_per_s, tokens_per_s,
                    layout.gpus_per_node, "" if layer is None else f"layer {layer}")
    if window.resolution_s:
        head = replace(head, label=f"{head.label}; each {bucket_name(window.resolution_s)} bucket as its mean step")
    return TimeFigures(model, rows, head), ""


def bucket_name(resolution_s: int) -> str:
    """'1-second' / '1-minute' (else 'N-second') for a rollup resolution."""
    return {1: "1-second", 60: "1-minute"}.get(int(resolution_s), f"{int(resolution_s)}-second")
