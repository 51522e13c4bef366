"""The tail objective: a layout for the per-step busiest GPU under a dispatch policy, not for the window's sum.

Objective, per layer: the p99 over steps of the per-step imbalance (max / mean GPU load of one step under the
dispatch policy, core.dispatch and core.steptails). ``fit_tail`` fits candidates (the caller's window layout;
under even split the window layout with every GPU's step-to-step variance evened out, ``variance``; the robust
fit on single ``steps`` and on ``bursts``; under lp both ``+linked``, planner.lproom) and keeps per layer the
lowest p99 on held-out steps (another than the base, the variance layout under even split and the window layout
otherwise, only when lower by SWITCH_MARGIN).
Layers without tokens keep the window layout. Why and measured figures: docs/planner.md (Objectives and dispatch).

Shapes: steps_TLE [T, L, E]; layout_LP [L, E + R]; per-layer figures [L].
"""
from __future__ import annotations

import numpy as np

from moe_monitor.core.dispatch import check_policy
from moe_monitor.core.steptails import step_tails

from .lproom import connect_replicas
from .robust import fit_robust, normalise
from .variance import variance_swaps

FIT_STEPS = 24        # single steps the robust fit balances at once (its scenarios)
SCORE_STEPS = {"lp": 96}   # held-out steps each candidate is scored on under lp (~100 us per step and layer)
SCORE_STEPS_CHEAP = 480    # under the other policies (a p99 of 96 steps is nearly their max: noisy)
SWITCH_MARGIN = 0.005  # a candidate replaces the window layout of a layer only when its p99 is this much lower
                       # (the p99 of a few hundred steps is noisy: on the bench, 0.002 edges were lost on new steps)
VARIANCE_MARGIN = 0.01  # the same against the variance layout (even split): it sits near the noise floor, so
                        # smaller edges of candidates fitted to a few sampled steps were noise (bench.planner)
BURST_STEPS = 8       # steps summed into one scenario of the ``bursts`` candidate
OBJECTIVES = ("window", "tail", "time")  # time: planner.timeplan


def check_objective(objective: str) -> str:
    """The objective when it is one of OBJECTIVES; ValueError naming them otherwise."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r} (one of {', '.join(OBJECTIVES)})")
    return objective


def sample_steps(steps: int, fit: int = FIT_STEPS, score: int = SCORE_STEPS_CHEAP, seed: int = 0
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(fit indices, score indices), disjoint sorted int64 arrays (T >= 2): up to fit + score steps evenly
    spaced over ``steps`` steps, of which a seeded random choice of up to ``fit`` (at most half) fit and the
    rest score (random, not strided: a stride could alias with a periodic pattern of the traffic)."""
    total = min(steps, fit + score)
    picked = np.unique(np.linspace(0, steps - 1, total).round().astype(np.int64))
    n_fit = max(1, min(fit, picked.size // 2))
    fit_mask = np.zeros(picked.size, dtype=bool)
    fit_mask[np.random.default_rng(seed).permutation(picked.size)[:n_fit]] = True
    return picked[fit_mask], picked[~fit_mask]


def tail_p99(steps_TLE: np.ndarray, layout_LP: np.ndarray, gpus: int, dispatch: str) -> np.ndarray:
    """Per layer, p99 over the steps of the per-step imbalance under ``dispatch``, float64 [L] (1.0 for layers
    without tokens)."""
    p99 = step_tails(steps_TLE, layout_LP, gpus, dispatch).layer_summary()["p99"]
    return np.array([1.0 if v is None else v for v in p99])


def _bursts(steps_TLE: np.ndarray, size: int) -> np.ndarray:
    chunks = np.array_split(steps_TLE, max(1, steps_TLE.shape[0] // size))
    return np.stack([chunk.sum(0) for chunk in chunks])


def _dense_uniform(scen_WLE: np.ndarray) -> np.ndarray:
    """Scenarios with every layer-without-tokens set to equal load (planned as uniform, like plan() does)."""
    busy = scen_WLE.sum(-1, keepdims=True) > 0
    return np.where(busy, scen_WLE, 1.0)


def step_variance(steps_TLE: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, variance) over steps of every expert's per-step share of its layer's tokens, [L, E] each."""
    total = steps_TLE.sum(-1, keepdims=True)
    share = steps_TLE / np.where(total > 0, total, 1.0)
    return share.mean(0), share.var(0)


def fit_tail(steps_TLE, gpus: int, redundant: int, window_LP: np.ndarray, dispatch: str = "even"
             ) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """(layout [L, E + R], its held-out p99 per layer [L], how many layers each candidate won) for per-step
    counts [T, L, E] (T >= 2) under ``dispatch``; ``window_LP`` is the caller's window layout (module
    docstring)."""
    check_policy(dispatch)
    c = np.asarray(steps_TLE, dtype=np.float64)
    if c.ndim != 3 or c.shape[0] < 2:
        raise ValueError(f"the tail objective needs per-step counts [steps >= 2, layers, experts], got {c.shape}")
    fit_idx, score_idx = sample_steps(c.shape[0], score=SCORE_STEPS.get(dispatch, SCORE_STEPS_CHEAP))
    fit_steps, score_steps = c[fit_idx], c[score_idx]
    layouts = {"window": np.asarray(window_LP, dtype=np.int64)}
    unscored = np.setdiff1d(np.arange(c.shape[0]), score_idx)        # fits never see a scored step
    if dispatch == "even":
        layouts["variance"] = variance_swaps(layouts["window"], *step_variance(_dense_uniform(c[unscored])), gpus)
    scen = _dense_uniform(normalise(fit_steps))
    layouts["steps"] = fit_robust(scen, gpus, redundant, recent=scen.shape[0])
    bursts = _dense_uniform(normalise(_bursts(c[unscored], BURST_STEPS)))
    layouts["bursts"] = fit_robust(bursts, gpus, redundant, recent=min(bursts.shape[0], FIT_STEPS))
    if dispatch == "lp":
        weight_LE = _dense_uniform(c.sum(0)[None])[0]
        for name in ("window", "steps"):
            layouts[f"{name}+linked"] = connect_replicas(layouts[name], weight_LE, gpus)
    names = list(layouts)
    p99_NL = np.stack([tail_p99(score_steps, layouts[n], gpus, dispatch) for n in names])
    base = "variance" if "variance" in layouts else "window"          # the layout the others must beat
    margin = VARIANCE_MARGIN if base == "variance" else SWITCH_MARGIN
    handicap_N = np.array([0.0 if n == base else margin for n in names])
    pick_L = np.argmin(p99_NL + handicap_N[:, None], axis=0)          # ties: the first, the window layout
    layout = np.stack([layouts[names[k]][layer] for layer, k in enumerate(pick_L)])
    wins = {n: int((pick_L == i).sum()) for i, n in enumerate(names)}
    return layout, p99_NL[pick_L, np.arange(pick_L.size)], wins
