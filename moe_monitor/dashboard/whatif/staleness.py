"""Placement staleness for the run or the recording range in view, pure (no Streamlit): how fast a layout
fitted at step t degrades at t + delta (planner.staleness), for the layout in force and for layouts planned on
the window itself, per phase. Capped so a page tick never pays much for it: the newest MAX_STEPS steps of the
window, at most MAX_FITS planned fits (EPLB parity, the fast policy, with the layout in force's R).

Layout in force: fitted when it came into force inside the window (its first step there), else taken as of
the window's first step. Planned: fitted on the last fit_window = T // FIT_SHARE steps before each fit step, refitted every fit_every steps so at most MAX_FITS fits score the rest of the window.

Shape legend (README, Conventions): T steps, L layers, E logical experts, P slots, D deltas.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from moe_monitor.planner.staleness import StalenessCurve, staleness

MAX_STEPS = 256   # newest steps of the window the curves are computed on
MAX_FITS = 2      # planned fits per phase
FIT_SHARE = 4     # fit window = T // FIT_SHARE steps


@dataclass(frozen=True)
class PhaseStaleness:
    """One phase's curves: in_force (the layout in force, one fit) and planned (layouts planned on the window,
    mean over up to MAX_FITS fits; None when the window is too short to fit on); steps: steps of the phase
    the curves use."""

    phase: str
    in_force: StalenessCurve
    planned: StalenessCurve | None
    steps: int


def staleness_in_view(counts_TLE: np.ndarray, phase_T: np.ndarray, layout_LP: np.ndarray, gpus: int,
                      fitted_at: int = 0, max_steps: int = MAX_STEPS, max_fits: int = MAX_FITS
                      ) -> list[PhaseStaleness]:
    """Curves per phase present (prefill, decode, mixed, unknown: sorted) of counts [T, L, E] with one phase
    label per step [T] (oldest first), under layout [L, P] on `gpus` GPUs; fitted_at: index of the step the layout
    in force came into force (0: the window's first step). Only the newest max_steps steps are used."""
    c = np.asarray(counts_TLE)
    phases = np.asarray(phase_T, dtype=object)
    if c.ndim != 3 or phases.shape != (c.shape[0],):
        raise ValueError(f"counts must be [T, L, E] with one phase per step, got {c.shape} and {phases.shape}")
    T = c.shape[0]
    if T == 0:
        return []
    start = max(0, T - max_steps)
    c, phases = c[start:], phases[start:]
    fitted_at = max(0, int(fitted_at) - start)
    T = c.shape[0]
    redundant = int(np.asarray(layout_LP).shape[1]) - c.shape[2]
    in_force = staleness(c, gpus, layout_LP=layout_LP, fitted_at=min(fitted_at, T - 1), phases_T=phases)
    planned: dict[str, StalenessCurve] = {}
    fit_window = T // FIT_SHARE
    if fit_window >= 1 and T - fit_window >= 2:
        fit_every = max(1, math.ceil((T - fit_window) / max(1, max_fits)))
        got = staleness(c, gpus, redundant=redundant, fit_window=fit_window, fit_every=fit_every, policy="eplb",
                        phases_T=phases)
        planned = got if isinstance(got, dict) else {}
    curves = in_force if isinstance(in_force, dict) else {}
    out = []
    for phase in sorted(curves):
        plan_curve = planned.get(phase)
        out.append(PhaseStaleness(phase, curves[phase],
                                  plan_curve if plan_curve is not None and plan_curve.fit_steps_F.size else None,
                                  int(np.count_nonzero(phases == phase))))
    return out
