"""The time objective: a layout for the predicted MoE-layer time of each step (core.costmodel), not its tokens.

In memory-bound layers a slot costs its weight reads whatever its tokens, so spreading active and hot experts
matters; in compute-bound layers the cost follows the tokens. ``fit_time`` builds the "time" candidate (replicas
by per-replica tokens, then slots packed and swapped by their mean predicted seconds over the fit steps) beside
the caller's token layout and the robust fit on single steps, and keeps per layer the lowest p99 over held-out
steps of the slowest GPU's predicted time. Shapes: steps_TLE [T, L, E]; layout_LP [L, E + R]; figures [L].
"""
from __future__ import annotations

import numpy as np

from moe_monitor.core.costmodel import TimeModel
from moe_monitor.core.dispatch import check_policy

from .pack import balanced_pack, expand_replicas, layout_from_bins
from .replicas import refine_all
from .robust import fit_robust, normalise
from .tail import SWITCH_MARGIN, sample_steps
from .timecost import slowest_and_mean_s

SCORE_STEPS = 240   # held-out steps each candidate is scored on


def time_p99(steps_TLE, layout_LP, gpus: int, model: TimeModel, dispatch: str = "even") -> np.ndarray:
    """Per layer, p99 over the steps of the slowest GPU's predicted seconds, float64 [L]."""
    return np.percentile(slowest_and_mean_s(steps_TLE, layout_LP, gpus, dispatch, model)[0], 99, axis=0)


def replica_seconds(steps_TLE, replicas_LE: np.ndarray, model: TimeModel) -> np.ndarray:
    """float64 [T, L, E]: per step, the predicted GEMM seconds of all of an expert's replicas together when its
    tokens go round-robin (q = c // r each, one more to the first c mod r): an idle replica costs nothing."""
    c = np.asarray(steps_TLE, dtype=np.float64)
    r = np.broadcast_to(replicas_LE, c.shape).astype(np.float64)
    q = np.floor(c / r)
    extra = c - q * r
    low_s, _ = model.slot_seconds(q)
    high_s, _ = model.slot_seconds(q + 1)
    return extra * high_s + (r - extra) * low_s


def replicate_for_time(steps_TLE, num_slots: int, model: TimeModel, max_replicas: int) -> np.ndarray:
    """Replica counts [L, E] (each >= 1, rows sum to num_slots): each extra slot goes to the expert whose busiest
    replica it speeds up most (a compute-bound expert), or, when none gains, to the expert whose new replica is
    idle most often (in memory-bound layers a replica of a hot expert is one more weight read per step)."""
    c = np.asarray(steps_TLE, dtype=np.float64)
    T, L, E = c.shape
    rep_LE = np.ones((L, E), dtype=np.int64)
    rows = np.arange(L)

    def busiest_s(r_LE):          # mean over steps of the busiest replica's seconds (it holds ceil(c / r))
        return model.slot_seconds(np.ceil(c / r_LE))[0].mean(0)

    def added_s(r_LE):            # mean seconds of the replica an extra slot adds (index r: floor(c / (r + 1)))
        return model.slot_seconds(np.floor(c / (r_LE + 1)))[0].mean(0)

    now_LE, next_LE, cost_LE = busiest_s(rep_LE), busiest_s(rep_LE + 1), added_s(rep_LE)
    floor_s = 0.05 * model.weight_read_s
    for _ in range(num_slots - E):
        full = rep_LE >= max_replicas
        gain_LE = np.where(full, -np.inf, now_LE - next_LE)
        cost = np.where(full, np.inf, cost_LE)
        e_L = np.where(gain_LE.max(1) > floor_s, gain_LE.argmax(1), cost.argmin(1))
        rep_LE[rows, e_L] += 1
        r_L = rep_LE[rows, e_L][None, :]
        c_TL = c[:, rows, e_L]
        now_LE[rows, e_L] = model.slot_seconds(np.ceil(c_TL / r_L))[0].mean(0)
        next_LE[rows, e_L] = model.slot_seconds(np.ceil(c_TL / (r_L + 1)))[0].mean(0)
        cost_LE[rows, e_L] = model.slot_seconds(np.floor(c_TL / (r_L + 1)))[0].mean(0)
    return rep_LE


def plan_time(steps_TLE, gpus: int, redundant: int, model: TimeModel, scenarios: int = 24) -> np.ndarray:
    """The time candidate, layout [L, E + R], from per-step counts [T, L, E]: replicas by replicate_for_time,
    slots packed by their mean predicted seconds (GEMM + rows' all-to-all), then swapped to lower the slowest GPU
    of up to ``scenarios`` single steps."""
    c = np.asarray(steps_TLE, dtype=np.float64)
    E = c.shape[2]
    busy_L = c.sum((0, 2)) > 0
    rep_LE = replicate_for_time(c, E + redundant, model, max_replicas=gpus)
    weight_TLE = replica_seconds(c, rep_LE, model) + c * model.comm_s_per_row
    weight_TLE = np.where(busy_L[None, :, None], weight_TLE, 1.0)
    weight_LE = weight_TLE.mean(0)
    phys = expand_replicas(rep_LE)
    lay = layout_from_bins(phys, balanced_pack(np.take_along_axis(weight_LE / rep_LE, phys, axis=1), gpus, phys),
                           gpus)
    pick = np.linspace(0, c.shape[0] - 1, min(scenarios, c.shape[0])).round().astype(np.int64)
    lay, _ = refine_all(lay, np.concatenate([weight_LE[None], weight_TLE[pick]]), gpus, replica_moves=False)
    return lay


def fit_time(steps_TLE, gpus: int, redundant: int, window_LP: np.ndarray, model: TimeModel,
             dispatch: str = "even") -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """(layout [L, E + R], its held-out p99 seconds per layer [L], layers each candidate won) for per-step
    counts [T, L, E] (T >= 2); ``window_LP`` is the caller's token layout (module docstring)."""
    check_policy(dispatch)
    c = np.asarray(steps_TLE, dtype=np.float64)
    if c.ndim != 3 or c.shape[0] < 2:
        raise ValueError(f"the time objective needs per-step counts [steps >= 2, layers, experts], got {c.shape}")
    fit_idx, score_idx = sample_steps(c.shape[0], fit=max(24, c.shape[0] // 2), score=SCORE_STEPS)
    fit_steps = c[fit_idx]
    layouts = {"window": np.asarray(window_LP, dtype=np.int64), "time": plan_time(fit_steps, gpus, redundant, model)}
    scen = normalise(fit_steps[:24])
    layouts["steps"] = fit_robust(np.where(scen.sum(-1, keepdims=True) > 0, scen, 1.0), gpus, redundant,
                                  recent=scen.shape[0])
    names = list(layouts)
    p99_NL = np.stack([time_p99(c[score_idx], layouts[n], gpus, model, dispatch) for n in names])
    handicap_N = np.where(np.arange(len(names)) == 0, 1.0, 1.0 + SWITCH_MARGIN)
    pick_L = np.argmin(p99_NL * handicap_N[:, None], axis=0)          # ties: the window layout (first)
    layout = np.stack([layouts[names[k]][layer] for layer, k in enumerate(pick_L)])
    wins = {n: int((pick_L == i).sum()) for i, n in enumerate(names)}
    return layout, p99_NL[pick_L, np.arange(pick_L.size)], wins
