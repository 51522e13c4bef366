"""Everything the load pages show for one tick, computed from a window view (pure, no Streamlit).

GPU loads use the layout with the even-split rule (planner.loads); each step's under the layout in force
at that step when the run published layout changes (ResolvedLayout.schedule). A layer finishes when its
own busiest GPU finishes, so by default a GPU's load in a step is its load in its busiest layer (max over
layers) and the straggler is judged per (step, layer) pair; "all layers (sum)" (total tokens the GPU served
in the step, where hot GPUs of different layers cancel) and one chosen layer are explicit options.

Shape legend: T steps, L layers, G GPUs.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from dashboard.analytics.balance import (
    GpuWindowStats,
    LayerSpread,
    Straggler,
    across_layers,
    balancedness,
    layer_straggler,
    straggler,
    window_stats,
)
from dashboard.analytics.series import rate_per_s
from dashboard.live.layout import ResolvedLayout
from dashboard.live.layout_changes import LayoutMark, change_marks
from dashboard.live.window import StepWindow, WindowView


@dataclass
class Snapshot:
    """One tick's numbers. latest: index in the view of the newest complete step. eta_TL per-step
    balancedness; loads_TG per-step GPU load: its busiest layer (default), one chosen layer, or all layers
    summed (summed=True)."""

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
        if self.layer is not None:
            return "tokens/step"
        return "tokens/step, all layers" if self.summed else "tokens/step in its busiest layer"

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
            summed: bool = False) -> Snapshot | None:
    """The tick's numbers for steps passing the phase filter; None when no step passes it. layer None and
    summed False (the default) is the per-layer view; summed=True sums the layers; layer picks one."""
    if layer is not None and not 0 <= layer < window.num_layers:
        raise ValueError(f"layer {layer} is outside 0..{window.num_layers - 1}")
    view = window.view(phase, layout.p2l_LP, layout.gpus, schedule=layout.schedule)
    if view.num_steps == 0:
        return None
    latest = window.latest_complete(view)
    loads_TLG = view.loads_TLG
    eta_TL = balancedness(loads_TLG)
    summed = summed and layer is None
    if layer is not None:
        loads_TG = loads_TLG[:, layer, :]
    else:
        loads_TG = loads_TLG.sum(axis=1) if summed else loads_TLG.max(axis=1)
    stall = straggler(loads_TG) if summed or layer is not None else layer_straggler(loads_TLG)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # layers idle in every step stay NaN
        eta_step_mean_L = np.nanmean(eta_TL, axis=0)
        idle = float(1.0 - np.nanmean(eta_TL)) if np.isfinite(eta_TL).any() else float("nan")
    return Snapshot(
        view=view, layout=layout, layer=layer, latest=latest, eta_TL=eta_TL, loads_TG=loads_TG,
        eta_now=across_layers(eta_TL[latest]), eta_window_sum=across_layers(balancedness(loads_TLG.sum(axis=0))),
        eta_step_mean=across_layers(eta_step_mean_L), idle_share=idle, stats=window_stats(loads_TG),
        straggler=stall, steps_per_s=rate_per_s(view.time_s_T),
        tokens_per_s=rate_per_s(view.time_s_T, view.tokens_T), summed=summed,
    )
