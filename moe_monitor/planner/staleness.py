"""Placement staleness: how fast a layout fitted at step t degrades at t + delta.

For each fit step t (fit_window, fit_window + fit_every, ... < T) a layout is planned on steps [t - fit_window, t)
(or one given layout stands for a fit at ``fitted_at``); every later step t + delta is scored under it: the
max/mean GPU load per layer (core.loadmodel), averaged over the layers with tokens (NaN: no tokens). With
``phases_T`` each phase gets its own curve, fitted and scored on that phase's steps.
Shapes: counts_TLE [T, L, E] (or windows); F fits; D deltas; imbalance_FD [F, D] (NaN beyond T, idle steps or
another phase); mean_D, fits_D [D].
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moe_monitor.core.counts import as_counts
from moe_monitor.core.loadmodel import gpu_loads, imbalance, validated_layout

from .api import plan
from .loads import CHUNK_STEPS, whole_number


@dataclass(frozen=True)
class StalenessCurve:
    """fit_steps_F [F]; imbalance_FD [F, D]; deltas_D [D]; mean_D [D] (mean over the fits that reach delta and
    score a step there, NaN where none does) and fits_D [D] (how many do)."""
    fit_steps_F: np.ndarray
    deltas_D: np.ndarray
    imbalance_FD: np.ndarray
    mean_D: np.ndarray
    fits_D: np.ndarray

    def to_json(self) -> dict:
        def clean(a):
            return [None if not np.isfinite(x) else round(float(x), 6) for x in a]
        return {"fit_steps": self.fit_steps_F.tolist(), "deltas": self.deltas_D.tolist(),
                "mean_imbalance": clean(self.mean_D), "fits": self.fits_D.tolist(),
                "imbalance": [clean(row) for row in self.imbalance_FD]}


def step_imbalance(counts_TLE: np.ndarray, layout_LP: np.ndarray, gpus: int) -> np.ndarray:
    """Per step, the mean over layers with tokens of max/mean GPU load, float64 [T] (NaN for idle steps)."""
    out = np.empty(counts_TLE.shape[0])
    for a in range(0, counts_TLE.shape[0], CHUNK_STEPS):
        imb_TL = imbalance(gpu_loads(counts_TLE[a:a + CHUNK_STEPS], layout_LP, gpus))
        n = np.isfinite(imb_TL).sum(1)
        total = np.where(np.isfinite(imb_TL), imb_TL, 0.0).sum(1)
        out[a:a + CHUNK_STEPS] = np.where(n > 0, total / np.maximum(n, 1), np.nan)
    return out


def _curve(c: np.ndarray, fits: list[tuple[int, np.ndarray]], gpus: int, mask_T: np.ndarray | None
           ) -> StalenessCurve:
    T = c.shape[0]
    first = min(t for t, _ in fits) if fits else T
    D = max(T - first, 0)
    imb_FD = np.full((len(fits), D), np.nan)
    for f, (t, lay) in enumerate(fits):
        if t < T:
            imb = step_imbalance(c[t:], lay, gpus)
            if mask_T is not None:
                imb = np.where(mask_T[t:], imb, np.nan)
            imb_FD[f, :T - t] = imb
    ok = np.isfinite(imb_FD)
    n_D = ok.sum(0)
    mean_D = np.where(n_D > 0, np.where(ok, imb_FD, 0.0).sum(0) / np.maximum(n_D, 1), np.nan)
    return StalenessCurve(fit_steps_F=np.array([t for t, _ in fits], dtype=np.int64),
                          deltas_D=np.arange(D, dtype=np.int64), imbalance_FD=imb_FD, mean_D=mean_D,
                          fits_D=n_D.astype(np.int64))



def staleness(counts_TLE, gpus: int, redundant: int | None = None, layout_LP=None, fitted_at: int = 0,
              fit_window: int = 1000, fit_every: int | None = None, policy: str = "eplb",
              nodes: int | None = None, groups: int | None = None, phases_T=None
              ) -> StalenessCurve | dict[str, StalenessCurve]:
    """Staleness curve(s) of counts [T, L, E] (module docstring). Either ``layout_LP`` [L, P], held from step
    ``fitted_at``, or ``redundant`` with a fitting ``policy`` (planner.api.POLICIES) refitted every
    ``fit_every`` steps (default: fit_window) on the last ``fit_window`` steps. With ``phases_T`` (T labels):
    {phase: curve}; otherwise one curve."""
    c = as_counts(counts_TLE, "counts", ndim=(3,))
    T, L, E = c.shape
    gpus = whole_number(gpus, "gpus", 1)
    if phases_T is not None:
        phases = np.asarray(phases_T, dtype=object)
        if phases.shape != (T,):
            raise ValueError(f"phases must give one label per step ({T}), got shape {phases.shape}")
        labels = sorted({str(p) for p in phases})
        return {ph: _one(c, gpus, redundant, layout_LP, fitted_at, fit_window, fit_every, policy, nodes, groups,
                         np.array([str(p) == ph for p in phases])) for ph in labels}
    return _one(c, gpus, redundant, layout_LP, fitted_at, fit_window, fit_every, policy, nodes, groups, None)


def _one(c, gpus, redundant, layout_LP, fitted_at, fit_window, fit_every, policy, nodes, groups, mask_T):
    T, L, E = c.shape
    if layout_LP is not None:
        lay = validated_layout(layout_LP, E, gpus)
        if lay.shape[0] != L:
            raise ValueError(f"layout has {lay.shape[0]} layers, the counts have {L}")
        return _curve(c, [(whole_number(fitted_at, "fitted_at", 0), lay)], gpus, mask_T)
    if redundant is None:
        raise ValueError("give a layout, or redundant slots (and a policy) to fit layouts with")
    fit_window = whole_number(fit_window, "fit window", 1)
    fit_every = fit_window if fit_every is None else whole_number(fit_every, "fit every", 1)
    fits = []
    for t in range(fit_window, T, fit_every):
        window = c[t - fit_window:t] if mask_T is None else c[t - fit_window:t][mask_T[t - fit_window:t]]
        counts_LE = window.sum(0)
        if not counts_LE.any():
            continue
        fits.append((t, plan(counts_LE, gpus, redundant, nodes=nodes, groups=groups, policy=policy).layout_LP))
    return _curve(c, fits, gpus, mask_T)
