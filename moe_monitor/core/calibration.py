"""Calibration of the cost model: a GpuProfile fitted to measured expert-compute seconds, and the errors of a
profile on held-out steps. Pure: numpy only. What `moe-monitor calibrate` and bench/costmodel.py run.

The fit is of TimeModel's GEMM part plus its overhead: per (step, layer, GPU) cell, sum over active slots of
max(bytes / hbm, flops / peak) (or their sum: GpuProfile.overlap False) + overhead, against the measured compute
phase (TimingRecord.compute_s_L). For a ratio r = (1/peak) / (1/hbm) the cell is linear in (1/hbm, overhead): a
weighted least squares solves it (relative error, overhead >= 0), and a log-space search over r finds the best;
fit_profile keeps the form that fits better. Dispatch and combine are fitted apart (link_fit). Shapes: X steps, L layers, P slots, G GPUs, S = P / G slots per GPU.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .costmodel import ModelDims, TimeModel, slot_work
from .hardware import GpuProfile, check_profile

RIDGE_RANGE_TOKENS = (1e-3, 1e7)  # ridge points (tokens per expert) the search spans
GRID_POINTS = 400
REFINE_STEPS = 60
UNFITTED_LINK_BYTES_PER_S = 1e12  # a profile's link figure when dispatch / combine were not measured


@dataclass(frozen=True)
class FitErrors:
    """Predicted against measured compute seconds. cells: (step, layer, GPU) cells compared; median_rel / p90_rel:
    of |predicted - measured| / measured; layer_cells: (step, layer) cells with every GPU measured; straggler_time /
    straggler_tokens: share of them where the GPU with the most predicted seconds / the most tokens is the
    measured busiest (a tie counts 1/n of a hit per tied GPU)."""

    cells: int
    median_rel: float
    p90_rel: float
    layer_cells: int
    straggler_time: float
    straggler_tokens: float

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LinkFit:
    """Dispatch + combine seconds of the busiest GPU of each (step, layer) against the rows it received:
    latency_s + rows x bytes / link_bytes_per_s; median_rel its relative error; cells the cells fitted."""

    link_bytes_per_s: float
    latency_s: float
    median_rel: float
    cells: int


@dataclass(frozen=True)
class Calibration:
    """The fitted profile, its errors on the steps it was fitted on, and the link fit (None: not measured)."""

    profile: GpuProfile
    errors: FitErrors
    link: LinkFit | None


def _per_gpu(values_XLP: np.ndarray, gpus: int) -> np.ndarray:
    return values_XLP.reshape(values_XLP.shape[:-1] + (gpus, values_XLP.shape[-1] // gpus)).sum(-1)


def _solve(s_N: np.ndarray, m_N: np.ndarray) -> tuple[float, float, float]:
    """(x, c, loss): x s_N + c against m_N in relative squared error, x > 0, c >= 0 (x = 0: no fit)."""
    w2 = 1.0 / m_N ** 2
    a, b, d = (w2 * s_N * s_N).sum(), (w2 * s_N).sum(), w2.sum()
    e, f = (w2 * s_N * m_N).sum(), (w2 * m_N).sum()
    det = a * d - b * b
    x, c = ((e * d - b * f) / det, (a * f - b * e) / det) if det > 0 else (0.0, -1.0)
    if c < 0 or x <= 0:
        x, c = (e / a if a > 0 else 0.0), 0.0
    if x <= 0:
        return 0.0, 0.0, float("inf")
    return float(x), float(c), float((((x * s_N + c) - m_N) ** 2 * w2).sum())


def fit_gemm(dims: ModelDims, slot_tokens_XLP, compute_s_XLG, gpus: int, tile_tokens: int = 1,
             form: str = "max") -> tuple[float, float, float]:
    """(hbm_bytes_per_s, flops_per_s, overhead_s) minimising the relative squared error of TimeModel's GEMM part
    + overhead against compute_s_XLG (NaN or <= 0: not measured, left out). form "max": a slot's weight reads and
    FLOPs overlap; "sum": they add (GpuProfile.overlap False). ValueError without a measured cell."""
    join = _join(form)
    bytes_XLP, flops_XLP = slot_work(dims, slot_tokens_XLP, tile_tokens)
    measured = np.asarray(compute_s_XLG, dtype=np.float64)
    if measured.shape != bytes_XLP.shape[:-1] + (gpus,):
        raise ValueError(f"compute times {measured.shape} do not match slot tokens {bytes_XLP.shape} on {gpus} GPUs")
    ok = np.isfinite(measured) & (measured > 0)
    if not ok.any():
        raise ValueError("no measured compute time to fit")
    m_N = measured[ok]
    slots = bytes_XLP.shape[-1] // gpus
    b_NS = bytes_XLP.reshape(bytes_XLP.shape[:-1] + (gpus, slots))[ok]
    f_NS = flops_XLP.reshape(flops_XLP.shape[:-1] + (gpus, slots))[ok]

    def loss(log_r: float) -> tuple[float, float, float]:
        return _solve(join(b_NS, np.exp(log_r) * f_NS).sum(-1), m_N)

    # r = bytes a FLOP costs as much time as: the ridge point t* = expert_bytes / (r x flops_per_token)
    per_token = dims.expert_bytes / dims.flops_per_token
    lo, hi = np.log(per_token / RIDGE_RANGE_TOKENS[1]), np.log(per_token / RIDGE_RANGE_TOKENS[0])
    grid = np.linspace(lo, hi, GRID_POINTS)
    losses = np.array([loss(g)[2] for g in grid])
    best = int(np.argmin(losses))
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, GRID_POINTS - 1)]
    golden = (np.sqrt(5.0) - 1.0) / 2.0
    for _ in range(REFINE_STEPS):  # golden-section search inside the best grid cell's neighbours
        c1, c2 = b - golden * (b - a), a + golden * (b - a)
        if loss(c1)[2] <= loss(c2)[2]:
            b = c2
        else:
            a = c1
    log_r = min((grid[best], (a + b) / 2.0), key=lambda g: loss(g)[2])
    x, c, total = loss(log_r)
    if not np.isfinite(total):
        raise ValueError("the compute times do not fit the cost model (no positive bandwidth)")
    return float(1.0 / x), float(1.0 / (np.exp(log_r) * x)), float(c)


def _join(form: str):
    if form not in ("max", "sum"):
        raise ValueError(f"form must be max or sum, got {form!r}")
    return np.maximum if form == "max" else np.add


def link_fit(dims: ModelDims, tokens_XLG, comm_s_XLG, compute_s_XLG, gpus: int) -> LinkFit | None:
    """Dispatch + combine against received rows, on the busiest GPU of each (step, layer) by measured compute
    (the others wait for it inside combine); the slope gives TimeModel's link bandwidth on one node. None when
    fewer than 3 cells are measured or the slope is not positive."""
    comm = np.asarray(comm_s_XLG, dtype=np.float64)
    compute = np.asarray(compute_s_XLG, dtype=np.float64)
    rows = np.asarray(tokens_XLG, dtype=np.float64)
    full = np.isfinite(compute).all(-1) & np.isfinite(comm).all(-1)
    if full.sum() < 3:
        return None
    busiest = np.nanargmax(np.where(np.isfinite(compute), compute, -np.inf), axis=-1)[..., None]
    y = np.take_along_axis(comm, busiest, -1)[..., 0][full]
    t = np.take_along_axis(rows, busiest, -1)[..., 0][full]
    keep = y > 0
    y, t = y[keep], t[keep]
    if y.size < 3:
        return None
    slope, latency, _ = _solve(t, y)
    if slope <= 0:
        return None
    # TimeModel: comm = rows x 2 x row_bytes x (G - 1) / G / link on one node
    link = 2.0 * dims.hidden_size * dims.act_bytes * (gpus - 1) / gpus / slope if gpus > 1 else UNFITTED_LINK_BYTES_PER_S
    rel = np.abs(latency + slope * t - y) / y
    return LinkFit(float(link), float(latency), float(np.median(rel)), int(y.size))


def errors(model: TimeModel, slot_tokens_XLP, compute_s_XLG) -> FitErrors:
    """FitErrors of model's compute part (GEMMs + overhead, no dispatch or combine) against measured seconds
    [X, L, G] (NaN: not measured) on slot tokens [X, L, P]: held-out steps, or the fitted ones."""
    times = model.gpu_times(slot_tokens_XLP)
    return score(times.weights_s + times.flops_s + times.overhead_s, times.tokens, compute_s_XLG)


def score(predicted_s_XLG, tokens_XLG, compute_s_XLG) -> FitErrors:
    """FitErrors of predicted seconds and token counts [X, L, G] against measured seconds [X, L, G]."""
    predicted = np.asarray(predicted_s_XLG, dtype=np.float64)
    measured = np.asarray(compute_s_XLG, dtype=np.float64)
    if measured.shape != predicted.shape:
        raise ValueError(f"compute times {measured.shape} do not match the prediction {predicted.shape}")
    ok = np.isfinite(measured) & (measured > 0)
    rel = np.abs(predicted[ok] - measured[ok]) / measured[ok]
    full = ok.all(-1)
    truth = np.where(ok, measured, -np.inf).argmax(-1)[full]
    return FitErrors(
        cells=int(ok.sum()), median_rel=_q(rel, 50), p90_rel=_q(rel, 90), layer_cells=int(full.sum()),
        straggler_time=_hits(predicted[full], truth),
        straggler_tokens=_hits(np.asarray(tokens_XLG, dtype=np.float64)[full], truth))


def _q(values: np.ndarray, percent: float) -> float:
    return float(np.percentile(values, percent)) if values.size else float("nan")


def _hits(score_NG: np.ndarray, truth_N: np.ndarray) -> float:
    """Share of rows whose highest score is at truth (a tie of n GPUs: 1/n when truth is among them)."""
    if not truth_N.size:
        return float("nan")
    top = score_NG >= score_NG.max(-1, keepdims=True) * (1 - 1e-12)
    hit = np.take_along_axis(top, truth_N[:, None], -1)[:, 0]
    return float((hit / top.sum(-1)).mean())


def fit_profile(dims: ModelDims, slot_tokens_XLP, compute_s_XLG, gpus: int, *, name: str = "calibrated",
                source: str = "calibrated", tile_tokens: int = 1, comm_s_XLG=None, form: str | None = None
                ) -> Calibration:
    """A GpuProfile of achieved figures (flops_share = hbm_share = 1) fitted to measured compute seconds
    [X, L, G] on slot tokens [X, L, P], one node of `gpus`; form "max" or "sum" (GpuProfile.overlap True or
    False; None: the one with the lower median error on these steps); comm_s_XLG (dispatch + combine, optional)
    fits the link apart (otherwise the link is UNFITTED_LINK_BYTES_PER_S, noted). ValueError without data."""
    if gpus < 1 or np.asarray(slot_tokens_XLP).shape[-1] % gpus:
        raise ValueError(f"slots must split evenly over {gpus} GPUs")
    if form is None:
        fits = [fit_profile(dims, slot_tokens_XLP, compute_s_XLG, gpus, name=name, source=source,
                            tile_tokens=tile_tokens, comm_s_XLG=comm_s_XLG, form=f) for f in ("max", "sum")]
        return min(fits, key=lambda fit: fit.errors.median_rel)
    hbm, peak, overhead = fit_gemm(dims, slot_tokens_XLP, compute_s_XLG, gpus, tile_tokens, form)
    link = None
    if comm_s_XLG is not None:
        tokens_XLG = _per_gpu(np.asarray(slot_tokens_XLP, dtype=np.float64), gpus)
        link = link_fit(dims, tokens_XLG, comm_s_XLG, compute_s_XLG, gpus)
    link_bytes = link.link_bytes_per_s if link is not None else UNFITTED_LINK_BYTES_PER_S
    width = float(dims.weight_bytes)
    notes: dict[str, object] = {"fitted_cells": int(np.isfinite(np.asarray(compute_s_XLG, dtype=np.float64)).sum()),
             "link": "fitted apart on dispatch + combine" if link is not None else "not fitted"}
    if link is not None:
        notes["link_latency_s"] = link.latency_s
    profile = check_profile(GpuProfile(
        name=name, flops_per_s={str(int(width)) if width.is_integer() else repr(width): peak},
        hbm_bytes_per_s=hbm, nvlink_bytes_per_s=link_bytes, nic_bytes_per_s=link_bytes, gpus_per_node=int(gpus),
        overhead_s=overhead, tile_tokens=int(tile_tokens), flops_share=1.0, hbm_share=1.0, source=source,
        notes=notes, overlap=form == "max"))
    model = TimeModel(dims, profile, gpus)
    return Calibration(profile, errors(model, slot_tokens_XLP, compute_s_XLG), link)
