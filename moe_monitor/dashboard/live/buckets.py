"""A step window whose rows are rollup buckets (core.RollupRecord, 1 s or 60 s of aggregated steps each): hours
of history at one row per bucket, analysed by every page as steps are. Pure, no Streamlit.

A row's counts are the bucket's sum, its "step id" and time the bucket's start (unix s), its phase its steps'
phase when they share one (else "mixed"), one rank of a world of one; steps_C holds each row's steps (loads per
step = the bucket mean). The balancedness histogram, busiest / mean GPU load sums and peak, and the rank-steps
missing and late ride beside each row (per_step(): dashboard.analytics.rollups.PerStepStats of a view).

Shape legend: C ring capacity (buckets), T buckets in a view, L layers, E logical experts, B core.ETA_BINS.
"""
from __future__ import annotations

import numpy as np

from moe_monitor import core
from moe_monitor.dashboard.analytics.rollups import PerStepStats, per_step_stats
from moe_monitor.dashboard.live.record_checks import PHASE_CODE, bounded_int
from moe_monitor.dashboard.live.window import StepWindow

_MIXED = PHASE_CODE["mixed"]


def bucket_phase(steps_by_phase: np.ndarray) -> int:
    """Phase code of a bucket (core.PHASES order): its steps' phase when they all share one, else mixed ("unknown"
    for a bucket without steps)."""
    present = np.flatnonzero(np.asarray(steps_by_phase) > 0)
    if present.size == 0:
        return PHASE_CODE["unknown"]
    return int(present[0]) if present.size == 1 else _MIXED


class BucketWindow(StepWindow):
    """The newest `capacity` rollup buckets of one resolution of a run (see the module docstring). add_bucket()
    refuses with ValueError (the window unchanged) a bucket of another resolution or shape, one already held
    (the same start) or one older than everything in a full ring."""

    def __init__(self, capacity: int, num_layers: int, num_experts: int, resolution_s: int):
        super().__init__(capacity, num_layers, num_experts)
        if resolution_s not in core.ROLLUP_RESOLUTIONS_S:
            raise ValueError(f"rollup resolution must be one of {core.ROLLUP_RESOLUTIONS_S} s, got {resolution_s}")
        self.resolution_s = int(resolution_s)
        self.eta_hist_CB = np.zeros((self.capacity, core.ETA_BINS), dtype=np.int64)
        self.max_load_sum_C = np.zeros(self.capacity, dtype=np.float64)
        self.mean_load_sum_C = np.zeros(self.capacity, dtype=np.float64)
        self.max_load_peak_C = np.zeros(self.capacity, dtype=np.float64)
        self.missing_C = np.zeros(self.capacity, dtype=np.int64)
        self.late_C = np.zeros(self.capacity, dtype=np.int64)
        self.gpus_C = np.zeros(self.capacity, dtype=np.int64)

    def add_bucket(self, rec: core.RollupRecord) -> None:
        """One bucket as a new row (the oldest leaving a full ring). Everything is checked before anything
        changes."""
        if rec.resolution_s != self.resolution_s:
            raise ValueError(f"a {rec.resolution_s} s bucket in a window of {self.resolution_s} s buckets")
        start = bounded_int(rec.start_s, "bucket start", 0, int(core.MAX_TIME_S))
        steps = bounded_int(rec.steps, "bucket steps", 0, core.MAX_STEP)
        tokens = bounded_int(rec.tokens, "bucket tokens", 0, core.MAX_STEP)
        counts = self.checked_counts(rec.counts_LE, f"bucket at {start} s", core.MAX_STEP - 1, "")
        hist = np.asarray(rec.eta_hist_B)
        phases = np.asarray(rec.steps_by_phase)
        if hist.shape != (core.ETA_BINS,) or hist.dtype.kind not in "iu" or (hist < 0).any():
            raise ValueError(f"the balancedness histogram must be {core.ETA_BINS} counts >= 0")
        if phases.shape != (len(core.PHASES),) or phases.dtype.kind not in "iu" or (phases < 0).any():
            raise ValueError(f"steps per phase must be {len(core.PHASES)} counts >= 0")
        loads = [float(v) for v in (rec.max_load_sum, rec.mean_load_sum, rec.max_load_peak)]
        if not all(np.isfinite(v) and v >= 0 for v in loads):
            raise ValueError("bucket loads must be finite and >= 0")
        if start in self._slot_of_step:
            raise ValueError(f"the bucket at {start} s arrived twice")
        slot = self._slot_for(start, counts, {0})
        # nothing below raises
        slot = self._write(slot, start, counts, {0}, 1, tokens, float(start), bucket_phase(phases))
        self.steps_C[slot] = steps
        self.eta_hist_CB[slot] = hist
        self.max_load_sum_C[slot], self.mean_load_sum_C[slot], self.max_load_peak_C[slot] = loads
        self.missing_C[slot] = max(0, int(rec.missing_rank_steps))
        self.late_C[slot] = max(0, int(rec.late_rank_steps))
        self.gpus_C[slot] = max(0, int(rec.gpus))

    def per_step(self, slots: np.ndarray) -> PerStepStats:
        """Per-step statistics of the given rows (a view's slots_T, oldest first)."""
        slots = np.asarray(slots, dtype=np.int64)
        return per_step_stats(self.eta_hist_CB[slots], self.steps_C[slots], self.max_load_sum_C[slots],
                              self.mean_load_sum_C[slots], self.max_load_peak_C[slots], self.missing_C[slots],
                              self.late_C[slots])
