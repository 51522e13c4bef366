"""Per-step balancedness of a trace, computed once when it is written or converted (so a timeline opens
without reading the counts).

balancedness of a step = mean over layers of eta[l] = mean_g load[l, g] / max_g load[l, g], where a GPU's
load is its tokens under the layout in force at that step, split evenly across an expert's replicas
(core.loadmodel: gpu_weights + weighted_loads, the dashboard's own rule and arithmetic); idle layers are left
out of the mean, NaN when every layer is idle. Layout records for another GPU count than the run metadata's
layout are left out, as the dashboard does (dashboard.live.layout.resolve_layout).

Shape legend: T steps, L layers, E experts, G GPUs, P slots.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from moe_monitor import core
from moe_monitor.core.loadmodel import balancedness, gpu_weights, weighted_loads
from moe_monitor.core.timeline import LayoutTimeline


class LayoutSchedule:
    """The layouts of a run in step order: the metadata's from the start, then each record from its step (the
    layout timeline, core.timeline)."""

    def __init__(self, meta: core.RunMeta, layouts: Sequence[core.LayoutRecord] = ()):
        self.num_experts = meta.num_experts
        self.gpus = meta.layout.gpus
        self._base = np.asarray(meta.layout.physical_to_logical_map, dtype=np.int64)
        self.num_layers = int(self._base.shape[0])
        self._changes: LayoutTimeline[np.ndarray] = LayoutTimeline(max_changes=1 << 20)
        self._weights: dict[int, np.ndarray] = {}
        for rec in sorted(layouts, key=lambda r: r.step):
            self.add(rec)

    def add(self, rec: core.LayoutRecord) -> None:
        """A layout record (already validated against the run): in force from rec.step on."""
        if rec.gpus != self.gpus or rec.num_layers != self.num_layers:
            return
        self._changes.add(rec.step, np.asarray(rec.physical_to_logical_LP, dtype=np.int64))
        self._weights.clear()

    def segment_of(self, step_T: np.ndarray) -> np.ndarray:
        """int [T]: index of the layout in force at each step (-1: the metadata's)."""
        return self._changes.index_at(step_T)

    def weights(self, index: int) -> np.ndarray:
        """gpu_weights float32 [L, E, G] of layout `index` (-1: the metadata's)."""
        held = self._weights.get(index)
        if held is None:
            layout = self._base if index < 0 else self._changes.items[index]
            held = self._weights[index] = gpu_weights(layout, self.num_experts, self.gpus)
        return held


def step_balancedness(step_T: np.ndarray, counts_TLE: np.ndarray, schedule: LayoutSchedule) -> np.ndarray:
    """float64 [T]: each step's mean-over-layers balancedness (see the module docstring) from its counts
    [T, L, E] (ranks already summed) under the layout in force at step_T."""
    out = np.full(len(step_T), np.nan)
    if len(step_T) == 0:
        return out
    segment_T = schedule.segment_of(np.asarray(step_T, dtype=np.int64))
    for index in np.unique(segment_T):
        these = np.flatnonzero(segment_T == index)
        loads_TLG = weighted_loads(counts_TLE[these], schedule.weights(int(index)))
        eta_TL = balancedness(loads_TLG)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a step idle in every layer stays NaN
            out[these] = np.nanmean(eta_TL, axis=1)
    return out


def summed_by_step(step_R: np.ndarray, counts_RLE: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows (step, rank) -> (distinct steps [T] ascending, counts summed over ranks int64 [T, L, E], index of
    each row's step [R])."""
    steps_T, row_step_R = np.unique(step_R, return_inverse=True)
    if len(steps_T) == len(step_R):  # one row per step (one rank): a reorder, no sums
        summed_TLE = np.empty(counts_RLE.shape, dtype=np.int64)
        summed_TLE[row_step_R] = counts_RLE
        return steps_T, summed_TLE, row_step_R
    summed = np.zeros((len(steps_T),) + counts_RLE.shape[1:], dtype=np.int64)
    np.add.at(summed, row_step_R, counts_RLE)
    return steps_T, summed, row_step_R
