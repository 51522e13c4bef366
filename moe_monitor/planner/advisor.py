"""Rebalance policies that turn a trace of per-step counts into a layout schedule (planner.simulate prices it).

- ``static_schedule``: the initial layout forever.
- ``periodic_schedule``: a full re-plan (EPLB parity by default) every ``every`` steps on the last ``window``.
- ``advise``: every ``every`` steps, planner.repair's moves-vs-imbalance curve from the layout in force (on the
  last ``window`` steps split into a few windows); the move budget with the largest predicted net gain over
  ``horizon_steps`` is scheduled only when its gain beats its migration time (CostModel). A layout repair cannot
  start from (two replicas of one expert on a GPU, as EPLB may write) gets a full robust re-plan instead.
Decisions at step t see steps < t only. Shapes: counts_TLE [T, L, E], layouts [L, P], P = E + R, slot p on GPU
p // (P / G). docs/planner.md (Rebalance advisor and simulator).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moe_monitor.core.counts import as_counts
from moe_monitor.core.dispatch import check_policy
from moe_monitor.core.loadmodel import validated_layout

from .api import plan
from .loads import check_shape, duplicates_on_gpu, whole_number
from .repair import experts_copied, repair_curve
from .schedule import Change, Schedule
from .simulate import CostModel
from .windows import split_windows

DEFAULT_EVERY = 250            # advisor: steps between decision points
DEFAULT_WINDOW = 1000          # steps the policies look back on (SGLang / vLLM: 1,000)
DEFAULT_HORIZON = 1000         # steps a change is expected to pay off over
DEFAULT_MAX_MOVES = 256        # advisor: expert copies per change at most
DEFAULT_SUB_WINDOWS = 4        # advisor: windows the look-back is split into (the robust view of drift)



def _counts(counts_TLE) -> np.ndarray:
    return as_counts(counts_TLE, "counts", ndim=(3,))


def initial_layout(counts_TLE, gpus: int, redundant: int, window: int = DEFAULT_WINDOW,
                   nodes: int | None = None, groups: int | None = None) -> np.ndarray:
    """The layout every policy starts from when none is given: planned ("refined", or "hierarchical" with
    nodes and groups) on the sum of the trace's first ``window`` steps, [L, E + R]. It sees those steps before
    they run (a warm-up every policy shares, so comparisons stay fair)."""
    c = _counts(counts_TLE)
    window = whole_number(window, "window", 1)
    policy = "hierarchical" if nodes is not None else "refined"
    return plan(c[:window].sum(0), gpus, redundant, nodes=nodes, groups=groups, policy=policy).layout_LP


def _start(c: np.ndarray, gpus: int, redundant: int, initial_LP, window: int, nodes, groups) -> np.ndarray:
    check_shape(c.shape[2], gpus, redundant)
    if initial_LP is None:
        return initial_layout(c, gpus, redundant, window, nodes, groups)
    lay = validated_layout(initial_LP, c.shape[2], gpus)
    if lay.shape[0] != c.shape[1]:
        raise ValueError(f"initial layout has {lay.shape[0]} layers, the trace has {c.shape[1]}")
    return lay


def static_schedule(initial_LP, gpus: int) -> Schedule:
    """The initial layout [L, P] held for the whole trace."""
    return Schedule(gpus=gpus, changes=(Change(step=0, layout_LP=np.asarray(initial_LP), moves=0,
                                               reason="initial"),), policy="static")


def periodic_schedule(counts_TLE, gpus: int, redundant: int, every: int, window: int = DEFAULT_WINDOW,
                      initial_LP=None, policy: str = "eplb", nodes: int | None = None, groups: int | None = None,
                      cost: CostModel | None = None) -> Schedule:
    """Full re-plan (planner.api.plan with ``policy`` on the summed last ``window`` steps) at steps every,
    2 x every, ... < T; counts [T, L, E]. Each change records its moves and migration time."""
    c = _counts(counts_TLE)
    every, window = whole_number(every, "every", 1), whole_number(window, "window", 1)
    cost = CostModel() if cost is None else cost
    cur = _start(c, gpus, redundant, initial_LP, window, nodes, groups)
    changes = [Change(step=0, layout_LP=cur, moves=0, reason="initial")]
    for t in range(every, c.shape[0], every):
        recent = c[max(0, t - window):t].sum(0)
        if not recent.any():
            continue
        lay = plan(recent, gpus, redundant, nodes=nodes, groups=groups, policy=policy).layout_LP
        m = experts_copied(cur, lay, gpus)
        changes.append(Change(step=t, layout_LP=lay, moves=m, predicted_migration_s=cost.migration_seconds(m),
                              reason=f"periodic re-plan ({policy})"))
        cur = lay
    return Schedule(gpus=gpus, changes=tuple(changes), policy=f"periodic-{every}",
                    params={"every": every, "window": window, "replan_policy": policy})


def predicted_gain_seconds(recent_TLE: np.ndarray, current_LP: np.ndarray, candidate_LP: np.ndarray, gpus: int,
                           horizon_steps: int, cost: CostModel, dispatch: str = "even") -> float:
    """Straggler seconds the candidate saves over ``horizon_steps`` steps if the recent steps [T, L, E] repeat:
    (mean straggler seconds per step under current - under candidate) x horizon_steps, GPU loads under the
    ``dispatch`` policy (core.dispatch). Negative when worse."""
    cur = cost.straggler_seconds(recent_TLE, current_LP, gpus, dispatch).mean()
    cand = cost.straggler_seconds(recent_TLE, candidate_LP, gpus, dispatch).mean()
    return float((cur - cand) * horizon_steps)


def _candidate(recent: np.ndarray, cur: np.ndarray, gpus: int, redundant: int, sub_windows: int,
               max_moves: int, horizon: int, cost: CostModel) -> tuple[np.ndarray, str]:
    """The repaired layout with the best estimated net gain on the repair curve (``cur`` when none pays), or
    a full robust re-plan when ``cur`` cannot be repaired."""
    windows = split_windows(recent, sub_windows)
    if duplicates_on_gpu(cur, gpus).any():
        return plan(windows, gpus, redundant, policy="robust").layout_LP, "robust re-plan"
    _, curve = repair_curve(windows, cur, gpus, max_moves)
    active = recent.sum((0, 2)) > 0
    # tokens per step on one GPU of one layer, summed over the active layers: (imbalance - 1) x this = excess
    load_per_step = recent.sum((0, 2))[active].mean() / recent.shape[0] / gpus * max(int(active.sum()), 1)
    moves = np.array([m for m, _, _ in curve])
    mean_imb = np.array([mi for _, mi, _ in curve])
    net = ((mean_imb[0] - mean_imb) * load_per_step * cost.seconds_per_token_slot * horizon
           - moves * cost.bytes_per_expert * 8 / (cost.link_gbps * 1e9))
    best = int(np.argmax(net))
    if best == 0 or net[best] <= 0:
        return cur, "no repair pays"
    lay, _ = repair_curve(windows, cur, gpus, int(moves[best]))
    return lay, f"repair within {int(moves[best])} moves"


def advise(counts_TLE, gpus: int, redundant: int, initial_LP=None, every: int = DEFAULT_EVERY,
           window: int = DEFAULT_WINDOW, horizon_steps: int = DEFAULT_HORIZON, max_moves: int = DEFAULT_MAX_MOVES,
           sub_windows: int = DEFAULT_SUB_WINDOWS, cost: CostModel | None = None, nodes: int | None = None,
           groups: int | None = None, dispatch: str = "even") -> Schedule:
    """The advisor's schedule for counts [T, L, E] (module docstring): decision points at every, 2 x every, ...;
    a change only where its predicted gain over ``horizon_steps`` beats its migration time, within
    ``max_moves`` expert copies. Every change carries its moves, predicted gain and migration seconds. The gain
    is replayed under the ``dispatch`` policy (core.dispatch; lp costs ~100 us per step and layer per layout:
    two layouts x ``window`` steps at each decision point)."""
    check_policy(dispatch)
    c = _counts(counts_TLE)
    every, window = whole_number(every, "every", 1), whole_number(window, "window", 1)
    horizon_steps, sub_windows = whole_number(horizon_steps, "horizon steps", 1), whole_number(sub_windows, "sub-windows", 1)
    max_moves = whole_number(max_moves, "max moves", 0)
    cost = CostModel() if cost is None else cost
    cur = _start(c, gpus, redundant, initial_LP, window, nodes, groups)
    changes = [Change(step=0, layout_LP=cur, moves=0, reason="initial")]
    skipped = 0
    for t in range(every, c.shape[0], every):
        recent = c[max(0, t - window):t]
        if not recent.any():
            continue
        lay, why = _candidate(recent, cur, gpus, redundant, sub_windows, max_moves, horizon_steps, cost)
        m = experts_copied(cur, lay, gpus)
        if m == 0:
            continue
        gain = predicted_gain_seconds(recent, cur, lay, gpus, horizon_steps, cost, dispatch)
        mig = cost.migration_seconds(m)
        if not gain > mig:
            skipped += 1
            continue
        changes.append(Change(step=t, layout_LP=lay, moves=m, predicted_gain_s=gain, predicted_migration_s=mig,
                              reason=why))
        cur = lay
    return Schedule(gpus=gpus, changes=tuple(changes), policy="advisor",
                    params={"every": every, "window": window, "horizon_steps": horizon_steps,
                            "max_moves": max_moves, "sub_windows": sub_windows,
                            "seconds_per_token_slot": cost.seconds_per_token_slot, "link_gbps": cost.link_gbps,
                            "bytes_per_expert": cost.bytes_per_expert, "rejected_candidates": skipped,
                            "dispatch": dispatch, "pricing": cost.pricing})


@dataclass(frozen=True)
class Advice:
    """One decision of the advisor on the steps seen so far (advise_now).

    rebalance: the predicted gain over ``horizon_steps`` beats the migration time; layout_LP int64 [L, P]: the
    layout it would move to (the current one when no candidate moves anything); moves: expert copies it needs
    (planner.repair.experts_copied); gain_s / migration_s: predicted straggler seconds saved over the horizon,
    and seconds serving waits for the copies; step_s: seconds per step under the current layout (the layers'
    busiest GPUs: balanced expert time + straggler time), so gain_ratio and migration_ratio are shares of the
    next ``horizon_steps`` steps' expert time; reason: what the candidate is."""
    rebalance: bool
    layout_LP: np.ndarray
    moves: int
    gain_s: float
    migration_s: float
    step_s: float
    horizon_steps: int
    reason: str

    @property
    def gain_ratio(self) -> float:
        """Predicted gain over the horizon as a share of its expert time under the current layout (0 when idle)."""
        return self.gain_s / (self.step_s * self.horizon_steps) if self.step_s > 0 else 0.0

    @property
    def migration_ratio(self) -> float:
        """Migration time as a share of the horizon's expert time under the current layout (0 when idle)."""
        return self.migration_s / (self.step_s * self.horizon_steps) if self.step_s > 0 else 0.0


def _best_nonzero_repair(recent: np.ndarray, cur: np.ndarray, gpus: int, sub_windows: int, max_moves: int,
                         horizon: int, cost: CostModel) -> tuple[np.ndarray, str]:
    """The repair with the best estimated net gain among those that move at least one expert (even when it
    does not pay), so a "not worth it yet" can say by how much; ``cur`` when repair moves nothing."""
    windows = split_windows(recent, sub_windows)
    _, curve = repair_curve(windows, cur, gpus, max_moves)
    moves = np.array([m for m, _, _ in curve])
    if moves.size < 2 or moves.max() == 0:
        return cur, "no repair moves anything"
    mean_imb = np.array([mi for _, mi, _ in curve])
    active = recent.sum((0, 2)) > 0
    load_per_step = recent.sum((0, 2))[active].mean() / recent.shape[0] / gpus * max(int(active.sum()), 1)
    net = ((mean_imb[0] - mean_imb) * load_per_step * cost.seconds_per_token_slot * horizon
           - moves * cost.migration_seconds(1))
    net[moves == 0] = -np.inf
    best = int(moves[int(np.argmax(net))])
    lay, _ = repair_curve(windows, cur, gpus, best)
    return lay, f"repair within {best} moves"


def advise_now(window_counts_TLE, current_LP, gpus: int, cost: CostModel | None = None,
               horizon_steps: int = DEFAULT_HORIZON, max_moves: int = DEFAULT_MAX_MOVES,
               sub_windows: int = DEFAULT_SUB_WINDOWS, dispatch: str = "even") -> Advice:
    """The advisor's decision now (one decision point of ``advise``, module docstring): from the window's
    per-step counts [T, L, E] (oldest first) and the layout in force [L, P], the candidate the advisor would
    move to within ``max_moves`` copies, its predicted gain over ``horizon_steps`` steps if the window repeats,
    and its migration time; ``rebalance`` when the gain beats the migration time, the rule ``advise`` applies.
    R = P - E redundant slots (used only when the current layout cannot be repaired and is re-planned). Step
    and straggler times are replayed under the ``dispatch`` policy (core.dispatch)."""
    check_policy(dispatch)
    c = _counts(window_counts_TLE)
    horizon_steps, sub_windows = whole_number(horizon_steps, "horizon steps", 1), whole_number(sub_windows, "sub-windows", 1)
    max_moves = whole_number(max_moves, "max moves", 0)
    cost = CostModel() if cost is None else cost
    T, L, E = c.shape
    if T == 0:
        raise ValueError("the advisor needs at least one step of counts")
    cur = validated_layout(current_LP, E, gpus)
    if cur.shape[0] != L:
        raise ValueError(f"current layout has {cur.shape[0]} layers, the counts have {L}")
    step_s = float(cost.busiest_seconds(c, cur, gpus, dispatch).mean())
    if not c.any() or max_moves == 0:
        return Advice(False, cur, 0, 0.0, 0.0, step_s, horizon_steps,
                      "no tokens in the window" if not c.any() else "no moves allowed")
    lay, why = _candidate(c, cur, gpus, cur.shape[1] - E, sub_windows, max_moves, horizon_steps, cost)
    if experts_copied(cur, lay, gpus) == 0:
        lay, why = _best_nonzero_repair(c, cur, gpus, sub_windows, max_moves, horizon_steps, cost)
    moves = experts_copied(cur, lay, gpus)
    gain = predicted_gain_seconds(c, cur, lay, gpus, horizon_steps, cost, dispatch) if moves else 0.0
    migration = cost.migration_seconds(moves)
    return Advice(rebalance=bool(moves > 0 and gain > migration), layout_LP=np.asarray(lay, dtype=np.int64),
                  moves=int(moves), gain_s=float(gain), migration_s=float(migration), step_s=step_s,
                  horizon_steps=horizon_steps, reason=why)
