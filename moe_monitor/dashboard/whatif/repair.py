"""What-if under a move budget, pure (no Streamlit): repair the current layout within `budget` moves
(planner.repair, migration-aware greedy) instead of a full re-plan, and the moves-vs-imbalance curve to pick a
budget from. One move = one expert's weights (of one layer) copied onto a GPU that did not hold it
(planner.repair.experts_copied). The current layout's slots are kept. Imbalance is predicted on the fit window,
mean over layers with tokens. A current layout with unused slots (-1, vLLM's) is repaired with each -1 as a
phantom zero-token expert (core.layouts.with_unused_as_expert) and written back as -1. Docs: docs/dashboard.md,
"What-if".

Shape legend (README, Conventions): W windows of summed steps, L layers, E logical experts, P slots.
fit_WLE [W, L, E] float fit windows, current_LP int [L, P].
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from moe_monitor.core.layouts import has_unused, unused_back, unused_for_copies, with_unused_as_expert
from moe_monitor.planner.repair import experts_copied, repair_curve

CURVE_MOVES_PER_LAYER = 4        # the curve reaches at least this many moves per layer


@dataclass(frozen=True)
class Repaired:
    """A repair within `budget` moves: layout_LP int64 [L, P] (read-only); curve rows {moves, mean_imbalance,
    worst_imbalance}, the first for the current layout, then one after each greedy step; the last row's moves
    are the moves the repaired layout needs."""

    layout_LP: np.ndarray
    budget: int
    curve: tuple[dict, ...]

    @property
    def policy(self) -> str:
        return f"repair of the current layout (<= {self.budget} moves)"

    @property
    def moves_used(self) -> int:
        return int(self.curve[-1]["moves"])


def repair(fit_WLE: ArrayLike, current_LP: ArrayLike, gpus: int, budget: int) -> Repaired:
    """The best layout the greedy repair reaches from current_LP within `budget` moves (>= 1)."""
    if budget < 1:
        raise ValueError(f"move budget must be >= 1, got {budget}")
    fit = np.asarray(fit_WLE, dtype=np.float64)
    num_experts = fit.shape[-1]
    if has_unused(current_LP):   # each -1 a phantom expert with no tokens, one per unused slot of a GPU
        fit, current_LP = with_unused_as_expert(fit, current_LP, gpus, distinct=True)
    lay, curve = repair_curve(fit, current_LP, gpus, int(budget))
    lay = unused_back(lay, num_experts)
    lay.flags.writeable = False
    rows = tuple({"moves": int(m), "mean_imbalance": mi, "worst_imbalance": wi} for m, mi, wi in curve)
    return Repaired(layout_LP=lay, budget=int(budget), curve=rows)


def curve_horizon(num_layers: int, budget: int) -> int:
    """Moves the page's curve spans: CURVE_MOVES_PER_LAYER per layer, or the budget when larger (so the
    curve is computed once per window, not once per budget picked)."""
    return max(int(budget), CURVE_MOVES_PER_LAYER * int(num_layers))


def moves_between(before_LP: ArrayLike, after_LP: ArrayLike, gpus: int) -> int:
    """planner.repair.experts_copied from one layout to another, either of which may leave slots unused (-1):
    emptying a slot copies nothing, filling one copies its expert (core.layouts.unused_for_copies)."""
    return experts_copied(*unused_for_copies(before_LP, after_LP, gpus), gpus)
