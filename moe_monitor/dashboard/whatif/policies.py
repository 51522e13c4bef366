"""What-if: the current and the what-if layout under every dispatch policy, side by side (pure, no Streamlit):
per-step imbalance p99 and p50, ideal fraction, expert skew p99 and window imbalance of the score window
(core.steptails). lp costs about 100 us per (step, layer), so it scores the newest LP_STEPS steps only.

Shape legend: T steps, L layers, E experts, P slots.
"""
from __future__ import annotations

import numpy as np

from moe_monitor.core.dispatch import DISPATCH_POLICIES, DispatchModel
from moe_monitor.core.steptails import StepTails, tails_of
from moe_monitor.dashboard.analytics.tails import policy_row

LP_STEPS = 128  # steps lp scores (the newest): ~0.7 s per layout at 58 layers x 32 GPUs


def scored_steps(policy: str, steps: int, lp_steps: int = LP_STEPS) -> int:
    """Steps of a `steps`-long score window the policy is scored on (the newest)."""
    return min(steps, lp_steps) if policy == "lp" else steps


def policy_tails(layout_LP: np.ndarray, score_TLE: np.ndarray, gpus: int, policy: str,
                 lp_steps: int = LP_STEPS) -> StepTails:
    """The per-step figures of the score window's counts [T, L, E] (the newest lp_steps of them for lp) under
    layout_LP [L, P] on `gpus` GPUs and the policy."""
    counts = np.asarray(score_TLE)
    counts = counts[-scored_steps(policy, counts.shape[0], lp_steps):]
    return tails_of(DispatchModel(layout_LP, counts.shape[2], gpus, policy), counts)


def policy_table(tails_by: dict[tuple[str, str], StepTails]) -> list[dict]:
    """Rows of the table, (layout name, policy) -> figures, in the order current / what-if x DISPATCH_POLICIES."""
    order = {policy: i for i, policy in enumerate(DISPATCH_POLICIES)}
    keys = sorted(tails_by, key=lambda k: (k[0] != "current", order.get(k[1], len(order))))
    return [policy_row(name, tails_by[(name, policy)]) for name, policy in keys]
