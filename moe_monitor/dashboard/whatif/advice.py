"""The rebalance advisor on the window in view, pure (no Streamlit): planner.advisor.advise_now on the newest
steps of the window (at most planner.advisor.DEFAULT_WINDOW, the look-back the advisor's schedule uses),
priced in predicted time under the run's cost model where its pages have one (CostModel.in_time), else with
the run's own expert sizes in token-slots (CostModel.for_sizes; DeepSeek-V3's where the metadata leaves them
unknown), and the one line the What-if page shows. A layout with unused slots (-1) is advised on with phantom
zero-token experts (core.layouts.with_unused_as_expert) and its layout written back with -1.

Shape legend (README, Conventions): T steps, L layers, E logical experts, P slots.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from moe_monitor.core.costmodel import TimeModel
from moe_monitor.core.layouts import has_unused, unused_back, with_unused_as_expert
from moe_monitor.dashboard.whatif.traffic import run_sizes
from moe_monitor.planner.advisor import DEFAULT_HORIZON, DEFAULT_MAX_MOVES, DEFAULT_WINDOW, Advice, advise_now
from moe_monitor.planner.simulate import CostModel


@dataclass(frozen=True)
class AdvisedLayout:
    """The advisor's layout as the What-if editor's plan: layout_LP int64 [L, P], its moves from the layout in
    force."""

    layout_LP: np.ndarray
    moves: int

    @property
    def policy(self) -> str:
        return f"rebalance advisor ({self.moves} moves from the layout in force)"


def cost_model(meta: Any, time_model: TimeModel | None = None) -> CostModel:
    """The advisor's prices: in predicted time under the run's TimeModel (the one its pages use), else for the
    run's expert sizes (hidden, moe_intermediate, dtype bytes) in token-slots."""
    if time_model is not None:
        return CostModel.in_time(time_model)
    hidden, inter, dtype_bytes = run_sizes(meta)[0]
    return CostModel.for_sizes(hidden, inter, dtype_bytes)


def advice_on_window(counts_TLE: np.ndarray, layout_LP: np.ndarray, gpus: int, meta: Any,
                     time_model: TimeModel | None = None, horizon_steps: int = DEFAULT_HORIZON,
                     max_moves: int = DEFAULT_MAX_MOVES, max_steps: int = DEFAULT_WINDOW) -> Advice:
    """advise_now on the newest max_steps of counts [T, L, E] (oldest first) from the layout in force [L, P],
    priced by cost_model(meta, time_model)."""
    counts_TLE = np.asarray(counts_TLE)[-max_steps:]
    num_experts = counts_TLE.shape[-1]
    unused = has_unused(layout_LP)
    if unused:   # vLLM's -1: a phantom zero-token expert per unused slot of a GPU, written back as -1
        counts_TLE, layout_LP = with_unused_as_expert(counts_TLE, layout_LP, gpus, distinct=True)
    advice = advise_now(counts_TLE, layout_LP, gpus, cost_model(meta, time_model),
                        horizon_steps=horizon_steps, max_moves=max_moves)
    return replace(advice, layout_LP=unused_back(advice.layout_LP, num_experts)) if unused else advice


def advice_line(advice: Advice) -> str:
    """'rebalance now: N moves, predicted gain X% over the next H steps (migration cost Y%)', or 'not worth it
    yet (predicted gain X% < migration cost Y%)'."""
    gain, cost, horizon = advice.gain_ratio, advice.migration_ratio, advice.horizon_steps
    if advice.rebalance:
        return (f"rebalance now: {advice.moves} move{'' if advice.moves == 1 else 's'}, predicted gain "
                f"{gain:.1%} over the next {horizon:,} steps (migration cost {cost:.1%})")
    if advice.moves == 0:
        return f"not worth it yet (predicted gain {0.0:.1%}: {advice.reason})"
    return (f"not worth it yet (predicted gain {gain:.1%} < migration cost {cost:.1%} over the next {horizon:,} "
            f"steps, {advice.moves} move{'' if advice.moves == 1 else 's'})")
