"""One entry point for the What-if page and the CLI: ``plan(counts, gpus, redundant, ...)`` -> PlanResult.

Policies (POLICIES): "eplb" (EPLB parity), "refined" (replicate by largest per-replica load, pack, swap and
replica-move refinement, then pair re-splits when S <= 8), "hierarchical" (groups -> nodes, spares anywhere),
"robust" (balanced on all given windows at once), "auto" (hierarchical with nodes/groups, else for [W, L, E]
the pick of planner.heldin's rolling-origin backtest, else refined). Objectives: "window" (default), "tail"
(planner.tail, per-step counts ``steps`` [T, L, E] under ``dispatch``) or "time" (planner.timeplan: the same
steps priced by a core.costmodel.TimeModel). Predictions are on the target traffic (the counts, or the blend
of windows); layers without traffic get a plain layout and imbalance 1.0. Bounds: the tightest proven lower
bound per layer (planner.bounds; under the one-copy-per-GPU rule where the layout keeps it; the optimum where
planner.exact proved it); the refined policy searches small layers exactly. docs/planner.md.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moe_monitor.core.counts import as_counts
from moe_monitor.core.dispatch import check_policy
from moe_monitor.core.loadmodel import replica_counts, slot_weights

from .bounds import best_bound, group_partition_bound, rule_bound
from .eplb_ref import check_hierarchy, eplb_global, eplb_hierarchical, group_to_node
from .exact import MAX_EXPERTS, search_layers
from .heldin import fit_heldin
from .hierarchical import off_node_share, plan_hierarchical
from .loads import check_shape, check_size, duplicates_on_gpu, layer_imbalance
from .pack import balanced_pack, expand_replicas, layout_from_bins, replicate_greedy
from .pairs import MAX_SPLITS, num_splits, refine_pairs
from .replicas import refine_all
from .robust import check_recent, fit_robust, scenarios, window_weights
from .tail import FIT_STEPS as TAIL_FIT_STEPS
from .tail import check_objective, fit_tail
from .timeplan import fit_time

POLICIES = ("auto", "eplb", "refined", "hierarchical", "robust")
PAIR_STOP_GAP = 1e-4        # pair re-splits stop once a layer is within this of its lower bound


@dataclass(frozen=True)
class PlanResult:
    """A recommended layout with its predictions. Shapes: layout_LP [L, P], replicas_LE [L, E], the
    per-layer arrays [L]; ``worst_window_L`` only for windowed input, ``off_node_L`` only when nodes
    are given; ``optimal_L``: the layer's max load is proven minimal (it meets its bound); ``total_L``: the
    target traffic per layer (max_load_L and bound_load_L in its units)."""
    policy: str
    layout_LP: np.ndarray
    replicas_LE: np.ndarray
    imbalance_L: np.ndarray
    bound_L: np.ndarray
    active_L: np.ndarray
    gpus: int
    redundant: int
    nodes: int | None = None
    groups: int | None = None
    group_floor_L: np.ndarray | None = None
    off_node_L: np.ndarray | None = None
    worst_window_L: np.ndarray | None = None
    dispatch: str = "even"
    objective: str = "window"
    tail_p99_L: np.ndarray | None = None
    tail_wins: dict | None = None
    time_p99_s_L: np.ndarray | None = None
    optimal_L: np.ndarray | None = None
    total_L: np.ndarray | None = None

    @property
    def max_load_L(self) -> np.ndarray:
        """The plan's max GPU load per layer on the target traffic (counts, or the blend's shares), [L]."""
        return self.imbalance_L * self.mean_load_L

    @property
    def bound_load_L(self) -> np.ndarray:
        """A proven lower bound on the max GPU load of any layout under the same rules, [L]."""
        return self.bound_L * self.mean_load_L

    @property
    def mean_load_L(self) -> np.ndarray:
        """Mean GPU load per layer (total / G; 1 / G for a layer without traffic), [L]."""
        return self.total_L / self.gpus if self.total_L is not None else np.full(self.imbalance_L.shape, 1 / self.gpus)

    @property
    def gap_L(self) -> np.ndarray:
        """Relative gap imbalance / bound - 1, [L]."""
        return self.imbalance_L / self.bound_L - 1.0

    def summary(self) -> dict:
        a = self.active_L if self.active_L.any() else np.ones_like(self.active_L)
        out = {"mean_imbalance": float(self.imbalance_L[a].mean()),
               "worst_imbalance": float(self.imbalance_L[a].max()),
               "mean_balancedness": float((1 / self.imbalance_L[a]).mean()),
               "mean_lower_bound": float(self.bound_L[a].mean()),
               "max_gap_to_bound": float(self.gap_L[a].max()),
               "layers_with_traffic": int(self.active_L.sum())}
        if self.optimal_L is not None:
            out["layers_proven_optimal"] = int((self.optimal_L & self.active_L).sum())
        if self.off_node_L is not None:
            out["mean_off_node_share"] = float(self.off_node_L[a].mean())
        if self.worst_window_L is not None:
            out["mean_worst_window_imbalance"] = float(self.worst_window_L[a].mean())
        if self.tail_p99_L is not None:
            out["mean_step_p99_imbalance"] = float(self.tail_p99_L[a].mean())
        if self.time_p99_s_L is not None:
            out["step_p99_moe_seconds"] = float(self.time_p99_s_L[a].sum())
        return out

    def to_json(self) -> dict:
        """SGLang-loadable dict: physical_to_logical_map plus predictions (extra keys are ignored)."""
        d = {"physical_to_logical_map": self.layout_LP.tolist(),
             "policy": self.policy, "gpus": self.gpus, "redundant": self.redundant,
             "slots_per_gpu": self.layout_LP.shape[1] // self.gpus,
             "predicted_balancedness": (1 / self.imbalance_L).round(6).tolist(),
             "predicted_imbalance": self.imbalance_L.round(6).tolist(),
             "lower_bound_imbalance": self.bound_L.round(6).tolist(),
             "gap_to_bound": self.gap_L.round(6).tolist(),
             "replica_counts": self.replicas_LE.tolist(),
             "layers_with_traffic": self.active_L.tolist(),
             "max_gpu_load": self.max_load_L.round(6).tolist(),
             "lower_bound_max_gpu_load": self.bound_load_L.round(6).tolist(),
             "summary": self.summary()}
        if self.optimal_L is not None:
            d["proven_optimal"] = self.optimal_L.tolist()
        if self.nodes is not None:
            d.update(nodes=self.nodes, groups=self.groups)
        if self.group_floor_L is not None:
            d["group_floor_imbalance"] = self.group_floor_L.round(6).tolist()
        if self.off_node_L is not None:
            d["off_node_token_share"] = self.off_node_L.round(6).tolist()
        if self.worst_window_L is not None:
            d["worst_window_imbalance"] = self.worst_window_L.round(6).tolist()
        d.update(dispatch=self.dispatch, objective=self.objective)
        if self.tail_p99_L is not None:
            d["step_p99_imbalance"] = self.tail_p99_L.round(6).tolist()
            d["tail_layers_won"] = self.tail_wins
        if self.time_p99_s_L is not None:
            d["step_p99_moe_seconds_per_layer"] = self.time_p99_s_L.round(9).tolist()
            d["time_layers_won"] = self.tail_wins
        return d


def plan_refined(counts_LE, gpus: int, redundant: int, windows_WLE=None) -> np.ndarray:
    """Our global policy: layout [L, P]; refinement balances ``windows_WLE`` (default: the counts)."""
    c = as_counts(counts_LE)
    E = c.shape[1]
    check_shape(E, gpus, redundant)
    rep = replicate_greedy(c, E + redundant, max_replicas=gpus)
    phys = expand_replicas(rep)
    lay = layout_from_bins(phys, balanced_pack(np.take_along_axis(c / rep, phys, axis=1), gpus, phys), gpus)
    lay, _ = refine_all(lay, c[None] if windows_WLE is None else windows_WLE, gpus)
    S = (E + redundant) // gpus
    if windows_WLE is None and num_splits(S) <= MAX_SPLITS:
        target = best_bound(c, gpus, redundant) * c.sum(1) / gpus * (1 + PAIR_STOP_GAP)
        lay, _ = refine_pairs(lay, slot_weights(c, lay), gpus, target_L=target)
    return lay


def plan(counts, gpus: int, redundant: int, nodes: int | None = None, groups: int | None = None,
         policy: str = "auto", decay: float = 1.0, recent: int = 16, dispatch: str = "even",
         objective: str = "window", steps=None, time_model=None) -> PlanResult:
    """Plan a layout for counts [L, E] or [W, L, E] (windows oldest..newest); with objective "tail" (or "time",
    with a core.costmodel.TimeModel ``time_model``), per-step counts ``steps`` [T, L, E] (T >= 2) choose, per
    layer, the layout with the lowest per-step p99 imbalance (seconds) under ``dispatch`` (module docstring)."""
    c = as_counts(counts, "counts", ndim=(2, 3))
    check_policy(dispatch)
    check_objective(objective)
    if objective == "window" and dispatch != "even":
        raise ValueError(f"dispatch {dispatch!r} plans on per-step counts: use the tail objective "
                         "(--objective tail with a trace or [T, L, E] counts)")
    steps_TLE = None
    if objective == "time" and time_model is None:
        raise ValueError("the time objective needs the model's dimensions and a GPU profile")
    if objective in ("tail", "time"):
        if steps is None:
            raise ValueError(f"the {objective} objective needs per-step counts (a trace or [T, L, E] counts)")
        if nodes is not None or groups is not None:
            raise ValueError(f"the {objective} objective plans global layouts: give it without --nodes and --groups")
        steps_TLE = as_counts(steps, "steps", ndim=(3,))
        if steps_TLE.shape[1:] != c.shape[-2:]:
            raise ValueError(f"per-step counts {steps_TLE.shape} do not match the counts {c.shape}")
    if policy not in POLICIES:
        raise ValueError(f"unknown policy '{policy}' (choose from {', '.join(POLICIES)})")
    if (nodes is None) != (groups is None):
        raise ValueError("--nodes and --groups go together: give both or neither")
    check_recent(recent)
    window_weights(1, decay)                                     # checks decay whatever the input's shape
    windowed = c.ndim == 3
    L, E = c.shape[-2:]
    check_shape(E, gpus, redundant)
    if windowed:
        target, scen = scenarios(c, decay, recent)
    else:
        target, scen = c, None
    hier = nodes is not None and groups is not None
    if nodes is not None and groups is not None:
        check_hierarchy(E, gpus, redundant, nodes, groups)
    active = target.sum(1) > 0
    plan_in = np.where(active[:, None], target, 1.0)          # dense layers: plan as uniform
    auto_robust = policy == "auto" and windowed and not hier
    if policy == "auto":
        policy = "hierarchical" if hier else ("robust" if windowed else "refined")
    if policy == "hierarchical" and not hier:
        raise ValueError("policy 'hierarchical' needs --nodes and --groups")
    check_size(L, E, gpus, E + redundant,                     # robust on [L, E]: the counts and their blend
               scenarios=scen.shape[0] if scen is not None else 2 if policy == "robust" else 1)
    home = None
    if policy == "eplb":
        eplb_in = np.where(active[:, None], c.sum(0) if windowed else c, 1.0)
        lay = (eplb_hierarchical(eplb_in, gpus, redundant, nodes, groups)
               if nodes is not None and groups is not None else eplb_global(eplb_in, gpus, redundant))
    elif policy == "hierarchical" and nodes is not None and groups is not None:
        scen_in = None if scen is None else np.where(active[None, :, None], scen, 1.0)
        lay, home = plan_hierarchical(plan_in, gpus, redundant, nodes, groups, weights_WLE=scen_in)
    elif policy == "robust" and auto_robust:
        lay, _ = fit_heldin(np.where(active[None, :, None], c, 1.0), gpus, redundant, decay=decay, recent=recent)
    elif policy == "robust":
        lay = fit_robust(np.where(active[None, :, None], c if windowed else c[None], 1.0), gpus, redundant,
                         decay=decay, recent=recent)
    else:
        lay = plan_refined(plan_in, gpus, redundant)
    p99 = wins = time_p99 = None
    if steps_TLE is not None:
        check_size(L, E, gpus, E + redundant, scenarios=TAIL_FIT_STEPS + 1)
        if objective == "time":
            lay, time_p99, wins = fit_time(steps_TLE, gpus, redundant, lay, time_model, dispatch)
        else:
            lay, p99, wins = fit_tail(steps_TLE, gpus, redundant, lay, dispatch)
    optimum = None
    if policy == "refined" and not windowed and steps_TLE is None and E <= MAX_EXPERTS:
        pre = layer_imbalance(target, lay, gpus) / best_bound(target, gpus, redundant) - 1
        lay, optimum = search_layers(plan_in, lay, gpus, redundant, np.where(active, pre, 0.0))
    imb = layer_imbalance(target, lay, gpus)
    bound = best_bound(target, gpus, redundant)
    keeps_rule = ~duplicates_on_gpu(lay, gpus)
    bound = np.where(keeps_rule, np.maximum(bound, rule_bound(target, gpus, redundant)), bound)
    total = target.sum(1)
    if optimum is not None:
        proven = active & keeps_rule & np.isfinite(optimum)
        bound = np.where(proven, np.maximum(bound, np.nan_to_num(optimum) / np.where(active, total, 1.0) * gpus),
                         bound)
    optimal = imb <= bound * (1 + 1e-9)
    floor = off = None
    if nodes is not None and groups is not None:
        floor = group_partition_bound(target, gpus, nodes, groups)
        if home is None:
            home = np.repeat(group_to_node(plan_in, nodes, groups), E // groups, axis=1)
        off = off_node_share(target, lay, home, gpus, nodes)
    worst = layer_imbalance(scen, lay, gpus).max(0) if windowed else None
    return PlanResult(policy=policy, layout_LP=lay, replicas_LE=replica_counts(lay, E), imbalance_L=imb,
                      bound_L=bound, active_L=active, gpus=gpus, redundant=redundant,
                      nodes=nodes, groups=groups, group_floor_L=floor, off_node_L=off,
                      worst_window_L=worst, dispatch=dispatch, objective=objective, tail_p99_L=p99,
                      tail_wins=wins, time_p99_s_L=time_p99, optimal_L=optimal, total_L=total)
