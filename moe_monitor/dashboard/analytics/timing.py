"""Where the time of the MoE layers goes, from measured layer timings (core.TimingRecord): pure numpy, arrays in,
arrays out. NaN means "not measured" everywhere and is left out of every sum and mean.

All-to-all share ((dispatch + combine) / layer, ratios of sums over cells where both were measured), achieved
overlap ((compute + comm - layer) / min(compute, comm), clipped to [0, 1]), step layer time (max over ranks,
summed over layers), straggler wait (the layer's time minus the rank's own compute) and the straggler bound (a
least-squares line of MoE time against max GPU load, with its R^2). Definitions: docs/dashboard.md (Time).

Shape legend: T steps, R ranks, L MoE layers.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike


def _f64(values: ArrayLike, name: str, ndim: int) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {array.shape}")
    return array


def _same(*arrays: np.ndarray) -> None:
    if len({a.shape for a in arrays}) != 1:
        raise ValueError(f"timing arrays must have one shape, got {[a.shape for a in arrays]}")


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


@dataclass(frozen=True)
class AllToAllShare:
    """dispatch_L, combine_L, total_L float64 [L]: share of layer time per layer (NaN: nothing measured);
    dispatch, combine, total: the same over every layer (ratios of sums)."""

    dispatch_L: np.ndarray
    combine_L: np.ndarray
    total_L: np.ndarray
    dispatch: float
    combine: float
    total: float


def alltoall_share(dispatch_TRL: ArrayLike, combine_TRL: ArrayLike, layer_TRL: ArrayLike) -> AllToAllShare:
    """All-to-all time as a share of layer time, per layer and overall. Inputs float [T, R, L] seconds (NaN =
    not measured); each ratio sums the cells where both its phase and the layer time were measured."""
    dispatch, combine, layer = (_f64(a, n, 3) for a, n in ((dispatch_TRL, "dispatch"), (combine_TRL, "combine"),
                                                             (layer_TRL, "layer")))
    _same(dispatch, combine, layer)
    out = []
    for num_TRL, den_TRL in ((dispatch, layer), (combine, layer), (dispatch + combine, layer)):
        ok = np.isfinite(num_TRL) & np.isfinite(den_TRL)
        num_L = np.where(ok, num_TRL, 0.0).sum(axis=(0, 1))
        den_L = np.where(ok, den_TRL, 0.0).sum(axis=(0, 1))
        out.append((_ratio(num_L, den_L), float(_ratio(np.array(num_L.sum()), np.array(den_L.sum())))))
    return AllToAllShare(out[0][0], out[1][0], out[2][0], out[0][1], out[1][1], out[2][1])


def overlap_cells(dispatch_TRL: ArrayLike, compute_TRL: ArrayLike, combine_TRL: ArrayLike,
                  layer_TRL: ArrayLike) -> np.ndarray:
    """float64 [T, R, L] achieved overlap of each cell: (compute + comm - layer) / min(compute, comm), comm =
    dispatch + combine, clipped to [0, 1]; NaN where a phase is unmeasured or min(compute, comm) is 0."""
    dispatch, compute, combine, layer = (_f64(a, n, 3) for a, n in (
        (dispatch_TRL, "dispatch"), (compute_TRL, "compute"), (combine_TRL, "combine"), (layer_TRL, "layer")))
    _same(dispatch, compute, combine, layer)
    comm = dispatch + combine
    shorter = np.minimum(compute, comm)
    raw = _ratio(compute + comm - layer, shorter)
    return np.where(np.isfinite(raw), np.clip(raw, 0.0, 1.0), np.nan)


def _nanmean(values: np.ndarray, axis=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices stay NaN
        return np.nanmean(values, axis=axis)


def overlap(dispatch_TRL: ArrayLike, compute_TRL: ArrayLike, combine_TRL: ArrayLike,
            layer_TRL: ArrayLike) -> tuple[np.ndarray, float]:
    """(overlap_L float64 [L]: mean over measured (step, rank) cells of overlap_cells, the mean over every
    measured cell); NaN where no cell was measured."""
    cells_TRL = overlap_cells(dispatch_TRL, compute_TRL, combine_TRL, layer_TRL)
    overall = float(_nanmean(cells_TRL)) if np.isfinite(cells_TRL).any() else float("nan")
    return _nanmean(cells_TRL, axis=(0, 1)), overall


def step_layer_time(layer_TRL: ArrayLike) -> np.ndarray:
    """float64 [T, L]: each layer's time in each step, its slowest rank's (max over measured ranks; NaN when no
    rank measured it)."""
    layer = _f64(layer_TRL, "layer", 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmax(layer, axis=1) if layer.shape[1] else np.full((layer.shape[0], layer.shape[2]), np.nan)


def step_moe_time(layer_TRL: ArrayLike) -> np.ndarray:
    """float64 [T]: the step's MoE time, step_layer_time summed over the measured layers (NaN when none was)."""
    per_TL = step_layer_time(layer_TRL)
    measured_T = np.isfinite(per_TL).any(axis=1)
    return np.where(measured_T, np.nansum(per_TL, axis=1), np.nan)


def straggler_wait(compute_TRL: ArrayLike, layer_TRL: ArrayLike) -> np.ndarray:
    """float64 [T, R, L]: the layer's time (max over ranks) minus each rank's own compute, >= 0 for measured
    cells; NaN where either is unmeasured."""
    compute, layer = _f64(compute_TRL, "compute", 3), _f64(layer_TRL, "layer", 3)
    _same(compute, layer)
    return step_layer_time(layer)[:, None, :] - compute


def wait_per_rank(compute_TRL: ArrayLike, layer_TRL: ArrayLike) -> np.ndarray:
    """float64 [R]: a rank's straggler wait per step, summed over layers and averaged over the steps in which
    it was measured (NaN for a rank never measured)."""
    wait_TRL = straggler_wait(compute_TRL, layer_TRL)
    measured_TR = np.isfinite(wait_TRL).any(axis=2)
    per_TR = np.where(measured_TR, np.nansum(wait_TRL, axis=2), np.nan)
    return _nanmean(per_TR, axis=0)


def measured_straggler(wait_R: ArrayLike) -> int | None:
    """The rank the others wait for, by measurement: the one whose straggler wait (wait_per_rank) is least;
    None when no rank was measured."""
    wait_R = np.asarray(wait_R, dtype=np.float64)
    finite = np.isfinite(wait_R)
    return int(np.flatnonzero(finite)[np.argmin(wait_R[finite])]) if finite.any() else None


def layer_seconds(layer_TRL: ArrayLike) -> tuple[float, float]:
    """(mean, p99) over the measured (step, layer) pairs of step_layer_time, seconds; NaN when none."""
    per_TL = step_layer_time(layer_TRL)
    finite = per_TL[np.isfinite(per_TL)]
    if not finite.size:
        return float("nan"), float("nan")
    return float(finite.mean()), float(np.percentile(finite, 99.0))


@dataclass(frozen=True)
class LineFit:
    """y = slope * x + intercept by least squares over n finite (x, y) pairs; r2 = 1 - SS_res / SS_tot (NaN
    when n < 2, x does not vary, or y does not vary)."""

    slope: float
    intercept: float
    r2: float
    n: int


def fit_line(x_T: ArrayLike, y_T: ArrayLike) -> LineFit:
    """Least-squares line of y against x over the pairs where both are finite (x, y float [T])."""
    x, y = _f64(x_T, "x", 1), _f64(y_T, "y", 1)
    _same(x, y)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    n = int(x.size)
    nan = float("nan")
    if n < 2 or np.ptp(x) == 0:
        return LineFit(nan, nan, nan, n)
    dx = x - x.mean()
    slope = float((dx * (y - y.mean())).sum() / (dx * dx).sum())
    intercept = float(y.mean() - slope * x.mean())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    ss_res = float(((y - (slope * x + intercept)) ** 2).sum())
    return LineFit(slope, intercept, 1.0 - ss_res / ss_tot if ss_tot > 0 else nan, n)


@dataclass(frozen=True)
class TimingSummary:
    """One window's figures (what the exporter publishes): all-to-all shares, mean overlap, mean and p99 layer
    time (seconds, per (step, layer), slowest rank)."""

    dispatch_share: float
    combine_share: float
    overlap: float
    layer_mean_s: float
    layer_p99_s: float


def summarise(dispatch_TRL: ArrayLike, compute_TRL: ArrayLike, combine_TRL: ArrayLike,
              layer_TRL: ArrayLike) -> TimingSummary:
    """The window's TimingSummary (inputs float [T, R, L] seconds, NaN = not measured)."""
    share = alltoall_share(dispatch_TRL, combine_TRL, layer_TRL)
    _, overall = overlap(dispatch_TRL, compute_TRL, combine_TRL, layer_TRL)
    mean_s, p99_s = layer_seconds(layer_TRL)
    return TimingSummary(share.dispatch, share.combine, overall, mean_s, p99_s)


@dataclass(frozen=True)
class BeforeAfter:
    """Measured means over the steps before and after a layout change: layer_s (the step's MoE time,
    step_moe_time) and balancedness (the step's mean over layers); steps_before / steps_after: how many steps
    each side covers (unmeasured values among them are left out of its means); layer_s_halfwidth /
    eta_halfwidth: half the 95% interval of after - before (normal approximation of the difference of two means,
    each side's sample variance; NaN when a side has fewer than two measured values)."""

    change_step: int
    layer_s_before: float
    layer_s_after: float
    eta_before: float
    eta_after: float
    steps_before: int
    steps_after: int
    layer_s_halfwidth: float = float("nan")
    eta_halfwidth: float = float("nan")

    @property
    def layer_change_interval(self) -> tuple[float, float]:
        """The 95% interval of layer_change_ratio (NaN, NaN when unknown)."""
        if not np.isfinite(self.layer_change_ratio) or not np.isfinite(self.layer_s_halfwidth):
            return float("nan"), float("nan")
        diff = self.layer_s_after - self.layer_s_before
        return ((diff - self.layer_s_halfwidth) / self.layer_s_before,
                (diff + self.layer_s_halfwidth) / self.layer_s_before)

    @property
    def layer_change_ratio(self) -> float:
        """layer_s_after / layer_s_before - 1 (negative: faster); NaN when either is missing."""
        if not (np.isfinite(self.layer_s_before) and np.isfinite(self.layer_s_after)) or self.layer_s_before <= 0:
            return float("nan")
        return self.layer_s_after / self.layer_s_before - 1.0


def before_after(step_T: ArrayLike, layer_s_T: ArrayLike, eta_T: ArrayLike, change_step: int,
                 steps: int) -> BeforeAfter:
    """Means of layer_s_T and eta_T (float [T], NaN = unmeasured, left out) over the `steps` newest steps with
    step id < change_step and the `steps` oldest with step id >= change_step (step_T int [T], any order).
    NaN for a side without steps."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    step = np.asarray(step_T, dtype=np.int64)
    layer, eta = _f64(layer_s_T, "layer_s_T", 1), _f64(eta_T, "eta_T", 1)
    if not step.shape == layer.shape == eta.shape or step.ndim != 1:
        raise ValueError(f"step_T, layer_s_T and eta_T must be [T] of one length, got {step.shape}, "
                         f"{layer.shape}, {eta.shape}")
    order = np.argsort(step, kind="stable")
    step, layer, eta = step[order], layer[order], eta[order]
    cut = int(np.searchsorted(step, change_step, side="left"))
    sides = []
    for lo, hi in ((max(0, cut - steps), cut), (cut, min(step.size, cut + steps))):
        lay, et = layer[lo:hi], eta[lo:hi]
        sides.append((lay[np.isfinite(lay)], et[np.isfinite(et)], int(hi - lo)))
    (lay_b, et_b, nb), (lay_a, et_a, na) = sides
    return BeforeAfter(int(change_step), _mean(lay_b), _mean(lay_a), _mean(et_b), _mean(et_a), nb, na,
                       _halfwidth(lay_b, lay_a), _halfwidth(et_b, et_a))


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else float("nan")


def _halfwidth(before: np.ndarray, after: np.ndarray) -> float:
    """Half the 95% interval of mean(after) - mean(before); NaN with fewer than two values on a side."""
    if before.size < 2 or after.size < 2:
        return float("nan")
    return 1.96 * float(np.sqrt(before.var(ddof=1) / before.size + after.var(ddof=1) / after.size))


def select_layer(times_TRL: ArrayLike, layer: int | None) -> np.ndarray:
    """float64 [T, R]: one layer's times (layer an index), or the mean over the measured layers (layer None)."""
    times = _f64(times_TRL, "times", 3)
    if layer is None:
        return _nanmean(times, axis=2)
    if not 0 <= layer < times.shape[2]:
        raise ValueError(f"layer {layer} is outside 0..{times.shape[2] - 1}")
    return times[:, :, layer]


def mean_over(values: ArrayLike, axis: int) -> np.ndarray:
    """nanmean along axis, NaN (no warning) where nothing was measured."""
    return _nanmean(np.asarray(values, dtype=np.float64), axis=axis)


def max_over(values: ArrayLike, axis: int) -> np.ndarray:
    """nanmax along axis, NaN (no warning) where nothing was measured."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmax(np.asarray(values, dtype=np.float64), axis=axis)


def max_gpu_load_per_step(loads_TLG: ArrayLike) -> np.ndarray:
    """float64 [T]: the busiest GPU's load of each layer, summed over layers (the load the step's MoE time
    waits on, by the straggler bound); loads_TLG float [T, L, G] tokens."""
    loads = _f64(loads_TLG, "loads_TLG", 3)
    if loads.shape[2] == 0:
        return np.full(loads.shape[0], np.nan)
    return loads.max(axis=2).sum(axis=1)
